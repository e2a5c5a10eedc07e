"""Imports: price the configuration a user already runs (``parplan memory --from KIND FILE``,
``POST /v1/evaluations``). One reader per trainer; each returns :class:`Imported` or raises
:class:`ImportProblemError` naming everything it cannot price."""

from __future__ import annotations

import dataclasses
from typing import Any

from parplan.imports.common import IMPORT_KINDS, Imported, ImportProblemError, LayerImport
from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import Cluster
from parplan.solver.models import ModelSource

__all__ = ["IMPORT_KINDS", "ImportProblemError", "Imported", "LayerImport", "price", "read_config"]


def read_config(kind: str, text: str, *, model: ModelSource | None = None, gpus: int | None = None,
                seq_len: int | None = None, launch: str | None = None) -> Imported | LayerImport:
    """Read a trainer's configuration of kind ``kind`` (see :data:`IMPORT_KINDS`). ``model``,
    ``gpus`` and ``seq_len`` fill in what the file does not say (``gpus`` overrides a Megatron-LM
    launch line's count, said in the report's ``adjusted``; other conflicts are errors). ``launch``:
    the launch line of a Galvatron strategy file (its sequence parallelism, precision and flash
    attention flags)."""
    if kind == "megatron-args":
        from parplan.imports.megatron import read_megatron_args

        imported = read_megatron_args(text, gpus)
        if model is not None:
            raise ImportProblemError(kind, ["the arguments describe the model; leave out --model"])
        return imported
    if kind == "ds-config":
        from parplan.imports.deepspeed import read_ds_config

        return read_ds_config(text, model, gpus, seq_len)
    if kind == "torchtitan-config":
        from parplan.imports.torchtitan import read_torchtitan_config

        return read_torchtitan_config(text, gpus)
    if kind == "nanotron-config":
        from parplan.imports.nanotron import read_nanotron_config

        if model is not None:
            raise ImportProblemError(kind, ["the config describes the model; leave out --model"])
        return read_nanotron_config(text, gpus)
    if kind == "galvatron-config":
        from parplan.imports.galvatron import read_galvatron_config

        return read_galvatron_config(text, model, gpus, seq_len, launch)
    raise ImportProblemError(kind, [f"unknown kind; known: {', '.join(IMPORT_KINDS)}"])


def price(imported: Imported | LayerImport, cluster: Cluster,
          calibration: Calibration = DEFAULT_CALIBRATION) -> dict[str, Any]:
    """Memory per category and step time of an imported configuration (the keys of ``parplan
    memory --json``; a per-layer one as a per-layer plan document), plus ``import``."""
    assert imported.model is not None
    if isinstance(imported, LayerImport):
        from parplan.solver.cost.plan_evaluator import PlanEvaluator
        from parplan.solver.cost.units import GraphCosts
        from parplan.solver.result import ModelReport, per_layer_result

        model, seq = imported.model, imported.seq_len
        ev = PlanEvaluator(lambda b: GraphCosts(model.build(b, seq)), cluster, calibration)
        graph = model.build(1, seq)
        result = per_layer_result(imported.plan, ev, cluster, calibration)
        doc = dataclasses.replace(result, cluster=cluster, model=ModelReport(
            model.name, graph.parameter_count(), int(graph.meta.get("seq_len", 0) or seq or 0))).to_document()
    else:
        from parplan.solver.evaluate import evaluate

        doc = evaluate(imported.model, cluster, imported.strategy, seq_len=imported.seq_len,
                       calibration=calibration).to_dict()
    arch = imported.model.architecture()
    if arch is not None:  # so that `parplan export` can write the configuration priced
        doc["model"]["architecture"] = arch
    doc["import"] = imported.report()
    return doc
