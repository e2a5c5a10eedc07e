"""The ILP's memory peak: the step's moments (:mod:`parplan.solver.cost.timeline`, the walk the
whole-plan evaluator's peak comes from too) over linear expressions of the operators' strategies
(:mod:`.terms`), and ``T ≥ moment`` for each.

Each unit gives the walk one inner moment per operator rather than its largest: forward, at every
operator, the operator's unsaved outputs still to be read, the buffers converting its inputs to the
layouts it reads them in (the agent's plan interpreter) and, per operator under ZeRO-3, its
gathered weights; backward, at every operator (last unit first), the saved tensors not freed yet,
the operator's gradients and the unit's ZeRO-3 weight gradients so far, and once an operator's
backward has run, its input gradients converted back to their producers' layouts. A unit that does
not gather under a candidate adds zeros: every unit is walked as FSDP runs it. Adam's update comes
after the walk.

The ILP's plans run one pipeline stage (no pipelining), on runtimes that keep gradients between
steps and do not chunk the loss (torchtitan's trainer, which does both, is planned by the uniform
search only): no gradients made in backward, no loss loop. With several micro-steps on a runtime
whose FSDP2 skips the reduce-scatter until the last (:meth:`Runtime.accumulates_unsharded`), the walk
accumulates (``StepOptions.accumulating``): every gathering unit's unsharded gradients are kept from
the first micro-step's backward to the last's, and a tied table's local gradient wherever any unit
reading it gathers, as the evaluator keeps it; that last is a product of the owner's strategy and an
OR over the readers' (a :class:`~parplan.solver.ilp.model.Gate`, linearised in the model).

Alike blocks share variables and hold the same terms apart from the activations of the units
before them, which only grow, and the buffers of their neighbours; of a run of alike blocks only
the first two and the last two are written. Memory in bytes per device.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from parplan.solver.cost.activations import Recompute, block_of, saved_items
from parplan.solver.cost.backward import BackwardProfile, alive_at_operators, freed_by_operator, rebuilt_in_backward
from parplan.solver.cost.peak import StageUnit, stage_peak
from parplan.solver.cost.pipeline import units_of
from parplan.solver.cost.runtime import FSDP, IN_PLACE
from parplan.solver.cost.timeline import Moment, StepOptions, StepUnit, Tied, step_moments
from parplan.solver.ilp.graph_problem import GraphProblem
from parplan.solver.ilp.model import AuxProblem, Gate, PeakTerm
from parplan.solver.ilp.terms import LINEAR, Lin, Terms, lin_sum
from parplan.solver.ir import Node


@dataclass
class _Detail:
    """A unit's per-operator figures (only the units whose moments are built, and the answer's walk,
    need them)."""

    # per operator (forward order), then per operator whose input gradients are converted back
    # to their producers' layouts (:meth:`Terms.gradient_conversions`), that conversion:
    alive: list[Lin]  # saved tensors alive then
    rebuilt_alive: list[Lin]  # the part of them recomputation rebuilt (temporary)
    transient: list[Lin]
    grads_after: list[Lin]  # ZeRO-3 weight gradients its backward has made before then
    forward_live: list[Lin]


@dataclass
class _Unit:
    """A unit as the step's walk sees it (:class:`~parplan.solver.cost.timeline.StepUnit`)."""

    name: str
    nodes: list[Node]
    is_block: bool
    reps: tuple[str, ...]  # the variable set of each operator (units alike share them)
    act: Lin  # saved tensors of the unit (the stage's shared ones apart)
    grads: Lin  # ZeRO-3 weight gradients of the whole unit
    grads_untied: Lin  # the same without a tied table's (outside the blocks: kept to the end of backward)
    gathered: Lin  # ZeRO-3 weights, unsharded
    build_detail: Callable[[], _Detail] = field(repr=False)
    tied_user: bool = False  # it reads a parameter another unit reads
    _detail: _Detail | None = field(default=None, repr=False)

    @property
    def detail(self) -> _Detail:
        """The per-operator figures, built on first use."""
        if self._detail is None:
            self._detail = self.build_detail()
        return self._detail

    def step(self) -> StepUnit[Lin]:
        """The unit as the walk sees it: every unit as FSDP runs it (zeros where it does not gather)."""
        return StepUnit(self.is_block, FSDP, self.tied_user, self.act, self.gathered, self.grads, self.gathered,
                        self.grads_untied, self.grads_untied, lambda: self.detail.forward_live, self._backward)

    def _backward(self, unsharded: bool) -> list[tuple[Lin, Lin]]:
        d = self.detail
        out = []
        for a, r, t, g in zip(d.alive, d.rebuilt_alive, d.transient, d.grads_after, strict=True):
            own, temp = a.add(t), r.add(t)
            out.append((own.add(g), temp.add(g)) if unsharded else (own, temp))
        return out


def accumulates(gp: GraphProblem) -> bool:
    """Whether the problem's plans keep unsharded gradients over their micro-steps (several of them,
    on a runtime whose FSDP2 reduces after the last only)."""
    return gp.ctx.microbatches > 1 and gp.ctx.runtime.accumulates_unsharded(False)


def walk_peak(gp: GraphProblem, choice: dict[str, int]) -> tuple[float, float]:
    """(bytes above the model states at the step's busiest moment, the temporaries' peak) of a
    choice, by the whole-plan evaluator's own walk (:func:`parplan.solver.cost.peak.stage_peak`)
    over every unit's figures at that choice, each unit gathering or not as the choice has it: the
    independent check of the ILP's moments."""
    at = stage_at(gp, choice)
    walked = stage_peak(at.units, gp.ctx.precision, at.shared_act, at.tied_elems, at.tied_workspace_elems,
                        accumulating=accumulates(gp))
    fixed = gp.problem.fixed_bytes
    return max(walked.above_resident, at.optimizer) + fixed, max(walked.temporary, at.optimizer) + fixed


@dataclass(frozen=True)
class StageAt:
    """The problem's units as :func:`~parplan.solver.cost.peak.stage_peak` takes them, at a choice."""

    units: list[StageUnit]
    shared_act: float
    tied_elems: float
    tied_workspace_elems: float
    optimizer: float  # Adam's temporaries at their largest


def stage_at(gp: GraphProblem, choice: dict[str, int]) -> StageAt:
    """Every unit's figures at ``choice``, each unit gathering (FSDP) where the choice gathers any of
    its weights."""
    terms, units = _terms_and_units(gp)
    problem = gp.problem

    def v(x: Lin) -> float:
        return x.term().value(problem, choice)

    tied, tied_workspace, _ = terms.tied(units)
    stage: list[StageUnit] = []
    for u in units:
        d = u.detail
        alive = [v(a) for a in d.alive]
        rebuilt = [v(a) for a in d.rebuilt_alive]
        trans = [v(t) for t in d.transient]
        grads = [v(g) for g in d.grads_after]
        profile = BackwardProfile(max(a + t for a, t in zip(alive, trans, strict=True)),
                                  max(a + t + g for a, t, g in zip(alive, trans, grads, strict=True)),
                                  max(r + t for r, t in zip(rebuilt, trans, strict=True)),
                                  max(r + t + g for r, t, g in zip(rebuilt, trans, grads, strict=True)))
        gathered = v(u.gathered)
        stage.append(StageUnit(u.name, u.is_block, FSDP if gathered > 0 else IN_PLACE, v(u.act), profile,
                               max((v(x) for x in d.forward_live), default=0.0), gathered, v(u.grads), gathered,
                               v(u.grads_untied), u.tied_user))
    grad_bytes = gp.ctx.precision.grad_bytes
    optimizer = max((v(terms.optimizer(n)) for u in units for n in u.nodes), default=0.0)
    return StageAt(stage, v(_shared_items(gp, terms)), v(tied) / grad_bytes, v(tied_workspace) / grad_bytes,
                   optimizer)


def add_moment_terms(gp: GraphProblem) -> None:
    """Replace the problem's memory terms by the step's moments: node memory keeps the model states
    only, edge memory moves into the moments, and ``T ≥`` every moment (see the module docstring)."""
    terms, units = _terms_and_units(gp)
    # only the moments that can be the largest are built (see _dominant_units)
    keep = _dominant_units(units)
    problem: AuxProblem = gp.problem
    for e in problem.edges:
        e.memory = None
    problem.peaks = ([m.total(LINEAR).term() for m in _moments(gp, terms, units, keep)]
                     + [o.term() for o in _optimizer(terms, units, keep)])
    gp.temporaries = temporary_terms


def temporary_terms(gp: GraphProblem) -> list[PeakTerm]:
    """The temporaries of every moment of the step (reported, not optimised), built on first use."""
    if "temporaries" not in gp.caches:
        terms, units = _terms_and_units(gp)
        gp.caches["temporaries"] = ([m.temporaries(LINEAR).term() for m in _moments(gp, terms, units)]
                                    + [o.term() for o in _optimizer(terms, units)])
    return gp.caches["temporaries"]  # type: ignore[no-any-return]


def _moments(gp: GraphProblem, terms: Terms, units: list[_Unit], keep: set[int] | None = None,
             options: StepOptions[Lin] | None = None) -> Iterator[Moment[Lin]]:
    """Every moment of the walk, as the ILP's plans run (``options`` None: see the module docstring),
    or only those of the units in ``keep`` (the others' are not built)."""
    if options is None:
        options = StepOptions(accumulating=accumulates(gp))
    tied, tied_workspace, users = terms.tied(units)
    kept = _tied_kept(gp, terms, units, users) if options.accumulating and users else Lin()
    both = Tied(tied, tied_workspace, kept) if users else None
    return step_moments(LINEAR, [u.step() for u in units], _shared_items(gp, terms), both, options, keep)


def _tied_kept(gp: GraphProblem, terms: Terms, units: list[_Unit], users: list[int]) -> Lin:
    """What accumulation keeps of a tied table's gradient: its local gradient at its owner's strategy
    while any unit reading the table gathers some weight (as the evaluator's walk keeps it,
    :func:`~parplan.solver.cost.peak.stage_peak`): a gate per owner, opened by every strategy under
    which a reading unit gathers."""
    opens: dict[str, set[int]] = {}
    for k in users:
        gathered = units[k].gathered
        assert not gathered.edges, "gathered weights depend on their owner's strategy only"
        for rep, vals in gathered.nodes.items():
            opens.setdefault(rep, set()).update(int(j) for j in np.flatnonzero(vals > 0))
    when = {rep: tuple(sorted(js)) for rep, js in opens.items() if js}
    if not when:
        return Lin()  # no reading unit ever gathers
    grads = terms.tied(units)[0]
    return Lin(gates={gp.problem.gate(Gate(rep, vals, when)): 1.0 for rep, vals in grads.nodes.items() if vals.any()})


def _optimizer(terms: Terms, units: list[_Unit], keep: set[int] | None = None) -> Iterator[Lin]:
    """Adam's update, after the activations are freed: its temporaries at each parameter's owner
    (of the units in ``keep``)."""
    for i, u in enumerate(units):
        for n in u.nodes if keep is None or i in keep else ():
            opt = terms.optimizer(n)
            if opt.nodes:
                yield opt


def _terms_and_units(gp: GraphProblem) -> tuple[Terms, list[_Unit]]:
    """The problem's terms and units, built once (building the moments and walking a choice use the
    same ones; they depend on the problem only)."""
    if "units" not in gp.caches:
        terms = Terms(gp)
        units = _units(gp, terms)
        for k in terms.tied(units)[2]:
            units[k].tied_user = True
        gp.caches["units"] = (terms, units)
    return gp.caches["units"]  # type: ignore[no-any-return]


def _units(gp: GraphProblem, terms: Terms) -> list[_Unit]:
    ctx = gp.ctx
    graph = ctx.graph
    act = ctx.precision.activation_bytes
    by_unit: dict[str, list[Node]] = {u: [] for u in units_of(graph)}
    for n in graph.nodes:
        if not n.is_leaf:
            by_unit.setdefault(n.layer or "", []).append(n)
    shared_keys = _shared_keys(gp)
    in_order: dict[str, list[Node]] = {}  # a unit's operators and graph inputs, in graph order
    for n in graph.nodes:
        if not n.is_parameter:
            in_order.setdefault(n.layer or "", []).append(n)
    every_saved = {it.key for n in graph.nodes if not n.is_leaf
                   for it in saved_items(graph, [n], act, flash_attention=ctx.flash_attention, recompute=ctx.recompute,
                                         runtime=ctx.runtime, fp8_inputs=ctx.precision.te_fp8)}
    out = []
    for name, nodes in by_unit.items():
        if not nodes:
            continue
        is_block = block_of(nodes[0]) is not None
        rebuilt, policy = rebuilt_in_backward(ctx.recompute, is_block)
        kept_keys = {it.key for it in saved_items(graph, nodes, act, flash_attention=ctx.flash_attention,
                                                   recompute=ctx.recompute, runtime=ctx.runtime,
                                                   fp8_inputs=ctx.precision.te_fp8)}
        unit_act = Lin()
        seen: set[str] = set()
        saver: dict[str, Node] = {}  # saved buffer -> the first operator of the unit that saves it
        for n in nodes:
            for it in saved_items(graph, [n], act, flash_attention=ctx.flash_attention, recompute=ctx.recompute,
                                  runtime=ctx.runtime, fp8_inputs=ctx.precision.te_fp8):
                saver.setdefault(it.key, n)
        for it in saved_items(graph, nodes, act, flash_attention=ctx.flash_attention, recompute=ctx.recompute,
                              runtime=ctx.runtime, fp8_inputs=ctx.precision.te_fp8):
            if it.key in seen or it.key in shared_keys:
                continue
            seen.add(it.key)
            unit_act = unit_act.add(terms.item(it.key, saver.get(it.key, nodes[0]), it))
        for n in nodes:
            unit_act = unit_act.add(terms.kept_copies(n))
        acc = lin_sum(terms.weight_grads(n, zero3_only=True) for n in nodes)
        untied = lin_sum(terms.weight_grads(n, zero3_only=True, skip=terms.tied_ids) for n in nodes)
        gathered = lin_sum(terms.gathered(n, ctx.precision.param_bytes) for n in nodes)

        detail = partial(_detail, terms, nodes, rebuilt, policy, kept_keys, shared_keys, in_order.get(name, []),
                         every_saved)
        out.append(_Unit(name, nodes, is_block, tuple(gp.rep_of[n.id] for n in nodes), unit_act, acc, untied,
                         gathered, detail))
    return out


def _detail(terms: Terms, nodes: list[Node], rebuilt: bool, policy: Recompute, kept_keys: set[str],
            shared_keys: set[str], in_order: list[Node], every_saved: set[str]) -> _Detail:
    """A unit's per-operator figures: ``nodes`` its operators, ``in_order`` with its graph inputs;
    ``rebuilt`` when its backward rebuilds tensors (``policy`` its inner recomputation, ``kept_keys``
    what it keeps from forward); ``shared_keys`` saved by several units; ``every_saved`` any unit's."""
    ctx = terms.gp.ctx
    graph, act = ctx.graph, ctx.precision.activation_bytes
    freed = freed_by_operator(LINEAR, nodes, graph, act, ctx.flash_attention, policy, ctx.runtime, shared_keys,
                              kept_keys if rebuilt else None, lambda n, it: terms.item(it.key, n, it),
                              ctx.precision.te_fp8)
    freed = [(mine.add(terms.kept_copies(n)), mine_r) for n, (mine, mine_r) in zip(nodes, freed, strict=True)]
    alive, rebuilt_alive, grads_after = alive_at_operators(
        LINEAR, freed, [terms.weight_grads(n, zero3_only=True) for n in nodes])
    transient = [terms.transient(n) for n in nodes]
    # once an operator's backward has run (its saved tensors freed, its weight gradients
    # made), the conversions of its input gradients back to their producers' layouts
    for k, n in enumerate(nodes):
        conv = terms.gradient_conversions(n)
        if not any(m.any() for m in conv.edges.values()):
            continue
        alive.append(alive[k - 1] if k else Lin())
        rebuilt_alive.append(rebuilt_alive[k - 1] if k else Lin())
        transient.append(terms.input_gradients(n).add(conv))
        grads_after.append(grads_after[k].add(terms.weight_grads(n, zero3_only=True)))
    return _Detail(alive, rebuilt_alive, transient, grads_after,
                   terms.forward_live(in_order, every_saved))


def _shared_keys(gp: GraphProblem) -> set[str]:
    ctx = gp.ctx
    savers: dict[str, set[str]] = {}
    by_unit: dict[str, list[Node]] = {}
    for n in ctx.graph.nodes:
        if not n.is_leaf:
            by_unit.setdefault(n.layer or "", []).append(n)
    for u, nodes in by_unit.items():
        for it in saved_items(ctx.graph, nodes, ctx.precision.activation_bytes, flash_attention=ctx.flash_attention,
                              recompute=ctx.recompute, runtime=ctx.runtime, fp8_inputs=ctx.precision.te_fp8):
            savers.setdefault(it.key, set()).add(u)
    return {k for k, us in savers.items() if len(us) > 1}


def _shared_items(gp: GraphProblem, terms: Terms) -> Lin:
    """Saved buffers several units save (freed only at the end)."""
    ctx = gp.ctx
    shared = _shared_keys(gp)
    out = Lin()
    seen: set[str] = set()
    for n in ctx.graph.nodes:
        if n.is_leaf:
            continue
        for it in saved_items(ctx.graph, [n], ctx.precision.activation_bytes, flash_attention=ctx.flash_attention,
                              recompute=ctx.recompute, runtime=ctx.runtime, fp8_inputs=ctx.precision.te_fp8):
            if it.key in shared and it.key not in seen:
                seen.add(it.key)
                out = out.add(terms.item(it.key, n, it))
    return out


def _dominant_units(units: list[_Unit]) -> set[int]:
    """The units whose moments can be the largest: in a run of blocks alike (same variables), the
    moments of a block hold the same terms as another's plus the activations of more units before,
    except near the ends of the run; keep the first two and the last two blocks of each run."""
    keep: set[int] = set()
    i = 0
    while i < len(units):
        j = i
        while j + 1 < len(units) and units[j + 1].is_block and units[i].is_block and _alike(units[i], units[j + 1]):
            j += 1
        keep.update({i, min(i + 1, j), max(i, j - 1), j})
        i = j + 1
    return keep


def _alike(a: _Unit, b: _Unit) -> bool:
    return a.reps == b.reps
