"""The DP search's tables: a unit's costs under every strategy, a stage's per-block costs, and a
candidate (pipeline degree, micro-batch count, partition) with its stages' solutions."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from parplan.solver.cost.plan_evaluator import LayerStrategy
from parplan.solver.dp.dynamic import StageSolution


@dataclass
class StageTables:
    """Per-block costs of one stage under every strategy (rows: blocks in order)."""

    blocks: list[str]
    time: np.ndarray  # [L, S] seconds per step
    mem: np.ndarray  # [L, S] bytes
    temp: np.ndarray  # [L, S] bytes
    relayout: np.ndarray  # [L-1, S] seconds per step to enter each block in a new layout
    keys: list[int]  # layout class of each strategy
    microbatch: np.ndarray  # [L, S] of ``time``: seconds per micro-batch (the rest is once per step)


@dataclass
class UnitRow:
    """One unit under every strategy: seconds per step, model-state bytes, activation bytes of
    one micro-batch, temporary bytes, re-layout seconds per step to enter it."""

    time: np.ndarray
    states: np.ndarray
    act: np.ndarray
    temp: np.ndarray
    relayout: np.ndarray
    root: np.ndarray  # parameter elements outside the blocks (ZeRO-3 keeps them gathered)
    largest: np.ndarray  # the largest parameter tensor's elements
    microbatch: np.ndarray  # of ``time``: seconds of one micro-batch (forward, backward, recompute, TP)
    #: a block's all-gather output buffer that stays until the forward ends (FSDP2), bytes
    gather_buffer: np.ndarray


@dataclass
class Candidate:
    pp: int
    m: int
    partition: tuple[int, ...]
    solutions: list[tuple[StageSolution, float, int]] = field(default_factory=list)  # (solution, unit bytes, τ units)
    strategies: list[LayerStrategy] = field(default_factory=list)
