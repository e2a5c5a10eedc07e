"""The executor's PyTorch models match the cost model's graph; shrinking; the memory tracker."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch

from parplan.agent.executor import RunSpec
from parplan.agent.matrix import GPT_TINY, LLAMA_TINY
from parplan.agent.memtrack import CategoryTracker
from parplan.agent.model import attention_kernel, build_model, parameter_count, set_recompute
from parplan.agent.plans import shrink_config, spec_for, spec_for_validation
from parplan.solver.errors import ConfigError, StrategyError
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.hf import load_hf_config
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

HF = "tests/data/hf"


@pytest.mark.parametrize("cfg", [GPT_TINY, LLAMA_TINY,
                                 get_preset("llama-3-8b").with_(layers=2, hidden=128, heads=4, kv_heads=2, ffn=344,
                                                                vocab=512, seq_len=64),
                                 GPT_TINY.with_(norm="rmsnorm", positions="rope", linear_bias=False),
                                 GPT_TINY.with_(positions="none"),
                                 LLAMA_TINY.with_(norm="layernorm", positions="learned", linear_bias=True)],
                         ids=["gpt", "llama", "llama3-gqa", "gpt-rmsnorm-rope-unbiased", "gpt-no-positions",
                              "llama-layernorm-learned-biased"])
def test_parameters_match_the_graph_name_for_name(cfg) -> None:
    model = build_model(cfg)
    graph = build_graph(cfg, batch=1, seq_len=16)
    expected = {n.id: n.numel for n in graph.nodes if n.is_parameter}
    got = {name: p.numel() for name, p in model.named_parameters()}
    assert got == expected
    assert parameter_count(model) == ModelSource(cfg.name, config=cfg).parameter_count()


@pytest.mark.parametrize("name", ["gpt2.json", "llama.json"])
def test_hf_configs_build_with_the_same_parameter_count(name: str) -> None:
    cfg = load_hf_config(f"{HF}/{name}")
    small = shrink_config(cfg, ParallelConfig(tp=2))
    assert parameter_count(build_model(small)) == ModelSource(small.name, config=small).parameter_count()


def test_gpt_ties_the_head_to_the_embedding_and_llama_does_not() -> None:
    gpt, llama = build_model(GPT_TINY), build_model(LLAMA_TINY)
    assert gpt.head.lm.weight is gpt.embed.tokens.weight
    assert llama.head.lm.weight is not llama.embed.tokens.weight


def test_attention_kernel_on_the_cpu() -> None:
    # The CPU flash kernel has no dropout: GPT (dropout 0.1) runs the unfused core, Llama the kernel.
    assert attention_kernel(torch.device("cpu"), 0.1) == "unfused"
    assert "flash" in attention_kernel(torch.device("cpu"), 0.0)


def test_unsupported_families_and_strategies_are_refused() -> None:
    with pytest.raises(ConfigError, match="gpt and llama"):
        build_model(get_preset("bert-large"))
    RunSpec(model=asdict(GPT_TINY), dp=2, zero=1).validate()  # DDP + ZeroRedundancyOptimizer
    with pytest.raises(StrategyError, match="zero=1 with tp > 1"):
        RunSpec(model=asdict(GPT_TINY), tp=2, dp=2, zero=1).validate()
    with pytest.raises(StrategyError, match="layer_zero"):
        RunSpec(model=asdict(GPT_TINY), dp=2, layer_zero=(0, 3, 3, 3)).validate()
    with pytest.raises(StrategyError, match="partition"):
        RunSpec(model=asdict(GPT_TINY), pp=2, num_microbatches=2, partition=(4, 0)).validate()
    with pytest.raises(StrategyError, match="interleaved"):
        RunSpec(model=asdict(GPT_TINY), pp=2, num_microbatches=2, schedule="interleaved", virtual_stages=2,
                partition=(2, 2)).validate()
    with pytest.raises(StrategyError, match="tp=3"):
        RunSpec(model=asdict(GPT_TINY), tp=3).validate()


@pytest.mark.parametrize(("preset", "tp", "pp"), [("gpt3-175b", 8, 4), ("llama-3-70b", 4, 2), ("llama-2-7b", 2, 1)])
def test_shrunk_copies_keep_the_degrees_runnable(preset: str, tp: int, pp: int) -> None:
    st = ParallelConfig(tp=tp, pp=pp, dp=1, num_microbatches=64 if pp > 1 else 1)
    spec = spec_for(get_preset(preset), st, None, shrink=True, max_procs=64)
    spec.validate()
    cfg = spec.config()
    assert cfg.heads % tp == 0 and cfg.n_kv_heads % tp == 0 and cfg.ffn % tp == 0 and cfg.vocab % tp == 0
    assert cfg.layers >= pp and ModelSource(cfg.name, config=cfg).parameter_count() < 20_000_000
    assert (spec.tp, spec.pp, spec.dp) == (tp, pp, 1)
    assert spec.num_microbatches <= 2 * pp or pp == 1


def test_too_many_processes_reduce_dp_only_without_zero() -> None:
    spec = spec_for(GPT_TINY, ParallelConfig(tp=2, dp=16), None, shrink=False, max_procs=8)
    assert (spec.tp, spec.dp) == (2, 4) and spec.extra["notes"]
    with pytest.raises(StrategyError, match="ZeRO-3"):
        spec_for(GPT_TINY, ParallelConfig(dp=16, zero=3), None, shrink=False, max_procs=8)


def test_spec_for_a_claimed_validation() -> None:
    plan = {"strategy": {"tp": 2, "pp": 2, "dp": 1, "zero": 0, "recompute": "full", "micro_batch": 1,
                         "num_microbatches": 32, "schedule": "interleaved", "virtual_stages": 2,
                         "precision": "bf16"}, "model": {"seq_len": 2048}}
    spec = spec_for_validation({"id": "v", "plan": plan, "request": {"model": {"preset": "llama-2-13b"}},
                                "shrink": {"layers": 8, "hidden": 128}}, max_procs=8)
    assert (spec.tp, spec.pp, spec.schedule, spec.virtual_stages, spec.recompute) == (2, 2, "interleaved", 2, "full")
    assert spec.config().layers == 8 and spec.config().hidden == 128
    assert spec.num_microbatches == 8 and spec.seq_len == 128
    spec.validate()
    with pytest.raises(ConfigError, match="no model"):
        spec_for_validation({"plan": plan, "request": {}}, max_procs=8)


def test_tracker_single_process_categories() -> None:
    """Model states are exactly the parameters' bytes; activations and temporaries are seen."""
    model = build_model(GPT_TINY)
    set_recompute(model, "none")
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, foreach=False)
    tokens = torch.randint(0, GPT_TINY.vocab, (1, 64))

    def step() -> None:
        model(tokens, tokens).backward()
        opt.step()
        opt.zero_grad(set_to_none=False)

    step()
    tracker = CategoryTracker()
    tracker.register_state([model], [opt])
    with tracker.measuring():
        step()
    r = tracker.result(torch.device("cpu"))
    n = parameter_count(model)
    assert r["breakdown"]["parameters"] == 4 * n
    assert r["breakdown"]["gradients"] == 4 * n
    assert 8 * n <= r["breakdown"]["optimizer_states"] <= 8 * n + 4 * len(opt.state)  # + Adam's step counters
    assert r["breakdown"]["activations"] > 0 and r["breakdown"]["temporary"] > 0
    assert r["peak_bytes"] == sum(r["at_peak"].values())
    assert all(r["at_peak"][k] <= r["breakdown"][k] for k in r["breakdown"])


@pytest.mark.parametrize(("fields", "zero", "recompute"), [
    ({"dp": 4, "zero": 3}, 3, "full"),
    ({"tp": 2, "dp": 2, "zero": 2, "sequence_parallel": True}, 2, "none"),
    ({"pp": 2, "dp": 2, "zero": 3, "num_microbatches": 4, "partition": (1, 3)}, 3, "selective"),
])
def test_per_layer_prediction_of_a_uniform_plan_is_the_uniform_prediction(fields: dict[str, object], zero: int,
                                                                          recompute: str) -> None:
    """The whole-plan evaluator path (mixed plans) agrees with ``evaluate`` when every block is alike."""
    from parplan.agent.validate import predict

    layers = GPT_TINY.layers
    uniform = RunSpec(model=asdict(GPT_TINY), recompute=recompute, **fields)  # type: ignore[arg-type]
    mixed = RunSpec(model=asdict(GPT_TINY), recompute=recompute, layer_zero=(zero,) * layers,
                    layer_recompute=(recompute,) * layers, **fields)  # type: ignore[arg-type]
    assert mixed.per_layer and not uniform.per_layer
    a, b = predict(uniform, False), predict(mixed, False)
    assert a["memory"]["stages"] == b["memory"]["stages"]
    assert a["time"]["step_seconds"] == pytest.approx(b["time"]["step_seconds"])


def test_per_layer_prediction_follows_each_block() -> None:
    """Checkpointing half the blocks lands between checkpointing none and all of them."""
    from parplan.agent.validate import predict

    def activations(rec: tuple[str, ...]) -> int:
        spec = RunSpec(model=asdict(LLAMA_TINY), dp=2, zero=3, layer_zero=(3, 3, 2, 2), layer_recompute=rec)
        return int(predict(spec, True)["memory"]["stages"][0]["breakdown"]["activations"])

    none, half, full = (activations(("none",) * 4), activations(("full", "full", "none", "none")),
                        activations(("full",) * 4))
    assert full < half < none
