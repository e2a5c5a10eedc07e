"""The moment of a training step at which a pipeline stage holds the most memory, in bytes per
device: the largest of the step's moments (:mod:`.timeline`, the walk the ILP's moments come from
too), each unit's inner moments taken at their largest.

Adding every category's own peak over-predicts: the temporaries of backward (a gradient
workspace, FSDP's gathered weights and unsharded gradients, a recomputed block) peak after part of
the activations is already freed. Inside a unit, saved tensors are freed operator by operator
(:mod:`.backward`); a chunked loss's loop runs inside its unit's forward (:mod:`.loss_loop`). The
stage's other busy moment is the optimizer step (Adam's two temporaries the size of the largest
tensor, after the activations are freed), which the caller adds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parplan.solver.cost.backward import BackwardProfile
from parplan.solver.cost.loss_loop import LossLoop, loop_peak
from parplan.solver.cost.precision import Precision
from parplan.solver.cost.runtime import DataParallelBuffers
from parplan.solver.cost.timeline import NUMBERS, StepOptions, StepUnit, Tied, kept_between_microbatches, step_moments
from parplan.solver.cost.unit_strategy import UnitStrategy, local_elems
from parplan.solver.cost.units import GraphCosts, UnitCost


@dataclass(frozen=True)
class StageUnit:
    """One unit of the stage, in forward order: what the walk needs of it (bytes per device)."""

    name: str
    is_block: bool
    dp: DataParallelBuffers
    act_bytes: float  # saved for backward (the stage's shared buffers apart)
    profile: BackwardProfile
    forward_transient: float  # its forward's unsaved outputs at their most
    gathered_bytes: float  # every weight it uses, unsharded (what gathering holds)
    unsharded_grad_bytes: float  # every weight's gradient, unsharded
    own_param_bytes: float  # weights of parameters first used here (a stage's shared ones once)
    own_grad_bytes: float  # their gradients, a tied table's apart
    tied_user: bool = False  # it reads a parameter another unit of the stage reads
    loss_loop: LossLoop | None = None  # a chunked loss run by its forward (backward included)


@dataclass(frozen=True)
class StagePeak:
    above_resident: float  # one micro-batch's saved tensors + every temporary, at the busiest moment
    temporary: float  # the temporaries' own peak over the step (gathered weights, gradients, buffers)
    #: weights and gradients kept unsharded between micro-batches (pipelining with accumulation),
    #: :func:`~parplan.solver.cost.timeline.kept_between_microbatches`
    kept_weights: float = 0.0
    kept_grads: float = 0.0


def stage_unit(name: str, costs: GraphCosts, strategy: UnitStrategy, cost: UnitCost, is_block: bool,
               dp: DataParallelBuffers, prec: Precision, seen: set[str], tied_ids: set[str]) -> StageUnit:
    """The walk's view of one unit priced by :class:`~parplan.solver.cost.units.GraphCosts`;
    ``seen`` collects the parameters units before it used (each counted once)."""
    own = [p for p in costs.params[name] if p.id not in seen]
    seen.update(p.id for p in own)
    own_elems = sum(local_elems(p, strategy) for p in own)
    untied = sum(local_elems(p, strategy) for p in own if p.id not in tied_ids)
    return StageUnit(name, is_block, dp, cost.act_bytes, costs.backward_profile(name, strategy, prec),
                     costs.forward_transient(name, strategy, prec), cost.param_gathered_bytes,
                     cost.param_elems_all * prec.grad_bytes, own_elems * prec.param_bytes, untied * prec.grad_bytes,
                     any(p.id in tied_ids for p in costs.params[name]), costs.loss_loop(name, strategy, prec))


def stage_peak(units: Sequence[StageUnit], prec: Precision, shared_act_bytes: float, tied_elems: float,
               tied_workspace_elems: float, accumulating: bool = False, pipelined: bool = False,
               created_grads: Sequence[float] | None = None, shared_grads: float = 0.0,
               later_microbatches: bool = False, transient_grads: bool = False) -> StagePeak:
    """The busiest moment of one micro-batch's forward and backward through ``units`` (forward
    order), above the resident model states and the other micro-batches in flight.

    ``shared_act_bytes``: saved tensors several units share, freed only at the end;
    ``tied_elems``: local elements of parameters two units of the stage use (a tied embedding);
    ``tied_workspace_elems``: the gradient elements the first user's backward makes for them;
    ``accumulating``, ``pipelined``, ``created_grads`` (bytes per unit), ``shared_grads``,
    ``later_microbatches``, ``transient_grads``: how the step runs
    (:func:`~parplan.solver.cost.timeline.step_moments`)."""
    walked = [_numeric(u, created_grads[i] if created_grads is not None else 0.0, prec) for i, u in enumerate(units)]
    tied = None
    if tied_elems:
        grads = tied_elems * prec.grad_bytes
        gathers = any(u.dp.gathers for u in units if u.tied_user)  # accumulation keeps it unsharded then
        tied = Tied(grads, tied_workspace_elems * prec.grad_bytes, grads if gathers else 0.0)
    options = StepOptions(accumulating, pipelined, created_grads, shared_grads, later_microbatches, transient_grads)
    above = temporary = 0.0
    for m in step_moments(NUMBERS, walked, shared_act_bytes, tied, options):
        above = max(above, m.total(NUMBERS))
        temporary = max(temporary, m.temporaries(NUMBERS))
    return StagePeak(above, temporary, *kept_between_microbatches(NUMBERS, walked, tied, options))


def _numeric(u: StageUnit, created_grads: float, prec: Precision) -> StepUnit[float]:
    """``u`` as the walk's unit: one inner moment per phase, the unit's largest."""
    # (but a chunked loss's weight gradient, reduced inside forward)
    looped = u.loss_loop.weight_elems * prec.grad_bytes if u.loss_loop is not None else 0.0
    extra = u.forward_transient
    if u.loss_loop is not None:
        extra = max(extra, loop_peak(u.loss_loop, u.dp, u.gathered_bytes, u.unsharded_grad_bytes, created_grads))
    p = u.profile
    return StepUnit(u.is_block, u.dp, u.tied_user, u.act_bytes, u.gathered_bytes, u.unsharded_grad_bytes,
                    u.own_param_bytes, u.own_grad_bytes, max(0.0, u.own_grad_bytes - looped), lambda: (extra,),
                    lambda unsharded: ((p.peak_unsharded, p.transient_peak_unsharded) if unsharded
                                       else (p.peak, p.transient_peak),))
