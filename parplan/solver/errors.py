"""Typed errors raised by the solver library (never sentinels)."""

from __future__ import annotations

from dataclasses import dataclass


class SolverError(Exception):
    """Base class of every error the solver library raises on bad input."""


@dataclass(frozen=True)
class GraphIssue:
    """One problem found in a graph: the node, the field within it, and what is wrong."""

    node: str | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"node {self.node!r}" if self.node is not None else "graph"
        return f"{where}, field {self.field!r}: {self.message}"


class GraphValidationError(SolverError):
    """A graph failed validation; ``issues`` lists every problem found (first 50)."""

    def __init__(self, issues: list[GraphIssue]) -> None:
        self.issues = issues[:50]
        head = "; ".join(str(i) for i in self.issues[:5])
        more = f" (+{len(issues) - 5} more)" if len(issues) > 5 else ""
        super().__init__(f"invalid graph: {head}{more}")


class UnknownModelError(SolverError):
    """A model name is neither a preset nor a readable graph / HF config file."""


class ConfigError(SolverError):
    """A model or cluster configuration is inconsistent (e.g. heads not dividing hidden)."""


class StrategyError(SolverError):
    """A parallel strategy does not fit the model or the cluster (e.g. TP not dividing heads)."""
