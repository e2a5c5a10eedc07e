"""What every import shares: the configuration a user already runs, read back as parplan's model,
strategy and batch, with every setting that was not used said out loud.

An import never guesses: a setting that changes memory or time and that parplan does not model is
an error naming it (:class:`ImportProblemError`); a setting it does not know is listed in ``unknown``; a
known one that does not change the prediction (data paths, learning rates, logging) in ``ignored``;
what the trainer itself would change or fill in (its defaults for what the file leaves out, its own
corrections, a GPU count the caller overrides) in ``adjusted``, one sentence each.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from parplan.solver.cost.plan_evaluator import LayerPlan
from parplan.solver.errors import ConfigError, SolverError
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig

#: What ``--from`` accepts.
IMPORT_KINDS = ("megatron-args", "ds-config", "torchtitan-config", "galvatron-config", "nanotron-config")


class ImportProblemError(ConfigError):
    """A trainer configuration parplan cannot price as written; ``problems`` lists each reason."""

    def __init__(self, kind: str, problems: list[str]) -> None:
        self.kind = kind
        self.problems = problems
        super().__init__(f"{kind}: " + "; ".join(problems))


@dataclass(frozen=True)
class Imported:
    """A trainer's configuration as parplan reads it. ``gpus``/``gpus_per_node``: from the file
    when it says (a launch line), else None (the caller's cluster)."""

    kind: str
    model: ModelSource | None  # None: the file does not describe the model (DeepSpeed)
    strategy: ParallelConfig
    seq_len: int | None
    gpus: int | None = None
    gpus_per_node: int | None = None
    target: str = "any"  # the planning target of the same trainer (for --suggest)
    unknown: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)  # what the trainer holds beyond the prediction
    adjusted: list[str] = field(default_factory=list)  # the trainer's defaults and corrections, said

    def report(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "unknown": list(self.unknown),
                "ignored": list(self.ignored), "unpriced": list(self.unpriced), "adjusted": list(self.adjusted)}


@dataclass(frozen=True)
class LayerImport:
    """A per-layer configuration (Galvatron's) as parplan reads it: a strategy per block."""

    kind: str
    model: ModelSource
    plan: LayerPlan
    seq_len: int | None
    gpus: int
    gpus_per_node: int | None = None
    target: str = "galvatron"
    unknown: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    unpriced: list[str] = field(default_factory=list)
    adjusted: list[str] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {"kind": self.kind, "target": self.target, "unknown": list(self.unknown),
                "ignored": list(self.ignored), "unpriced": list(self.unpriced), "adjusted": list(self.adjusted)}


def json_object(kind: str, text: str) -> Mapping[str, Any]:
    """The JSON object a configuration file holds (ImportProblemError when it is not one)."""
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as e:
        raise ImportProblemError(kind, [f"not JSON: {e.msg} at line {e.lineno}"]) from None
    if not isinstance(cfg, Mapping):
        raise ImportProblemError(kind, ["expected a JSON object"])
    return cfg


def world_size(kind: str, nodes: int | None, procs_per_node: int | None, gpus: int | None) -> int:
    """The GPU count: a launch line's nodes x processes when it says, else ``gpus``."""
    world = nodes * procs_per_node if nodes and procs_per_node else gpus
    if world is None:
        raise ImportProblemError(kind, ["the GPU count: give --gpus (the arguments have no torchrun line)"])
    return world


@contextmanager
def refusals_as_problems(kind: str) -> Iterator[None]:
    """A model or strategy the solver refuses as read becomes an import problem with the solver's reason."""
    try:
        yield
    except ImportProblemError:
        raise
    except SolverError as e:
        raise ImportProblemError(kind, [str(e)]) from None
