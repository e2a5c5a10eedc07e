"""Exports: a plan document written as the configuration and launch line of the trainer it is for.

One module per target, each pinned to a stated version of its project (``VERSIONS``):
Megatron-LM arguments and ``torchrun`` lines, a torchtitan job, a DeepSpeed ``ds_config.json``,
Galvatron's strategy JSON, nanotron's YAML config, and parplan's own plan file for the validation agent. A plan a target
cannot run raises :class:`NotExpressibleError` naming every reason (never an approximation).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable, Mapping
from typing import Any, cast

from parplan.exports.common import Export, NotExpressible, NotExpressibleError, context_of, unwritten_features

__all__ = ["EXPORT_TARGETS", "Export", "NotExpressible", "NotExpressibleError", "export_plan"]

#: Targets that have an export (``any`` is not one: it names no trainer).
EXPORT_TARGETS = ("megatron", "torchtitan", "deepspeed", "galvatron", "nanotron", "parplan")


def _parplan(doc: Mapping[str, Any]) -> Export:
    """The plan document itself: what ``POST /v1/plans/{id}/validations`` hands the agent."""
    ctx = context_of(doc)
    if not isinstance(doc.get("strategy"), Mapping):
        raise NotExpressibleError("parplan", ["the document has no strategy (an infeasible request has no plan)"])
    notes = [f"run and measure it on one machine with {ctx.gpus} GPUs: the launch line (per-operator plans run as "
             "planned; uniform ones shrunk when the model is too large)",
             "or through the service: POST /v1/plans/{id}/validations, then `parplan agent --server URL --token T` "
             "on the machine with the GPUs"]
    launch = [f"parplan validate --plan parplan_plan.json --device cuda --max-procs {ctx.gpus}"]
    return Export("parplan", _own_version(), {"parplan_plan.json": json.dumps(dict(doc), indent=2) + "\n"}, launch,
                  notes)


def _own_version() -> str:
    from parplan.solver import SOLVER_VERSION

    return SOLVER_VERSION


def _exporter(target: str) -> Callable[[Mapping[str, Any]], Export]:
    """The export function of ``target`` (each module is imported on first use)."""
    if target == "parplan":
        return _parplan
    if target not in EXPORT_TARGETS:
        raise NotExpressibleError(target, [f"unknown export target {target!r}; known: {', '.join(EXPORT_TARGETS)}"])
    module = importlib.import_module(f"parplan.exports.{target}")
    return cast(Callable[[Mapping[str, Any]], Export], getattr(module, f"export_{target}"))


def export_plan(doc: Mapping[str, Any], target: str) -> Export:
    """The plan document ``doc`` written for ``target`` (NotExpressibleError when it cannot be)."""
    if not isinstance(doc, Mapping):
        raise NotExpressibleError(target, ["expected a plan document (a JSON object)"])
    export = _exporter(target)
    model = doc.get("model")
    arch = model.get("architecture") if isinstance(model, Mapping) else None
    unwritten = unwritten_features(arch if isinstance(arch, Mapping) else None, target) if target != "parplan" else []
    if unwritten:
        raise NotExpressibleError(target, unwritten)
    try:
        return export(doc)
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError) as e:
        # a hand-edited or truncated document: say which part, never a traceback
        raise NotExpressibleError(target, [f"the plan document is malformed ({type(e).__name__}: {e})"]) from None
