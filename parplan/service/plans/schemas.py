"""Wire shapes of plan requests and plans (docs/design.md, "HTTP API")."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from parplan.service.catalog.names import GpuName, PrecisionName, PresetName
from parplan.service.jobs.schemas import JobOut

_STRICT = ConfigDict(extra="forbid", strict=True)
#: The least device memory or budget a request may name (1 MiB; less is no device).
MIN_MEMORY_GIB = 2**-10


class ModelSpec(BaseModel):
    """Exactly one of ``preset`` (see ``GET /v1/models``), ``hf_config`` (a Hugging Face
    ``config.json``) or ``graph`` (the ``parplan.graph/v1`` wire format)."""

    model_config = _STRICT

    preset: PresetName | None = Field(default=None, examples=["gpt-1.7b"])
    hf_config: dict[str, Any] | None = None
    graph: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSpec:
        given = [k for k in ("preset", "hf_config", "graph") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of preset, hf_config, graph")
        return self

    def to_body(self) -> dict[str, Any]:
        return {k: v for k, v in (("preset", self.preset), ("hf_config", self.hf_config), ("graph", self.graph))
                if v is not None}


class ClusterSpec(BaseModel):
    model_config = _STRICT

    gpus: int = Field(ge=1, description="Number of devices.", examples=[8])
    gpus_per_node: int | None = Field(default=None, ge=1, description="Default: the GPU preset's.")
    gpu: GpuName = Field(default="A100-80GB", description="GET /v1/clusters/presets")
    gpu_memory_gib: float | None = Field(default=None, ge=MIN_MEMORY_GIB, le=2**20,
                                         description="Override the device memory.")


class TrainingSpec(BaseModel):
    model_config = _STRICT

    global_batch: int | None = Field(default=None, ge=1, description="Samples per step (default: the GPU count).")
    seq_len: int | None = Field(default=None, ge=1, description="Tokens per sample (default: the model's).")
    micro_batch: int | None = Field(default=None, ge=1, description="Default: searched.")
    precision: PrecisionName = "bf16"


class ObjectiveSpec(BaseModel):
    model_config = _STRICT

    kind: Literal["min-memory", "max-throughput"] = "min-memory"
    alpha: float | None = Field(default=None, ge=0, le=1e12,
                                description="GiB of memory one second of step time is worth.")
    max_slowdown: float = Field(default=0.1, ge=0, le=1e6, description="min-memory: at most this much slower than "
                                "the fastest plan that fits.")
    memory_budget_gib: float | None = Field(default=None, ge=MIN_MEMORY_GIB, le=2**20,
                                            description="Memory each device may use.")


class PlanRequestIn(BaseModel):
    """A plan request. Unknown fields are rejected (they would silently not count)."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra={"examples": [
        {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 8, "gpu": "A100-80GB"},
         "training": {"global_batch": 16, "seq_len": 2048}, "objective": {"kind": "min-memory"}}]})

    model: ModelSpec
    cluster: ClusterSpec
    training: TrainingSpec | None = None
    objective: ObjectiveSpec | None = None
    search: Literal["auto", "ilp", "dp"] = "auto"
    time_limit: float | None = Field(default=None, gt=0, le=3600, description="Search time limit (seconds); at "
                                      "most the service's PARPLAN_MAX_TIME_LIMIT_SECONDS.")
    mesh: list[int] | None = Field(default=None, min_length=1, max_length=3,
                                   description="Fix the ILP's device mesh: axis sizes, outermost first, whose "
                                   "product is the GPU count (default: searched).", examples=[[2, 4]])
    pareto: bool = Field(default=False, description="The DP's whole memory vs step-time frontier in `pareto` "
                         "(slower); without it the frontier holds only the plans the search needed.")
    target: Literal["any", "megatron", "torchtitan", "deepspeed", "galvatron", "parplan"] = Field(
        default="any", description="The trainer the plan is for: the search keeps to what it runs, prices its "
        "buffers and compares with its own baseline (`target` in the plan); `any` searches everything.")

    def to_body(self) -> dict[str, Any]:
        """The request as the solver's ``parse_plan_request`` takes it (fields not given are left out)."""
        body: dict[str, Any] = {"model": self.model.to_body(),
                                "cluster": self.cluster.model_dump(exclude_unset=True)}
        if self.training is not None:
            body["training"] = self.training.model_dump(exclude_unset=True)
        if self.objective is not None:
            body["objective"] = self.objective.model_dump(exclude_unset=True)
        if "search" in self.model_fields_set:
            body["search"] = self.search
        if self.time_limit is not None:
            body["time_limit"] = self.time_limit
        if self.mesh is not None:
            body["mesh"] = list(self.mesh)
        if self.pareto:
            body["pareto"] = True
        if self.target != "any":
            body["target"] = self.target
        return body


class PlanOut(BaseModel):
    """A plan: the solver's document (the keys of ``parplan plan --json``) plus ``id`` and
    ``created_at``."""

    model_config = ConfigDict(extra="allow")

    id: uuid.UUID
    created_at: datetime
    model: dict[str, Any] | None = None
    cluster: dict[str, Any] | None = None
    strategy: dict[str, Any] | None = None
    memory: dict[str, Any] | None = None
    time: dict[str, Any] | None = None
    baselines: dict[str, Any] | None = None
    solver: dict[str, Any] | None = None


class PlanSubmitted(BaseModel):
    """202: the job (poll its URL). 200: ``cached`` is true and ``plan`` is the finished plan."""

    job: JobOut
    plan: PlanOut | None = None
    cached: bool = False


class ExportOut(BaseModel):
    """A plan written for one trainer (``GET /v1/plans/{id}/export``): file name -> text, the launch
    commands (one per node where they differ) and what the user still has to add."""

    target: str
    version: str = Field(description="The trainer's version the files are written for.")
    files: dict[str, str]
    launch: list[str]
    notes: list[str]
