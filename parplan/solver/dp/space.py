"""The per-layer decision tree (Galvatron-BMW): what one block may do inside its pipeline stage.

Pipeline parallelism is decided first (stages across device islands). Inside a stage of ``n``
devices a block picks a TP degree ``t`` and DP degree ``d = n / t`` (equal group sizes; powers of
two, or every divisor when ``n`` is not a power of two), the nesting order when both exceed 1 (TP
ranks consecutive, or DP ranks consecutive), the kind of data parallelism (plain DP, ZeRO-1/2, or
sharded DP = ZeRO-3), activation checkpointing on or off, sequence parallelism with TP, and for MoE
blocks an expert-parallel degree dividing ``d``.

Context parallelism (CP) is decided with the pipeline, for the whole model: a stage of ``n``
devices with CP degree ``c`` gives each block ``n / c`` devices to split into TP x DP as above, and
the ``c`` context-parallel ranks join the DP ranks in holding and reducing the weights (ZeRO is
offered whenever ``d x c > 1``). CP degrees are powers of two dividing the stage's devices, with
``2·c`` dividing the sequence and at least ``cp_min_tokens`` tokens per rank. With CP a block
picks its attention's exchange too: the p2p ring, or all-to-alls (where ``t·c`` divides the heads).

With Galvatron's options (plain DP or SDP, no sequence parallelism) 8 devices give 22 strategies
over all pipeline degrees, 44 with checkpointing (their paper's count).
"""

from __future__ import annotations

from dataclasses import dataclass

from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.plan_evaluator import LayerStrategy
from parplan.solver.strategy import SplitDims


@dataclass(frozen=True)
class SpaceOptions:
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    checkpointing: bool = True  # offer full recomputation next to the lighter one (none or selective)
    sequence_parallel: str = "always"  # "always" with TP, "choice" (both), or "never"
    both_orders: bool = True
    expert_parallel: tuple[int, ...] = (1,)
    max_tp: int | None = None  # e.g. the devices of a node
    max_cp: int = 32  # context-parallel degrees offered: powers of two up to this (1: no CP)
    cp_comm: tuple[str, ...] = ("p2p", "a2a")  # attention's exchanges offered with CP (per block)
    #: the fewest tokens of a sequence one context-parallel rank may hold: below it a ring step's
    #: attention is too short to hide the key/value transfer, and CP only adds traffic
    cp_min_tokens: int = 8192


GALVATRON = SpaceOptions(zero_stages=(0, 3), checkpointing=False, sequence_parallel="never", max_cp=1)


def degrees(n: int) -> list[int]:
    """TP (or DP) degrees for ``n`` devices: powers of two dividing it, every divisor otherwise."""
    if n & (n - 1) == 0:
        return [1 << k for k in range(n.bit_length())]
    return [d for d in range(1, n + 1) if n % d == 0]


def context_degrees(n: int, seq_len: int, opts: SpaceOptions) -> list[int]:
    """CP degrees to offer on stages of ``n`` devices for sequences of ``seq_len`` tokens (1 first)."""
    out = [1]
    c = 2
    while c <= min(opts.max_cp, n) and n % c == 0 and seq_len % (2 * c) == 0 and seq_len // c >= opts.cp_min_tokens:
        out.append(c)
        c *= 2
    return out


def layer_strategies(n: int, opts: SpaceOptions, moe: bool = False, cp: int = 1,
                     light: Recompute = Recompute.SELECTIVE, splits: SplitDims | None = None,
                     heavier: tuple[Recompute, ...] = (Recompute.FULL,)) -> list[LayerStrategy]:
    """Every distinct strategy of one block on a stage of ``n`` devices with context-parallel degree
    ``cp``; its recomputation ``light`` or, with ``opts.checkpointing``, those ``heavier``
    (:func:`~parplan.solver.cost.rules.search_recomputes`: per-operator where the runtime runs it,
    full). ``splits``: the model's dims, whose rule (:class:`~parplan.solver.strategy.SplitDims`) every
    TP, sequence-parallel and expert degree offered obeys (a TP degree whose sequence split does not
    divide is offered without sequence parallelism)."""
    rule = splits or SplitDims(())
    out: list[LayerStrategy] = []
    recomputes = (light, *heavier) if opts.checkpointing else (light,)
    if n % cp:
        return out
    n //= cp
    for t in degrees(n):
        if (opts.max_tp is not None and t > opts.max_tp) or not rule.allows(t):
            continue
        d = n // t
        zeros = opts.zero_stages if d * cp > 1 else (0,)
        orders = (True, False) if (t > 1 and d > 1 and opts.both_orders) else (True,)
        with_sp = t > 1 and rule.allows(t, sp=True)
        sps = {"always": (with_sp,), "never": (False,), "choice": (False, True) if with_sp else (False,)}[
            opts.sequence_parallel]
        eps = [e for e in (opts.expert_parallel if moe else (1,)) if d % e == 0 and rule.allows(ep=e)]
        for z in zeros:
            for order in orders:
                for sp in sps:
                    for e in eps:
                        for rc in recomputes:
                            for comm in opts.cp_comm if cp > 1 else ("p2p",):
                                out.append(LayerStrategy(tp=t, dp=d, zero=z, sp=sp, recompute=rc, tp_inner=order,
                                                         ep=e, cp=cp, cp_comm=comm))
    return out


def count_strategies(devices: int, opts: SpaceOptions) -> int:
    """Strategies over every pipeline degree (a power of two dividing the devices, or a divisor)."""
    return sum(len(layer_strategies(devices // pp, opts)) for pp in degrees(devices))
