"""The buffers a re-layout makes while its consumer runs (``conversion_buffer_bytes``), which the
ILP's forward moments count (parplan/solver/ilp/moments.py, ``received``), and those converting the
gradient back in backward (``gradient_conversion_buffer_bytes``, ``gradient_conversions``).

Measured: a llama-tiny ILP plan on a 2x2 mesh (bench/ilp_plan_accuracy.py, 2026-11-28) computed the
LM head with its contraction split over one axis (partial sums) and the vocabulary over the other,
and its cross entropy on whole logits (512 tokens x 1,024 words, fp32: 2 MiB). At the step's peak
the tracker saw, besides the head's own output (1 MiB), an all-reduce's output (1 MiB), an
all-gather's (2 MiB) and the concatenation DTensor makes of it (2 MiB): 6 MiB of temporaries where
the ILP counted 1.5, the peak 7.5% above the prediction. The rule gives those buffers."""

from __future__ import annotations

from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.resharding import conversion_buffer_bytes, gradient_conversion_buffer_bytes, misordered_axes

MIB = 2**20
MESH = {"m0": 2, "m1": 2}
LOGITS = 2 * MIB  # 512 x 1,024 fp32, whole


def test_the_measured_logits_conversion() -> None:
    produced = TensorLayout(split=(("vocab", ("m1",)),), partial=("m0",))
    before, last = conversion_buffer_bytes(LOGITS, produced, TensorLayout(), MESH, leading_dim="batch")
    assert (before, last) == (1 * MIB + 2 * MIB, 2 * MIB)  # all-reduce, all-gather; the concatenation


def test_gathering_the_leading_dim_needs_no_concatenation() -> None:
    produced = TensorLayout(split=(("batch", ("m0",)),))
    assert conversion_buffer_bytes(LOGITS, produced, TensorLayout(), MESH, leading_dim="batch") == (0.0, LOGITS)
    produced = TensorLayout(split=(("vocab", ("m0",)),))
    assert conversion_buffer_bytes(LOGITS, produced, TensorLayout(), MESH, leading_dim="batch") == (LOGITS, LOGITS)


def test_reductions_slices_and_exchanges() -> None:
    partial = TensorLayout(partial=("m0",))
    assert conversion_buffer_bytes(LOGITS, partial, TensorLayout(), MESH, "batch") == (0.0, LOGITS)
    to_split = TensorLayout(split=(("seq", ("m0",)),))
    assert conversion_buffer_bytes(LOGITS, partial, to_split, MESH, "batch") == (0.0, LOGITS / 2)
    assert conversion_buffer_bytes(LOGITS, TensorLayout(), to_split, MESH, "batch") == (0.0, LOGITS / 2)
    other = TensorLayout(split=(("vocab", ("m0",)),))
    assert conversion_buffer_bytes(LOGITS, to_split, other, MESH, "batch") == (LOGITS / 2, LOGITS / 2)
    assert conversion_buffer_bytes(LOGITS, to_split, to_split, MESH, "batch") == (0.0, 0.0)


def test_the_measured_gradient_conversion_in_backward() -> None:
    """A tiny Llama's per-operator plan (tests/agent/test_validate_plan_file.py, 2026-11-28): the LM head
    leaves its logits partial over m1 (contraction split), the loss reads them split by sequence over
    m1. In backward DTensor brings the loss's gradient (0.5 MiB of 2 MiB) back to the head's layout,
    the partial axis replicated: an all-gather along the sequence (1 MiB) and its concatenation
    (1 MiB), measured at the step's peak with the gradient itself."""
    produced = TensorLayout(split=(("batch", ("m0",)),), partial=("m1",))
    needed = TensorLayout(split=(("batch", ("m0",)), ("seq", ("m1",))))
    assert gradient_conversion_buffer_bytes(LOGITS, produced, needed, (), MESH, "batch") == (1 * MIB, 1 * MIB)
    # the forward conversion (a reduce-scatter) makes one buffer, of the share
    assert conversion_buffer_bytes(LOGITS, produced, needed, MESH, "batch") == (0.0, LOGITS / 4)


def test_a_gradient_left_partial_is_reduced_into_the_producers_layout() -> None:
    """A column-parallel reader of a replicated input leaves its gradient partial over the axis it
    splits: all-reduced into a replicated producer (a new buffer), reduce-scattered into a split one."""
    whole = TensorLayout()
    assert gradient_conversion_buffer_bytes(LOGITS, whole, whole, ("m0",), MESH, "batch") == (0.0, LOGITS)
    split = TensorLayout(split=(("seq", ("m0",)),))
    assert gradient_conversion_buffer_bytes(LOGITS, split, whole, ("m0",), MESH, "batch") == (0.0, LOGITS / 2)
    # a gradient partial where the producer's output was partial too stays partial: nothing to do
    partial = TensorLayout(partial=("m0",))
    assert gradient_conversion_buffer_bytes(LOGITS, partial, whole, ("m0",), MESH, "batch") == (0.0, 0.0)
    # received as produced, no partial sums: no conversion either way
    assert gradient_conversion_buffer_bytes(LOGITS, split, split, (), MESH, "batch") == (0.0, 0.0)


def test_a_dim_split_again_in_another_order_is_gathered_first() -> None:
    """gpt-tiny's 2x2 min-memory ILP plan (bench/ilp_plan_accuracy.py, 2026-11-28): the LM head leaves
    its logits (2 MiB) partial over m0 and split by batch over m1; the loss reads them split by batch
    over m0 then m1. A device's quarter is not inside its half (the order of the axes indexes the
    pieces), so DTensor all-gathered over m1 (2 MiB), reduce-scattered over m0 (1 MiB) and sliced
    over m1 (0.5 MiB), all measured at the step's peak (+3.2% before this rule)."""
    produced = TensorLayout(split=(("batch", ("m1",)),), partial=("m0",))
    needed = TensorLayout(split=(("batch", ("m0", "m1")),))
    assert misordered_axes(produced, needed) == ("m1",)
    assert conversion_buffer_bytes(LOGITS, produced, needed, MESH, "batch") == (3 * MIB, MIB / 2)
    # nested orders need no gather: a half split again is sliced
    assert misordered_axes(TensorLayout(split=(("batch", ("m0",)),)), needed) == ()
    assert conversion_buffer_bytes(LOGITS, TensorLayout(split=(("batch", ("m0",)),)), needed, MESH,
                                   "batch") == (0.0, LOGITS / 4)
    # off the leading dim the gather is concatenated too, then the whole is sliced over m0 and m1
    seq = TensorLayout(split=(("seq", ("m1",)),))
    assert conversion_buffer_bytes(LOGITS, seq, TensorLayout(split=(("seq", ("m0", "m1")),)), MESH,
                                   "batch") == (2 * LOGITS + LOGITS / 2, LOGITS / 4)
