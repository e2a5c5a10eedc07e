"""Hybrid sharded data parallelism (``dp_shard``): ZeRO within a shard group, replication across
the groups. The oracles are the ZeRO paper's model-state table with the shard group as N_d, and
the ring formulas of the α-β model written out here from the cluster's link figures."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from parplan.solver.cluster import Cluster, Link, gpu_preset
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.plan_time import plan_time
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset
from parplan.solver.strategy import ParallelConfig

INTRA, INTER = 100e9, 10e9  # bytes/s per GPU; no latency, so the closed forms are the bandwidth terms


def _cluster(nodes: int, per_node: int) -> Cluster:
    return Cluster(nodes=nodes, gpus_per_node=per_node, gpu=gpu_preset("A100-80GB"),
                   intra_node_override=Link(INTRA, 0.0), inter_node_override=Link(INTER, 0.0))


@pytest.mark.parametrize(("zero", "bytes_per_param"), [
    (1, lambda n: 4 + 12 / n),          # ZeRO-1: 4Ψ + 12Ψ/N_d
    (2, lambda n: 2 + 14 / n),          # ZeRO-2: 2Ψ + 14Ψ/N_d
    (3, lambda n: 16 / n),              # ZeRO-3: 16Ψ/N_d
])
def test_zero_table_with_the_shard_group_as_n_d(zero: int, bytes_per_param: Any) -> None:
    graph = build_graph(get_preset("gpt-1.7b"), batch=1, seq_len=256)
    psi = graph.parameter_count()
    held = plan_memory(graph, ParallelConfig(dp=16, zero=zero, dp_shard=4, precision="bf16-grad16"))
    assert held.stages[0].memory.bytes.model_states == pytest.approx(bytes_per_param(4) * psi, rel=1e-12)


def test_dp_shard_of_all_dp_is_full_sharding_and_bad_shards_name_every_reason() -> None:
    assert ParallelConfig(dp=8, zero=1, dp_shard=8) == ParallelConfig(dp=8, zero=1)
    with pytest.raises(StrategyError) as err:
        ParallelConfig(dp=16, zero=0, dp_shard=3, expert_parallel=2)
    assert all(w in str(err.value) for w in ("divide dp 16", "zero >= 1", "expert parallel degree 2"))
    with pytest.raises(StrategyError, match="hpZ"):
        ParallelConfig(dp=16, zero=1, dp_shard=8, runtime=Runtime.DEEPSPEED)


def _dp_traffic(dp_shard: int) -> tuple[float, int]:
    cfg = TransformerConfig("gpt", "gpt-test", 2, 256, 4, 1024, 512, 128)
    graph = build_graph(cfg, batch=1, seq_len=128)
    plan = ParallelConfig(dp=8, zero=3, dp_shard=dp_shard, runtime=Runtime.TORCHTITAN)
    return plan_time(graph, plan, _cluster(2, 4)).stages[0].dp_comm_seconds, graph.parameter_count()


def test_hsdp_traffic_is_the_ring_closed_form_and_beats_full_sharding_over_a_slower_network() -> None:
    hsdp, psi = _dp_traffic(4)
    prec = get_precision("bf16")
    grads, weights = psi * prec.grad_bytes, psi * prec.weight_transfer_bytes
    # shard group of 4 on one node: a reduce-scatter, and each micro-batch's forward and backward
    # all-gather (ZeRO-3, resharded after forward); then the 1/4 gradient shard all-reduced by the
    # 2 replicas, one on each node: one GPU's network share
    within = 3 / 4 * grads / INTRA + 2 * 3 / 4 * weights / INTRA
    across = 2 * 1 / 2 * (grads / 4) / INTER
    assert hsdp == pytest.approx(within + across, rel=1e-9)
    full, _ = _dp_traffic(0)
    # the ring of 8 over 2 nodes leaves each node through its 4 GPUs' NICs: min(intra, 4 x inter)
    ring = min(INTRA, 4 * INTER)
    assert full == pytest.approx(7 / 8 * grads / ring + 2 * 7 / 8 * weights / ring, rel=1e-9)
    assert hsdp < full


def test_families_search_a_node_sized_shard_group_only_where_the_target_runs_it() -> None:
    from parplan.solver.cluster import make_cluster
    from parplan.solver.targets import Target, family

    cluster = make_cluster(16, 8, "H100-80GB")
    shards = {t: {(c.tp, c.dp, c.zero, c.dp_shard) for c in family(t, cluster, 32, 8)}
              for t in (Target.TORCHTITAN, Target.MEGATRON, Target.NANOTRON, Target.DEEPSPEED)}
    # the data-parallel ranks of one node: 8 / tp, where dp spans more than one node and ZeRO shards
    assert (1, 16, 3, 8) in shards[Target.TORCHTITAN] and (2, 8, 2, 4) in shards[Target.TORCHTITAN]
    assert (1, 16, 1, 8) in shards[Target.MEGATRON] and (4, 4, 1, 2) in shards[Target.MEGATRON]
    assert not any(d and (z == 0 or d == dp) for t in shards for _, dp, z, d in shards[t])
    assert not any(d for t in (Target.NANOTRON, Target.DEEPSPEED) for *_, d in shards[t])


def _with_architecture(doc: dict[str, Any]) -> dict[str, Any]:
    """A ``parplan memory --json`` document with the preset's sizes, as a plan document has them."""
    doc["model"]["architecture"] = dataclasses.asdict(get_preset(doc["model"]["name"]))
    return doc


@pytest.mark.parametrize(("target", "kind", "file", "strategy"), [
    ("torchtitan", "torchtitan-config", "launch_torchtitan.sh",
     {"dp": 16, "zero": 3, "dp_shard": 8, "runtime": Runtime.TORCHTITAN}),
    ("megatron", "megatron-args", "launch_megatron.sh",
     {"tp": 2, "dp": 8, "zero": 1, "dp_shard": 4, "sequence_parallel": True, "overlap_param_gather": True}),
], ids=["torchtitan", "megatron"])
def test_export_then_import_gives_back_the_shard_group(target: str, kind: str, file: str,
                                                       strategy: dict[str, Any]) -> None:
    from parplan.exports import export_plan
    from parplan.imports import Imported, price, read_config
    from parplan.solver.cluster import make_cluster
    from parplan.solver.evaluate import evaluate
    from parplan.solver.models import ModelSource

    cluster = make_cluster(16, 8, "H100-80GB")
    model = ModelSource("llama-3-8b", config=get_preset("llama-3-8b"))
    cfg = ParallelConfig(micro_batch=1, num_microbatches=2, **strategy)
    doc = _with_architecture(evaluate(model, cluster, cfg, seq_len=2048).to_dict())
    assert doc["strategy"]["dp_shard"] == cfg.dp_shard
    imported = read_config(kind, export_plan(doc, target).files[file], seq_len=2048)
    assert isinstance(imported, Imported) and imported.strategy.dp_shard == cfg.dp_shard, imported.report()
    again = price(imported, cluster)
    assert again["strategy"]["summary"] == doc["strategy"]["summary"]
    assert again["memory"]["peak_bytes"] == doc["memory"]["peak_bytes"]
    assert again["time"]["step_seconds"] == pytest.approx(doc["time"]["step_seconds"], rel=1e-9)


def test_targets_without_hybrid_sharding_refuse_it_among_their_other_reasons() -> None:
    from parplan.exports import NotExpressibleError, export_plan
    from parplan.solver.cluster import make_cluster
    from parplan.solver.evaluate import evaluate
    from parplan.solver.models import ModelSource

    model = ModelSource("llama-3-8b", config=get_preset("llama-3-8b"))
    cfg = ParallelConfig(tp=2, dp=8, zero=3, dp_shard=4, sequence_parallel=True, recompute=Recompute.SELECTIVE)
    doc = _with_architecture(evaluate(model, make_cluster(16, 8, "H100-80GB"), cfg, seq_len=2048).to_dict())
    for target in ("deepspeed", "nanotron", "galvatron", "megatron"):
        with pytest.raises(NotExpressibleError) as err:
            export_plan(doc, target)
        reasons = err.value.reasons
        # galvatron runs the rest of this plan; the others also refuse its tp (deepspeed) or ZeRO-3 (and
        # nanotron its selective recomputation)
        expected = {"galvatron": 1, "nanotron": 3}.get(target, 2)
        assert any("dp_shard 4" in r for r in reasons) and len(reasons) == expected, (target, reasons)


def test_a_bad_shard_group_on_the_command_line_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    from parplan.cli import main

    args = ["memory", "--model", "gpt-1.7b", "--gpus", "16", "--gpus-per-node", "8", "--dp-shard", "3"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dp_shard 3 must divide dp 16" in err[0] and "zero >= 1" in err[0], err


def test_megatron_instances_without_the_distributed_optimizer_or_not_dividing_dp_are_refused() -> None:
    from parplan.imports import Imported, ImportProblemError, read_config

    base = ("torchrun --nnodes 2 --nproc-per-node 8 pretrain_gpt.py --num-layers 4 --hidden-size 512 "
            "--num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 1 "
            "--global-batch-size 48 --bf16 --tensor-model-parallel-size 1 --overlap-grad-reduce --vocab-size 1024 ")
    with pytest.raises(ImportProblemError) as err:
        read_config("megatron-args", base + "--num-distributed-optimizer-instances 3")
    assert ["without --use-distributed-optimizer" in r or "does not divide" in r for r in err.value.problems] \
        == [True, True], err.value.problems
    ok = read_config("megatron-args", base + "--use-distributed-optimizer --num-distributed-optimizer-instances 2")
    assert isinstance(ok, Imported) and not ok.unknown, ok.report()
    assert (ok.strategy.dp, ok.strategy.dp_shard, ok.strategy.zero) == (16, 8, 1)
