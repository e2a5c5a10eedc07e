"""The buffers a re-layout makes while its consumer runs (``conversion_buffer_bytes``), which the
ILP's forward moments count (parplan/solver/ilp/moments.py, ``received``).

Measured: a llama-tiny ILP plan on a 2x2 mesh (bench/ilp_plan_accuracy.py, 2026-11-28) computed the
LM head with its contraction split over one axis (partial sums) and the vocabulary over the other,
and its cross entropy on whole logits (512 tokens x 1,024 words, fp32: 2 MiB). At the step's peak
the tracker saw, besides the head's own output (1 MiB), an all-reduce's output (1 MiB), an
all-gather's (2 MiB) and the concatenation DTensor makes of it (2 MiB): 6 MiB of temporaries where
the ILP counted 1.5, the peak 7.5% above the prediction. The rule gives those buffers."""

from __future__ import annotations

from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.resharding import conversion_buffer_bytes

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
