"""The cost model: memory per device by category and step time, in layers.

1. Primitives, one rule each: :mod:`.precision` (bytes per element of each kind of state),
   :mod:`.layout` (how a tensor is cut over mesh axes), :mod:`.collectives` (α-β time of ring
   collectives), :mod:`.compute` (FLOPs and roofline time of one operator), :mod:`.activations`
   (what an operator saves for backward, what recomputation drops), :mod:`.runtime` (buffers a
   training framework keeps that another frees), :mod:`.pipeline` (stages and in-flight
   micro-batches), :mod:`.memory` (the categories and redundant memory).
2. Rules of one operator and one parameter, shared by every search: :mod:`.rules` (model states
   under ZeRO, the optimizer step and its buffers, compute with recomputation, gradient-sync
   overlap).
3. Units: :mod:`.unit_strategy` (a unit's layout) and :mod:`.units` (a unit's costs under a
   per-unit strategy, priced once per distinct unit); :mod:`.backward` walks one unit's backward.
4. Whole plans (:mod:`.layer_plan`: a plan whose layers may each use their own strategy):
   pure pricing functions place its units (:mod:`.plan_structure`) and price a stage's memory
   (:mod:`.stage_memory`; :mod:`.peak` finds the moment of the step at which a stage holds the
   most), its time (:mod:`.stage_time`) and its data-parallel work (:mod:`.gradient_sync`);
   :mod:`.plan_evaluator` is the memo layer over them (:mod:`.memo`, keyed by :mod:`.price_keys`).
   Uniform strategies are the special case, :mod:`.plan_memory`, :mod:`.plan_time`.

The ILP's per-operator costs (:mod:`parplan.solver.ilp.costs`) are built from layers 1 and 2.
"""
