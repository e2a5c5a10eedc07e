"""The offloaded optimizer (Megatron-LM's ``HybridDeviceOptimizer`` on the agent's Adam) and the memory
tracker's host accounting, then two runs on gloo against the cost model (``parplan.solver.cost.offload``).

Oracles: Megatron-LM's rule (``_get_sub_optimizer_param_groups``: whole tensors, in order, while the moved
count is below ``F`` of the total; per moved tensor an fp32 host copy, an fp32 host gradient buffer and the
host Adam's two fp32 moments and its fp32 step counter) and ``ZeroRedundancyOptimizer``'s partition
(largest tensor first, each to the rank holding the fewest elements so far), written out here; plain
``torch.optim.Adam`` for the numbers.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest
import torch
from torch import nn

from parplan.agent.matrix import GPT_TINY
from parplan.agent.memtrack import CategoryTracker
from parplan.agent.model import build_model
from parplan.agent.offload import HostOffloadAdam, offloaded_prefix
from parplan.agent.run_spec import RunSpec
from parplan.solver.errors import StrategyError

#: the CPU matrix's tolerances (tests/agent/test_agent_matrix.py): |error| of the peak, under-prediction
TARGET = 0.03
UNDER = 0.02
#: host bytes per moved element (fp32 copy, fp32 gradient buffer, two fp32 moments) and per moved tensor
#: (fused Adam's fp32 step counter)
PER_ELEMENT = 16
PER_TENSOR = 4


def test_offloaded_prefix_moves_whole_tensors_until_the_fraction_is_reached() -> None:
    assert offloaded_prefix([4, 3, 2, 1], 0.5) == 2  # threshold 5: 4 (< 5) then 3 moved, 7 >= 5 stops
    assert offloaded_prefix([4, 3, 2, 1], 0.4) == 1  # threshold 4: 4 moved, 4 >= 4 stops
    assert offloaded_prefix([4, 3, 2, 1], 0.01) == 1
    assert offloaded_prefix([4, 3, 2, 1], 1.0) == 4
    assert offloaded_prefix([1, 2, 3, 4], 0.5) == 3  # 0, 1, 3 < 5: three moved


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _steps(model: nn.Module, opt: torch.optim.Optimizer, n: int) -> None:
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        x = torch.randn(4, 16, generator=gen)
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=False)


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_host_step_updates_the_device_weights_as_adam_does(fraction: float) -> None:
    ref, off = _model(), _model()
    _steps(ref, torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=False), 3)
    opt = HostOffloadAdam(list(off.parameters()), lr=1e-2, offload_fraction=fraction)
    _steps(off, opt, 3)
    assert opt.host_optimizer is not None
    for a, b in zip(ref.parameters(), off.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-7)
    for p, (master, _) in opt.host_of.items():  # the device weight is the host's updated copy
        assert torch.equal(p.detach(), master) and master.data_ptr() != p.data_ptr()


@pytest.mark.parametrize("fraction", [0.5, 1.0])
def test_tracker_counts_the_host_apart_from_the_device(fraction: float) -> None:
    model = _model()
    params = list(model.parameters())
    opt = HostOffloadAdam(params, lr=1e-2, offload_fraction=fraction)
    _steps(model, opt, 1)  # creates the states
    moved = params[:offloaded_prefix([p.numel() for p in params], fraction)]
    rest = params[len(moved):]
    tracker = CategoryTracker()
    host_states, host_grads = opt.host_tensors()
    tracker.register_host(host_states, host_grads)
    tracker.register_state([model], [o for o in (opt.device_optimizer,) if o is not None])
    with tracker.measuring():
        _steps(model, opt, 1)
    host, device = tracker.host_result(), tracker.result(torch.device("cpu"))
    n_moved = sum(p.numel() for p in moved)
    assert host["breakdown"]["gradients"] == 4 * n_moved
    assert host["breakdown"]["optimizer_states"] == 12 * n_moved + PER_TENSOR * len(moved)
    assert host["peak_bytes"] == host["resident_bytes"] == PER_ELEMENT * n_moved + PER_TENSOR * len(moved)
    # the device keeps the weights, their gradients and the rest's Adam states (foreach=False: an fp32 step)
    n_all = sum(p.numel() for p in params)
    assert device["breakdown"]["parameters"] == device["breakdown"]["gradients"] == 4 * n_all
    assert device["breakdown"]["optimizer_states"] == sum(8 * p.numel() + 4 for p in rest)
    # the device's total never counts the host's tensors (no device category holds them)
    assert 0 < device["peak_bytes"] <= sum(device["breakdown"].values())


def test_offloading_needs_the_distributed_optimizer_of_the_torch_trainer() -> None:
    model = asdict(GPT_TINY)
    RunSpec(model=model, dp=2, zero=1, optimizer_offload=0.5).validate()
    RunSpec(model=model, zero=1, optimizer_offload=1.0).validate()
    for bad in ({"dp": 2, "zero": 0, "optimizer_offload": 1.0}, {"dp": 2, "zero": 3, "optimizer_offload": 1.0},
                {"dp": 2, "zero": 1, "optimizer_offload": 1.5}, {"dp": 2, "zero": 1, "optimizer_offload": -0.5}):
        with pytest.raises(StrategyError, match="optimizer_offload"):
            RunSpec(model=model, **bad).validate()


def _zero1_shard(numels: list[int], ranks: int, rank: int) -> list[int]:
    """``ZeroRedundancyOptimizer``'s share of ``rank``: largest first, each to the least-loaded rank."""
    sizes: list[int] = [0] * ranks
    shares: list[list[int]] = [[] for _ in range(ranks)]
    for n in sorted(numels, reverse=True):
        r = sizes.index(min(sizes))
        shares[r].append(n)
        sizes[r] += n
    return shares[rank]


def _host_oracle(spec: RunSpec, rank: int) -> int:
    """Host bytes of ``rank`` by Megatron-LM's rule on its ZeRO-1 share of the model's (unique) tensors."""
    numels = [p.numel() for p in build_model(spec.config(), spec.seed).parameters()]
    shard = _zero1_shard(numels, spec.dp, rank)
    k = offloaded_prefix(shard, spec.optimizer_offload)
    return PER_ELEMENT * sum(shard[:k]) + PER_TENSOR * k


SPECS = [RunSpec(model=asdict(GPT_TINY), seq_len=GPT_TINY.seq_len, dp=2, zero=1, optimizer_offload=f, timing_steps=1,
                 label=f"gpt-tiny/zero1-dp2-offload{f:g}/none") for f in (1.0, 0.5)]


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    from parplan.agent.validate import run_and_compare

    return run_and_compare(SPECS, "cpu")


@pytest.mark.slow
@pytest.mark.parametrize("i", range(len(SPECS)), ids=[s.label for s in SPECS])
def test_offloaded_run_against_the_prediction(results: list[dict[str, Any]], i: int) -> None:
    spec, r = SPECS[i], results[i]
    assert r["correct"] is True  # loss after the host's Adam step equals the single-process Adam's
    err = r["most_loaded"]["relative_error"]
    assert abs(err) <= TARGET and err <= UNDER, f"device peak off by {err:+.1%}"
    for rk in r["ranks"]:
        host = rk["measured"]["host"]
        assert host["peak_bytes"] == host["resident_bytes"] == _host_oracle(spec, rk["rank"])
        assert rk["predicted"]["host_bytes"] > 0
        if spec.optimizer_offload == 1.0:
            assert rk["measured"]["breakdown"]["optimizer_states"] == 0
            assert abs(rk["relative_error"]["host_bytes"]) <= TARGET
        else:
            # Whole tensors move until the fraction is reached: the host holds more than the cost model's
            # F x elements by the last moved tensor (here 4 of 262,144 elements against 863,616, +21.4%);
            # a gap of the cost model's continuous fraction, reported, not fitted.
            assert 0 < rk["relative_error"]["host_bytes"] <= 0.25


def test_plans_carry_the_offload_fraction_to_the_run() -> None:
    from parplan.agent.plans import spec_for, strategy_of_plan
    from parplan.solver.strategy import ParallelConfig

    strategy = ParallelConfig(dp=2, zero=1, optimizer_offload=0.5)
    assert spec_for(GPT_TINY, strategy, 64, shrink=False).optimizer_offload == 0.5
    doc = {"strategy": {"tp": 1, "pp": 1, "dp": 2, "zero": 1, "optimizer_offload": 1.0}}
    assert strategy_of_plan(doc).optimizer_offload == 1.0
    with pytest.raises(StrategyError, match="zero 1"):  # DeepSpeed's ZeRO-Offload under ZeRO-3
        strategy_of_plan({"strategy": {**doc["strategy"], "zero": 3}})
