"""torchtitan's chunked loss (``cost.loss_loop``): the output layer and the cross entropy run inside
forward in 8 sequence chunks, so no logits are kept for backward and the loop's own buffers peak at the
end of forward. Oracles: the loop's sizes in closed form from the model's dimensions, and the stage
peak's lower bound at the loop's moment (resident states but gradients, every saved tensor, the gathered
output layer and the loop), computed here from the dimensions alone. The measurement behind the rule
is ``tests/agent/test_torchtitan_run.py`` (docs/notes/torchtitan-run.md)."""

from __future__ import annotations

import pytest

from parplan.solver.cost.activations import Recompute, op_saved_items
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.runtime import TORCHTITAN_LOSS_CHUNKS, Runtime
from parplan.solver.cost.unit_strategy import UnitStrategy
from parplan.solver.cost.units import GraphCosts
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import OpKind
from parplan.solver.strategy import ParallelConfig

D, V, S = 256, 1024, 128
LLAMA = TransformerConfig(family="llama", name="tiny-llama", layers=4, hidden=D, heads=8, kv_heads=8, ffn=768,
                          vocab=V, seq_len=S, tied_embeddings=False)
N = TORCHTITAN_LOSS_CHUNKS


def _head_unit(gc: GraphCosts) -> str:
    return next(u for u, nodes in gc.nodes.items() if any(n.kind is OpKind.CROSS_ENTROPY for n in nodes))


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 3])
def test_loop_sizes_in_closed_form(tp: int, batch: int) -> None:
    gc = GraphCosts(build_graph(LLAMA, batch=batch))
    loop = gc.loss_loop(_head_unit(gc), UnitStrategy(tp=tp, runtime=Runtime.TORCHTITAN), get_precision("bf16"))
    assert loop is not None
    hidden = batch * S * D  # replicated over TP into the output layer
    logits = batch * S * V / tp / N  # one chunk, vocabulary split over TP (loss parallelism)
    # bf16 output + fp32 accumulator; logits + fp32 log-probs + 1 (2 under loss parallelism) fp32
    # loss buffers + the logits' fp32 gradient
    assert loop.hidden == pytest.approx(hidden * (2 + 4))
    assert loop.chunk_loss == pytest.approx(logits * (2 + 4 * (2 + (2 if tp > 1 else 1))))
    assert loop.chunk_head_backward == pytest.approx(2 * logits * 2 + hidden / N * 2)
    assert loop.chunk_logits == pytest.approx(2 * logits)
    assert loop.weight_elems == pytest.approx(V * D / tp)


@pytest.mark.parametrize("runtime", [Runtime.TORCH, Runtime.MEGATRON])
def test_other_runtimes_have_no_loop(runtime: Runtime) -> None:
    gc = GraphCosts(build_graph(LLAMA, batch=2))
    assert gc.loss_loop(_head_unit(gc), UnitStrategy(runtime=runtime), get_precision("bf16")) is None


def test_no_logits_are_kept_for_backward() -> None:
    graph = build_graph(LLAMA, batch=2)
    loss = next(n for n in graph.nodes if n.kind is OpKind.CROSS_ENTROPY)
    kw = {"flash_attention": True, "recompute": Recompute.SELECTIVE}
    assert op_saved_items(loss, graph, 2, runtime=Runtime.TORCHTITAN, **kw) == []  # type: ignore[arg-type]
    kept = op_saved_items(loss, graph, 2, runtime=Runtime.TORCH, **kw)  # type: ignore[arg-type]
    assert sum(i.total_bytes for i in kept) == 2 * S * V * 4  # the fp32 log-probabilities
    cfg = {"dp": 4, "zero": 3, "precision": "bf16", "micro_batch": 2}
    titan, torch = (plan_memory(graph, ParallelConfig(**cfg, runtime=r)).stages[0]  # type: ignore[arg-type]
                    for r in (Runtime.TORCHTITAN, Runtime.TORCH))
    assert torch.activation_bytes_per_microbatch - titan.activation_bytes_per_microbatch == pytest.approx(2 * S * V * 4)


@pytest.mark.parametrize(("dp", "zero"), [(2, 3), (4, 3), (4, 2)])
@pytest.mark.parametrize("batch", [1, 4])
def test_the_peak_holds_the_loop_at_the_end_of_forward(dp: int, zero: int, batch: int) -> None:
    """One micro-batch: at the loop's last chunk the stage holds the states but the gradients, every
    saved tensor, the output layer gathered (bf16) and the loop: the hidden states and accumulator,
    and the largest of a chunk's loss, a chunk's output-layer backward and the last chunk's reduction
    (the fp32 unsharded gradient summed so far, FSDP's reduce buffer and the sharded output)."""
    graph = build_graph(LLAMA, batch=batch)
    st = plan_memory(graph, ParallelConfig(dp=dp, zero=zero, precision="bf16", micro_batch=batch,
                                           runtime=Runtime.TORCHTITAN)).stages[0]
    m = st.memory.bytes
    w = V * D + D  # the head unit's weights: output layer and final norm
    gathered, unsharded, sharded = 2 * w, 4 * w, 4 * w / dp
    hidden = batch * S * D
    logits = batch * S * V / N
    loop = hidden * 6 + max(14 * logits + unsharded,
                            4 * logits + hidden / N * 2 + unsharded + gathered,
                            2 * logits + 3 * unsharded + sharded)
    floor = m.model_states - m.gradients + st.activation_bytes_per_microbatch + gathered + loop
    assert st.peak_bytes >= floor * (1 - 1e-9)
    # and the logits are not counted whole: below the torch runtime's rules for the same plan plus
    # the loop (the torch runtime keeps the fp32 log-probabilities for the whole backward)
    torch = plan_memory(graph, ParallelConfig(dp=dp, zero=zero, precision="bf16", micro_batch=batch,
                                              runtime=Runtime.TORCH)).stages[0]
    assert st.activation_bytes_per_microbatch < torch.activation_bytes_per_microbatch


def test_later_micro_batches_find_the_reduced_gradients() -> None:
    """torchtitan reduces every micro-batch's gradients (no unsharded gradient outlives its unit), so a
    later micro-batch runs its forward with every sharded gradient made: the peak is at least the whole
    model states plus one micro-batch's saved tensors, and no unsharded gradient is held beyond that."""
    graph = build_graph(LLAMA, batch=2)
    one, four = (plan_memory(graph, ParallelConfig(dp=4, zero=3, precision="bf16", micro_batch=2,
                                                   num_microbatches=m, runtime=Runtime.TORCHTITAN)).stages[0]
                 for m in (1, 4))
    m4 = four.memory.bytes
    assert four.peak_bytes >= m4.model_states + four.activation_bytes_per_microbatch
    # what a later micro-batch adds over the only one is at most the gradients it finds made
    assert four.peak_bytes - one.peak_bytes <= m4.gradients * (1 + 1e-9)
    assert four.peak_bytes - one.peak_bytes > 0
