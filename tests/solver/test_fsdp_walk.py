"""ZeRO-3's stage peak from the backward walk (parplan.solver.cost.fsdp).

The walk's accuracy is checked against measurement by the agent's matrix
(tests/agent/test_agent_matrix.py, FSDP2 runs). Here, bounds that hold whatever the walk's
details, written from the block's closed forms:

- from below: the moment block L's backward starts, every saved activation of the micro-batch,
  block L's and block L-1's gathered weights are alive (2P); when it ends, blocks 1..L-1's
  activations, block L-1's weights and block L's unsharded gradients with their reduce-scatter
  copy (P + 2G);
- from above: no moment holds more than every category at its own peak.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
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
    assert stage.peak_bytes < 0.97 * stage.memory.bytes.total


def test_without_zero3_the_peak_is_the_sum_of_category_peaks() -> None:
    cfg = _gpt(4, 256, 4, 256)
    for zero in (0, 1, 2):
        stage = plan_memory(build_graph(cfg, batch=2), ParallelConfig(dp=4, zero=zero)).stages[0]
        assert stage.peak_bytes == stage.memory.bytes.total
