"""The buffers a re-layout makes while its consumer runs (``conversion_buffer_bytes``), which the
ILP's forward moments count (parplan/solver/ilp/terms.py, ``received``), and those converting the
gradient back in backward (``gradient_conversion_buffer_bytes``, ``gradient_conversions``).

Measured: a llama-tiny ILP plan on a 2x2 mesh (bench/ilp_plan_accuracy.py) computed the
LM head with its contraction split over one axis (partial sums) and the vocabulary over the other,
and its cross entropy on whole logits (512 tokens x 1,024 words, fp32: 2 MiB). At the step's peak
the tracker saw, besides the head's own output (1 MiB), an all-reduce's output (1 MiB), an
all-gather's (2 MiB) and the concatenation DTensor makes of it (2 MiB): 6 MiB of temporaries where
a rule without them counts 1.5. The rule gives those buffers."""

from __future__ import annotations

from parplan.agent.matrix import GPT_TINY
from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.layout import TensorLayout
from parplan.solver.cost.precision import get_precision
from parplan.solver.cost.resharding import conversion_buffer_bytes, gradient_conversion_buffer_bytes, misordered_axes
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.builder import build_graph
from parplan.solver.ilp import moments
from parplan.solver.ilp.problem import build_problem
from parplan.solver.ilp.search import mesh_links
from parplan.solver.ilp.strategies import Mesh

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
    """A tiny Llama's per-operator plan (tests/agent/test_validate_plan_file.py): the LM head
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
    """gpt-tiny's 2x2 min-memory ILP plan (bench/ilp_plan_accuracy.py): the LM head leaves
    its logits (2 MiB) partial over m0 and split by batch over m1; the loss reads them split by batch
    over m0 then m1. A device's quarter is not inside its half (the order of the axes indexes the
    pieces), so DTensor all-gathered over m1 (2 MiB), reduce-scattered over m0 (1 MiB) and sliced
    over m1 (0.5 MiB), all measured at the step's peak."""
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


def test_a_tied_table_sharded_by_its_owner_is_gathered_by_the_other_reader() -> None:
    """gpt-tiny's 4-way min-memory ILP plan: the embedding shards its table with ZeRO-3
    per operator, the LM head (ZeRO-0, batch split) reads the same table replicated, so the plan
    interpreter all-gathers the whole table (1,024 x 256 fp32: 1 MiB) for the head, forward and
    backward, although the two layouts are alike."""
    graph = build_graph(GPT_TINY, batch=4, seq_len=128)
    mesh = Mesh((("m0", 4),))
    cluster = make_cluster(4, 4, "A100-80GB")
    gp = build_problem(graph, mesh, mesh_links(cluster, mesh), cluster.gpu, DEFAULT_CALIBRATION, get_precision("fp32"),
                       1, Recompute.SELECTIVE, True, zero_stages=(0, 3), prune=False,
                       runtime=Runtime.INTERPRETER_CPU, zero3_per_operator=True)
    terms, _ = moments._terms_and_units(gp)

    def gathered_for_head(table_zero: int) -> float:
        choice = {}
        for rep, cands in gp.strategies.items():
            zero = table_zero if rep == gp.rep_of["embed.tokens"] else 0
            choice[rep] = next(k for k, s in enumerate(cands) if s.zero == zero
                               and all(d in (None, "batch") for d in s.assignment))
        return terms.converted_weights(graph.node("head.lm")).term().value(gp.problem, choice)

    assert gathered_for_head(3) == 1024 * 256 * 4
    assert gathered_for_head(0) == 0.0
