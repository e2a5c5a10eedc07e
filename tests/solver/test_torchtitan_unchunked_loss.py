"""The runtime ``torchtitan-unchunked-loss``: torchtitan's trainer with the loss its ``train.py`` ran
without ``ChunkedLossWrapper``, ``loss_fn(pred, labels)`` = ``cross_entropy(pred.flatten(0, 1).float(),
labels.flatten(0, 1))`` on the whole sequence, ``del pred`` before ``loss.backward()``. Oracles, in
closed form from that code and the model's dimensions (b x S tokens, vocabulary V, one device):

- forward: ``log_softmax`` saves its fp32 output, b·S·V·4 bytes kept until the step's backward (the
  bf16 logits and their fp32 copy are saved by no operator and die with ``pred``);
- backward starts there: ``nll_loss``'s backward makes the log-probabilities' fp32 gradient (b·S·V·4)
  and ``log_softmax``'s backward the fp32 logits' gradient (b·S·V·4, cast to bf16 by ``.float()``'s
  backward after) while the saved log-probabilities live, with every block's saved tensors and no
  weight gradient made yet.

The rest is torchtitan's: fp32 weights as the optimizer's master copy (16 bytes a parameter with Adam)."""

from __future__ import annotations

import pytest

from parplan.solver.cost.activations import Recompute, op_saved_items
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.stage_memory import StageMemory
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph, OpKind
from parplan.solver.strategy import ParallelConfig

D, V, S = 256, 16384, 1024  # a vocabulary large enough for the loss to be the step's peak
LLAMA = TransformerConfig(family="llama", name="tiny-llama", layers=2, hidden=D, heads=8, kv_heads=8, ffn=768,
                          vocab=V, seq_len=S, tied_embeddings=False)
UNCHUNKED = Runtime.TORCHTITAN_UNCHUNKED_LOSS


def _stage(batch: int, dp: int, runtime: Runtime = UNCHUNKED) -> tuple[Graph, StageMemory]:
    graph = build_graph(LLAMA, batch=batch)
    cfg = ParallelConfig(dp=dp, zero=3, precision="bf16", micro_batch=batch, runtime=runtime)
    return graph, plan_memory(graph, cfg).stages[0]


@pytest.mark.parametrize("batch", [1, 2])
def test_the_fp32_log_probabilities_are_kept_for_backward(batch: int) -> None:
    graph, st = _stage(batch, 4)
    loss = next(n for n in graph.nodes if n.kind is OpKind.CROSS_ENTROPY)
    kept = op_saved_items(loss, graph, 2, flash_attention=True, recompute=Recompute.OP, runtime=UNCHUNKED)
    assert sum(i.total_bytes for i in kept) == batch * S * V * 4
    # the chunked loss keeps no logits-sized tensor for backward: the difference is the log-probabilities
    _, chunked = _stage(batch, 4, Runtime.TORCHTITAN)
    diff = st.activation_bytes_per_microbatch - chunked.activation_bytes_per_microbatch
    assert diff == pytest.approx(batch * S * V * 4)


@pytest.mark.parametrize("dp", [2, 8])
@pytest.mark.parametrize("batch", [2, 4])
def test_the_peak_holds_the_loss_backward(dp: int, batch: int) -> None:
    graph, st = _stage(batch, dp)
    m = st.memory.bytes
    params = graph.parameter_count()
    # torchtitan's states: fp32 weights (the master copy) and Adam's two moments, sharded; no gradient
    assert m.parameters + m.optimizer_states == pytest.approx(params * 12 / dp, rel=1e-9)
    logits = batch * S * V
    floor = m.parameters + m.optimizer_states + st.activation_bytes_per_microbatch + logits * (4 + 4)
    assert st.peak_bytes >= floor * (1 - 1e-9)


def test_torchtitans_chunked_runtime_is_unchanged() -> None:
    assert Runtime.TORCHTITAN.loss_chunks == 8 and UNCHUNKED.loss_chunks == 0
    assert UNCHUNKED.master_is_parameter and not UNCHUNKED.keeps_gradients
