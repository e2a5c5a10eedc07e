"""A stage's peak as the busiest moment of a step (parplan.solver.cost.peak).

The walk's accuracy is checked against measurement by the agent's matrix
(tests/agent/test_agent_matrix.py). Here, bounds that hold whatever the walk's details, written
from the block's closed forms. ZeRO-3:

- from below: the moment block L's backward starts, every saved activation of the micro-batch,
  block L's and block L-1's gathered weights are alive (2P); when it ends, blocks 1..L-1's
  activations, block L-1's weights and block L's unsharded gradients with their reduce-scatter
  copy (P + 2G);
- from above: no moment holds more than every category at its own peak.
"""

from __future__ import annotations

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.strategy import ParallelConfig


def _gpt(layers: int, hidden: int, heads: int, seq: int) -> TransformerConfig:
    return TransformerConfig("gpt", "gpt-test", layers, hidden, heads, 4 * hidden, 512, seq)


def _block_params(h: int) -> int:
    """GPT block: QKV 3h²+3h, output h²+h, MLP 4h²+4h and 4h²+h, two LayerNorms 2h each."""
    return 12 * h * h + 13 * h


def _per_block_activations(cfg: TransformerConfig, b: int, par: ParallelConfig) -> float:
    small = plan_memory(build_graph(cfg, batch=b), par).stages[0].activation_bytes_per_microbatch
    large = plan_memory(build_graph(cfg.with_(layers=cfg.layers + 1), batch=b), par)
    return large.stages[0].activation_bytes_per_microbatch - small


_cases = st.tuples(
    st.integers(2, 6),                      # layers
    st.sampled_from([64, 128, 256]),        # hidden
    st.sampled_from([128, 256]),            # seq
    st.integers(1, 4),                      # micro-batch
    st.sampled_from([2, 4, 8]),             # dp
    st.sampled_from(list(Recompute)),
    st.sampled_from(["fp32", "bf16"]),
)


@settings(max_examples=30, deadline=None)
@given(_cases)
def test_zero3_peak_between_closed_form_moments_and_sum_of_category_peaks(case: tuple) -> None:
    layers, h, seq, b, dp, rec, precision = case
    cfg = _gpt(layers, h, 4, seq)
    par = ParallelConfig(dp=dp, zero=3, recompute=rec, precision=precision, runtime=Runtime.TORCH)
    stage = plan_memory(build_graph(cfg, batch=b), par).stages[0]
    m = stage.memory.bytes
    resident = m.model_states
    pbytes, gbytes = (4, 4) if precision == "fp32" else (2, 4)
    big_p, big_g = _block_params(h) * pbytes, _block_params(h) * gbytes
    act = stage.activation_bytes_per_microbatch
    per_block = _per_block_activations(cfg, b, par)
    starts = resident + act + 2 * big_p
    ends = resident + (act - per_block) + big_p + 2 * big_g
    assert stage.peak_bytes >= max(starts, ends) * (1 - 1e-9)
    assert stage.peak_bytes <= m.total * (1 + 1e-9)


@pytest.mark.parametrize("rec", [Recompute.NONE, Recompute.FULL])
def test_zero3_peak_is_below_the_sum_of_category_peaks(rec: Recompute) -> None:
    """The point of the walk: gradients and buffers peak once activations start being freed."""
    cfg = _gpt(4, 256, 4, 256)
    stage = plan_memory(build_graph(cfg, batch=2), ParallelConfig(dp=4, zero=3, recompute=rec)).stages[0]
    libs = Runtime.MEGATRON.library_workspace_bytes  # held through the step: in both, peaking nowhere
    assert stage.peak_bytes - libs < 0.97 * (stage.memory.bytes.total - libs)


@settings(max_examples=30, deadline=None)
@given(_cases, st.sampled_from([0, 1, 2]), st.sampled_from(list(Runtime)), st.integers(1, 3))
def test_every_peak_between_start_of_backward_and_sum_of_category_peaks(case: tuple, zero: int, runtime: Runtime,
                                                                        m: int) -> None:
    """Any strategy: the moment backward starts holds the resident states and every saved
    activation (but the gradients where the runtime makes them in backward: torchtitan); the
    optimizer step holds every model state; no moment holds more than every category at its own
    peak."""
    layers, h, seq, b, dp, rec, precision = case
    assume(rec is not Recompute.OP or runtime.per_operator_checkpointing)  # (PyTorch's policy)
    cfg = _gpt(layers, h, 4, seq)
    par = ParallelConfig(dp=dp, zero=zero, recompute=rec, precision=precision, runtime=runtime, num_microbatches=m)
    stage = plan_memory(build_graph(cfg, batch=b), par).stages[0]
    m_ = stage.memory.bytes
    later = 0.0 if runtime.keeps_gradients else m_.gradients
    assert stage.peak_bytes >= (m_.model_states - later + m_.activations) * (1 - 1e-9)
    assert stage.peak_bytes >= m_.model_states * (1 - 1e-9)
    assert stage.peak_bytes <= m_.total * (1 + 1e-9)


def test_peak_below_the_sum_when_temporaries_and_activations_peak_apart() -> None:
    """Issue 10's case: the logits' gradient is the largest temporary, but by the time the
    embedding's backward makes the tied table's three gradients the activations are freed."""
    cfg = _gpt(4, 256, 4, 64).with_(vocab=8192)
    stage = plan_memory(build_graph(cfg, batch=1), ParallelConfig(dp=4, zero=1)).stages[0]
    assert stage.peak_bytes < stage.memory.bytes.total


def _grad_elems(graph: object) -> float:
    return float(sum(n.numel for n in graph.nodes if n.is_parameter))  # type: ignore[attr-defined]


@pytest.mark.parametrize("zero", [2, 3])
def test_torch_fsdp_accumulation_keeps_every_unsharded_gradient_until_the_last_micro_batch(zero: int) -> None:
    """FSDP2 without gradient synchronisation: from the second micro-batch on, every parameter's
    unsharded gradient (P elements, fp32) is alive; the second micro-batch's backward starts with
    them and every saved activation, so the peak grows by at least P·4 over one micro-batch's
    forward... and by at most P·4 over the single-micro-batch peak (nothing else changes)."""
    cfg = _gpt(3, 128, 4, 128)
    graph = build_graph(cfg, batch=2)
    one, two = (plan_memory(graph, ParallelConfig(dp=4, zero=zero, precision="fp32", runtime=Runtime.TORCH,
                                                  num_microbatches=m)).stages[0] for m in (1, 2))
    grads = _grad_elems(graph) * 4
    assert two.peak_bytes >= two.memory.bytes.model_states + two.activation_bytes_per_microbatch + grads
    assert one.peak_bytes < two.peak_bytes <= one.peak_bytes + grads * (1 + 1e-9)
    megatron = [plan_memory(graph, ParallelConfig(dp=4, zero=zero, precision="fp32", num_microbatches=m)).stages[0]
                for m in (1, 2)]
    assert megatron[0].peak_bytes == megatron[1].peak_bytes  # Megatron reduces into sharded buffers
    # synchronising after every micro-batch (set_requires_gradient_sync(True)) keeps nothing between them
    every = plan_memory(graph, ParallelConfig(dp=4, zero=zero, precision="fp32", runtime=Runtime.TORCH,
                                              num_microbatches=2, sync_every_microbatch=True)).stages[0]
    assert every.peak_bytes == one.peak_bytes


def test_torch_zero2_shards_parameters_and_keeps_every_block_gathered_from_forward() -> None:
    """FSDP2 without resharding after forward: parameters P/dp between steps (Megatron-LM and
    DeepSpeed keep them whole); at the end of forward every block's weights are gathered, and the
    last block's all-gather buffer is still alive."""
    h, layers, dp = 128, 3, 4
    cfg = _gpt(layers, h, 4, 64)
    graph = build_graph(cfg, batch=1)
    par = ParallelConfig(dp=dp, zero=2, precision="fp32", runtime=Runtime.TORCH)
    stage = plan_memory(graph, par).stages[0]
    total = _grad_elems(graph) * 4
    assert stage.memory.bytes.parameters == pytest.approx(total / dp, rel=1e-12)
    megatron = plan_memory(graph, ParallelConfig(dp=dp, zero=2, precision="fp32")).stages[0]
    assert megatron.memory.bytes.parameters == pytest.approx(total, rel=1e-12)
    end_of_forward = (stage.memory.bytes.model_states + stage.activation_bytes_per_microbatch + total
                      + _block_params(h) * 4)
    assert stage.peak_bytes >= end_of_forward * (1 - 1e-9)
