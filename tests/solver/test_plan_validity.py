"""Every strategy a search offers or returns is one the trainers and ``parplan memory`` accept.

The oracle is the models' published sizes (the preset's heads, key/value heads, MLP width, sequence
and experts), checked as Megatron-LM asserts them in ``megatron/core/transformer/transformer_config.py``
and ``megatron/training/arguments.py``: ``num_attention_heads % tensor_model_parallel_size == 0``,
``num_query_groups % tensor_model_parallel_size == 0``, ``ffn_hidden_size`` split over TP ranks,
``seq_length % tensor_model_parallel_size == 0`` with ``--sequence-parallel``, and
``num_moe_experts % expert_model_parallel_size == 0``. GPU counts include odd ones and counts that
are not powers of two, where dividing the devices does not imply dividing the heads.
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

import pytest

from parplan.cli import main as parplan
from parplan.exports import export_plan
from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import make_cluster
from parplan.solver.dp.partition import microbatch_counts, pipeline_degrees
from parplan.solver.dp.search import DpSearch
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource
from parplan.solver.planner import solve
from parplan.solver.request import RequestError, parse_plan_request

GPU_COUNTS = (*range(1, 13), 24, 48, 96)
MODELS = ("gpt-1.7b", "qwen2.5-7b", "mixtral-8x7b", "t5-11b")  # 24 heads; 28 heads and 4 kv; 8 experts; enc-dec
SEQ = 384  # divisible by 1, 2, 3, 4, 6, 8, 12, 16, 24, ... but not by 5, 7, 9, 10, 11


def _gpus_per_node(gpus: int) -> int:
    return gpus if gpus <= 12 else 8  # one node up to 12 (a 9- to 12-GPU node), else nodes of 8


def _oracle(cfg: TransformerConfig, seq: int, tp: int, sp: bool, ep: int) -> list[str]:
    """What Megatron-LM's assertions refuse, from the preset's published sizes."""
    bad = [f"{what} {n} % tp {tp}" for what, n in (("heads", cfg.heads), ("kv heads", cfg.n_kv_heads),
                                                   ("ffn", cfg.ffn)) if n % tp]
    if sp and seq % tp:
        bad.append(f"seq {seq} % tp {tp} (sequence parallel)")
    if ep > 1 and (not cfg.num_experts or cfg.num_experts % ep):
        bad.append(f"experts {cfg.num_experts} % ep {ep}")
    return bad


@pytest.mark.parametrize("name", MODELS)
def test_every_dp_strategy_offered_obeys_the_trainers_rule(name: str) -> None:
    """The DP's whole space, every pipeline degree, micro-batch count and context degree, on every GPU count."""
    cfg = get_preset(name)
    model = ModelSource(name, config=cfg)
    offered = 0
    for gpus in GPU_COUNTS:
        cluster = make_cluster(gpus, _gpus_per_node(gpus))
        ds = DpSearch(lambda b: model.build(b, SEQ), cluster, 2 * gpus, DEFAULT_CALIBRATION, 80 * 2**30)
        for pp in pipeline_degrees(gpus, len(ds.blocks)):
            for cp in ds.context_degrees(pp):
                for m in microbatch_counts(2 * gpus, pp):
                    for s in ds.strategies(pp, m, cp):
                        offered += 1
                        assert not _oracle(cfg, SEQ, s.tp, s.sp, s.ep), (gpus, pp, s)
    assert offered > 1000  # the space is not empty: odd counts still get data parallelism and TP that divides


def _run(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = parplan(args)
    return code, out.getvalue() + err.getvalue()


def _memory_flags(doc: dict[str, Any]) -> list[list[str]]:
    """``parplan memory`` flags for each distinct layer strategy of a uniform or per-layer plan."""
    st = doc["strategy"]
    runs = [st] if st["kind"] == "uniform" else st["layers"]
    pp = st["pp"]
    flags = set()
    for r in runs:
        f = ["--tp", str(r["tp"]), "--pp", str(pp), "--cp", str(r.get("cp", 1)),
             "--expert-parallel", str(r["expert_parallel"])]
        if r["sequence_parallel"]:
            f.append("--sequence-parallel")
        flags.add(tuple(f))
    return [list(f) for f in sorted(flags)]


def _split_sizes(graph: Any, node_id: str) -> dict[str, int]:
    n = graph.node(node_id)
    sizes = dict(n.dims)
    for i in n.inputs:
        sizes.update(dict(graph.node(i).dims))
    return sizes


def _check_per_operator(doc: dict[str, Any], model: ModelSource, seq: int) -> None:
    """Each operator's split divides the dim it splits (the graph at the plan's micro-step size)."""
    st = doc["strategy"]
    axes = st["mesh"]["axes"]
    graph = model.build(st["micro_step_batch"], seq)
    for unit in st["units"]:
        for op, info in unit["ops"].items():
            split: dict[str, int] = {}
            for axis, dim in (info.get("assignment") or {}).items():
                split[dim] = split.get(dim, 1) * axes[axis]
            sizes = _split_sizes(graph, op)
            for dim, k in split.items():
                assert sizes[dim] % k == 0, (op, dim, sizes[dim], k)


# (model, GPUs, target, search): odd and non-power-of-two counts where dividing the devices is not
# dividing the heads (7: gpt-1.7b's 24 heads; qwen2.5's 28 heads but 4 kv heads; 12: llama-3-8b's 32), the sequence (5
# does not divide 384) or the experts (6 GPUs, 8 experts)
CASES = [
    ("gpt-1.7b", 7, "any", "dp"), ("gpt-1.7b", 7, "galvatron", "auto"), ("gpt-1.7b", 6, "galvatron", "auto"),
    ("gpt-1.7b", 5, "any", "ilp"), ("gpt-1.7b", 6, "megatron", "auto"), ("qwen2.5-7b", 7, "any", "dp"),
    ("llama-3-8b", 12, "torchtitan", "auto"), ("mixtral-8x7b", 6, "any", "dp"), ("t5-11b", 3, "any", "dp"),
    ("gpt-1.7b", 10, "deepspeed", "auto"),
]


@pytest.mark.parametrize(("name", "gpus", "target", "search"), CASES)
def test_returned_plans_pass_parplan_memory_and_the_target_export(name: str, gpus: int, target: str,
                                                                  search: str) -> None:
    body: dict[str, Any] = {
        "model": {"preset": name}, "cluster": {"gpus": gpus, "gpus_per_node": _gpus_per_node(gpus),
                                              "gpu_memory_gib": 4096},
        "training": {"global_batch": 2 * gpus, "seq_len": SEQ}, "target": target, "time_limit": 20}
    if search != "auto":
        body["search"] = search
    doc = solve(parse_plan_request(body))
    assert doc["memory"] is not None, doc.get("message")
    st = doc["strategy"]
    if st["kind"] == "intra-operator":
        _check_per_operator(doc, ModelSource(name, config=get_preset(name)), SEQ)
    else:
        base = ["memory", "--json", "--model", name, "--gpus", str(gpus), "--gpus-per-node",
                str(_gpus_per_node(gpus)), "--seq-len", str(SEQ), "--gpu-memory-gib", "4096"]
        for flags in _memory_flags(doc):
            code, out = _run(base + flags)
            assert code == 0, (flags, out)
            assert json.loads(out)["memory"]["peak_bytes"] > 0
    if target != "any":
        export_plan(doc, target)  # NotExpressibleError if the trainer cannot run it


def _micro_batches(doc: dict[str, Any]) -> set[int]:
    """Samples per micro-batch of one data-parallel replica, for every layer of a uniform or per-layer
    plan (a per-layer plan's replica of a layer is its dp ranks: global batch / (micro-batches x dp))."""
    st = doc["strategy"]
    if st["kind"] == "uniform":
        return {st["micro_batch"]}
    assert st["kind"] == "per-layer", st["kind"]
    return {st["global_batch"] // (st["num_microbatches"] * r["dp"]) for r in st["layers"]}


# (GPUs, global batch, micro-batch, target, search): the default would pick other micro-batches here
MICRO = [(8, 64, 4, "any", "dp"), (8, 64, 1, "any", "dp"), (6, 24, 2, "galvatron", "auto"),
         (4, 16, 2, "megatron", "auto"), (8, 64, 4, "deepspeed", "auto"), (4, 24, 3, "any", "ilp")]


@pytest.mark.parametrize(("gpus", "batch", "micro", "target", "search"), MICRO)
def test_a_given_micro_batch_is_the_plans(gpus: int, batch: int, micro: int, target: str, search: str) -> None:
    body: dict[str, Any] = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": gpus, "gpu_memory_gib": 4096},
                            "training": {"global_batch": batch, "seq_len": 256, "micro_batch": micro},
                            "target": target, "time_limit": 20}
    if search != "auto":
        body["search"] = search
    doc = solve(parse_plan_request(body))
    st = doc["strategy"]
    if st["kind"] == "intra-operator":
        # micro-steps of micro_batch x the largest dp dividing the GPUs and the batch (24 % (3 x 4) == 0: 12)
        assert st["micro_step_batch"] == micro * max(d for d in range(1, gpus + 1)
                                                     if gpus % d == 0 and batch % (micro * d) == 0)
    else:
        assert _micro_batches(doc) == {micro}, st["summary"]
    for name, b in doc["baselines"].items():
        assert b is None or b["strategy"]["micro_batch"] == micro, name


@pytest.mark.parametrize(("gpus", "batch", "micro", "target"), [
    (8, 63, 2, "any"), (8, 64, 3, "megatron"), (8, 48, 4, "deepspeed")])  # deepspeed: dp is the 8 GPUs, 48 % 32
def test_a_micro_batch_that_cannot_divide_the_batch_is_refused_naming_the_field(gpus: int, batch: int, micro: int,
                                                                               target: str) -> None:
    body = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": gpus},
            "training": {"global_batch": batch, "micro_batch": micro}, "target": target}
    with pytest.raises(RequestError) as e:
        parse_plan_request(body)
    assert e.value.field == "training.micro_batch" and f"global batch {batch}" in str(e.value)


def test_the_cli_refuses_an_indivisible_micro_batch_in_one_line() -> None:
    code, out = _run(["plan", "--model", "gpt-1.7b", "--gpus", "8", "--global-batch", "64", "--micro-batch", "3"])
    assert code == 2 and len(out.strip().splitlines()) == 1 and "micro_batch 3" in out, out
