"""Imports: price the configuration a user already runs (``parplan memory --from KIND FILE``,
``POST /v1/evaluations``). One reader per trainer; each returns :class:`Imported` or raises
:class:`ImportProblemError` naming everything it cannot price."""

from __future__ import annotations

from parplan.imports.common import IMPORT_KINDS, Imported, ImportProblemError
from parplan.solver.models import ModelSource

__all__ = ["IMPORT_KINDS", "ImportProblemError", "Imported", "read_config"]


def read_config(kind: str, text: str, *, model: ModelSource | None = None, gpus: int | None = None,
                seq_len: int | None = None) -> Imported:
    """Read a trainer's configuration of kind ``kind`` (see :data:`IMPORT_KINDS`). ``model``,
    ``gpus`` and ``seq_len`` fill in what the file does not say (a file that says overrides them
    only where they are not given: a conflict is an error)."""
    if kind == "megatron-args":
        from parplan.imports.megatron import read_megatron_args

        imported = read_megatron_args(text, gpus)
        if gpus is not None and imported.gpus != gpus:
            raise ImportProblemError(kind, [f"the torchrun line starts {imported.gpus} processes, --gpus says {gpus}"])
        if model is not None:
            raise ImportProblemError(kind, ["the arguments describe the model; leave out --model"])
        return imported
    if kind == "ds-config":
        from parplan.imports.deepspeed import read_ds_config

        return read_ds_config(text, model, gpus, seq_len)
    if kind == "torchtitan-config":
        from parplan.imports.torchtitan import read_torchtitan_config

        return read_torchtitan_config(text, gpus)
    raise ImportProblemError(kind, [f"unknown kind; known: {', '.join(IMPORT_KINDS)}"])
