"""The sizes the per-operator memory rules read (:mod:`.backward`, :mod:`.loss_loop`), whoever
lays the operators out: a per-unit strategy (:class:`~parplan.solver.cost.backward.UnitSizes`) or
one ILP candidate per operator."""

from __future__ import annotations

from typing import Protocol

from parplan.solver.ir import Node


class OpSizes(Protocol):
    """Per-device elements of the tensors around one operator, under some strategy."""

    def output(self, n: Node) -> float:
        """``n``'s output as ``n`` makes it (whole where it leaves partial sums)."""

    def input(self, n: Node, position: int) -> float:
        """Input ``position`` as ``n`` reads it (a gathered copy where ``n`` needs one)."""

    def weight_grad(self, n: Node, position: int) -> float:
        """The gradient ``n``'s backward makes for its parameter input ``position``."""

    def sp_gather(self, n: Node) -> float:
        """A sequence-parallel norm's output gathered whole for backward, 0 for other operators."""

    def class_shards(self, n: Node) -> int:
        """Pieces a loss's logits are cut into along their class dim (1 for other operators)."""

    def recomputed_bytes(self, n: Node) -> float:
        """Bytes ``n``'s backward rebuilds for itself first: the attention core's scores, softmax
        and dropout under selective recomputation without flash attention."""
