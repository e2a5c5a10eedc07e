"""Wire shapes of ``POST /v1/capacity`` and ``POST /v1/replan`` (docs/capacity.md). Each field
documents itself; the results are built in :mod:`parplan.service.capacity.service`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parplan.solver.request import (
    AS_INT,
    MAX_GLOBAL_BATCH,
    GpuName,
    ModelSpec,
    Objective,
    PositiveInteger,
    PrecisionName,
    Search,
    TargetName,
)

_STRICT = ConfigDict(extra="forbid")


class CapacityTraining(BaseModel):
    """The training job every cell plans: the same batch on every allocation."""

    model_config = _STRICT

    global_batch: Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH), AS_INT] = Field(
        description="Samples per step, the same on every allocation.")
    seq_len: PositiveInteger | None = Field(default=None, description="Tokens per sample (default: the model's).")
    micro_batch: PositiveInteger | None = Field(default=None, description="Default: searched.")
    precision: PrecisionName = "bf16"
    tokens: float = Field(gt=0, le=1e18, description="Tokens to train: time to train is tokens / tokens_per_second.")


class PoolIn(BaseModel):
    """One GPU type to allocate from."""

    model_config = _STRICT

    gpu: GpuName = Field(description="A GPU preset (GET /v1/clusters/presets).")
    gpus_per_node: PositiveInteger | None = Field(default=None, description="Default: the GPU preset's.")
    max_gpus: PositiveInteger = Field(description="The most GPUs of this type the sweep tries.")
    price_per_gpu_hour: float = Field(gt=0, le=1e6, description="Price of one GPU for one hour (any currency; "
                                      "`cost` and `budget` are in the same unit).")


class GoalIn(BaseModel):
    """What to pick: the cheapest allocation that trains by ``deadline_hours``, and/or the fastest
    whose cost is within ``budget``."""

    model_config = _STRICT

    deadline_hours: float | None = Field(default=None, gt=0, le=1e7)
    budget: float | None = Field(default=None, gt=0, le=1e15)


class CapacityIn(BaseModel):
    """``POST /v1/capacity``: one plan per pool and GPU count (docs/capacity.md, "GPU counts")."""

    model_config = _STRICT

    model: ModelSpec
    training: CapacityTraining
    target: TargetName = "any"
    pools: list[PoolIn] = Field(min_length=1, max_length=8)
    goal: GoalIn | None = None
    objective: Objective = Field(default="max-throughput", description="Each cell's plan objective.")
    search: Search = "auto"


class ReplanIn(BaseModel):
    """``POST /v1/replan``: the best plan on a new allocation that the plan's trainer can resume into."""

    model_config = _STRICT

    plan_id: str = Field(description="The plan the job runs now.")
    gpus: PositiveInteger | None = Field(default=None, description="The new GPU count.")
    nodes_lost: PositiveInteger | None = Field(default=None, description="Whole nodes lost (a failure: the "
                                               "checkpoint is the last one saved).")
    storage_gb_per_second: float = Field(default=10.0, gt=0, le=1e6, description="Aggregate checkpoint "
                                         "storage bandwidth, GB/s (10^9 bytes), for the save and the load.")
    checkpoint_interval_steps: PositiveInteger = Field(default=1000, description="Steps between checkpoint "
                                                       "saves; a failure loses half of it on average.")
    reshardable_optimizer: bool = Field(default=True, description="Megatron-LM: the checkpoint was saved with "
                                        "--dist-ckpt-optim-fully-reshardable (else its optimizer state reshards "
                                        "across DP only).")

    @model_validator(mode="after")
    def _one_allocation(self) -> ReplanIn:
        if (self.gpus is None) == (self.nodes_lost is None):
            raise ValueError("give exactly one of gpus and nodes_lost")
        return self


class SweepSubmitted(BaseModel):
    """202: the sweep's job; its progress counts cells, ``result_url`` is readable at once."""

    job: dict[str, Any]
    result_url: str


class CellOut(BaseModel):
    gpu: str
    gpus: int
    plan_id: str | None
    fits: bool | None
    step_seconds: float | None
    tokens_per_second: float | None
    scaling_efficiency: float | None
    time_to_train_hours: float | None
    cost: float | None
    status: Literal["pending", "done", "unsolvable", "failed", "cancelled"]
    error: str | None = None


class CapacityOut(BaseModel):
    """The capacity result (partial while ``complete`` is false)."""

    id: str
    status: str
    complete: bool
    cells: list[CellOut]
    fewest_gpus_that_fit: dict[str, int | None]
    cheapest_meeting_deadline: CellOut | None
    fastest_within_budget: CellOut | None
    frontier: list[CellOut]
    goal: dict[str, float | None] | None
    goal_met: bool | None
    note: str | None = None
