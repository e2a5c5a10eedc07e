"""A plan request: one model of its wire shape, validated once into the typed :class:`PlanRequest`.

:class:`PlanRequestIn` is the body of ``POST /v1/plans`` (the OpenAPI document publishes its JSON
Schema), what ``parplan plan`` builds from its flags, and what a queued job's stored request reads
back as. Its fields carry their bounds and defaults, each written once, here.
:meth:`PlanRequestIn.resolve` makes the checks no JSON Schema can state (the model reads, the GPUs
split into whole nodes, the mesh factors the cluster, the target runs the search, the GPU has the
precision's math) and builds the :class:`PlanRequest` the planner reads. The plan cache key is
hashed from that resolved request (:func:`request_hash`), so two bodies that differ only in
defaults written out or left out share it. Every error is a :class:`RequestError` naming the field
by its dotted location in the body.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    model_validator,
)

from parplan.solver import SOLVER_VERSION
from parplan.solver.calibration import DEFAULT_CALIBRATION, Calibration
from parplan.solver.cluster import GPU_PRESETS, Cluster, make_cluster
from parplan.solver.cost.precision import PRECISIONS
from parplan.solver.device_memory import allocated_budget_bytes
from parplan.solver.errors import ConfigError, SolverError
from parplan.solver.frontends.builder import check_seq_len
from parplan.solver.frontends.presets import PRESETS, get_preset
from parplan.solver.models import ModelSource, model_from_json
from parplan.solver.objective import DEFAULT_MAX_SLOWDOWN
from parplan.solver.request_defaults import DEFAULT_GPU as DEFAULT_GPU
from parplan.solver.request_defaults import DEFAULT_OPTIMIZER_OFFLOAD as DEFAULT_OPTIMIZER_OFFLOAD
from parplan.solver.request_defaults import DEFAULT_PRECISION as DEFAULT_PRECISION
from parplan.solver.request_defaults import DEFAULT_TIME_LIMIT_SECONDS as DEFAULT_TIME_LIMIT_SECONDS
from parplan.solver.strategy import data_parallel_degrees
from parplan.solver.targets import SPECS, Target, data_parallel_choices

Objective = Literal["min-memory", "max-throughput"]
Search = Literal["auto", "ilp", "dp"]

#: Most devices one request may plan for (a service may allow fewer: PARPLAN_MAX_DEVICES).
MAX_DEVICES = 1 << 17
#: Most samples per step one request may name.
MAX_GLOBAL_BATCH = 1 << 24
#: Least and most memory a request may name, GiB (a device or a budget): 1 MiB is no device.
MIN_MEMORY_GIB = 2**-10
MAX_MEMORY_GIB = 2**20
#: Most host memory one machine may have in a request, GiB.
MAX_HOST_MEMORY_GIB = 2**24
#: Longest search time limit one request may ask for, seconds (a service may allow less).
MAX_TIME_LIMIT_SECONDS = 3600



class RequestError(ConfigError):
    """A plan request field is invalid; ``field`` is its dotted location in the request body."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


# -- field types --------------------------------------------------------------------------------


def _integral(value: Any) -> Any:
    """JSON Schema counts ``3.0`` as an integer, so the request reads it as ``3`` (``3.5`` stays a
    float, which an integer field refuses)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: Read an integral float as its integer: the last metadata of an integer type, after its bounds
#: (``Annotated[int, Field(ge=1), AS_INT]``), so that the schema's integer carries them.
AS_INT = BeforeValidator(_integral)
#: An integer field: what JSON Schema's ``"type": "integer"`` accepts, integral floats included.
Integer = Annotated[int, AS_INT]
PositiveInteger = Annotated[int, Field(ge=1), AS_INT]


@cache
def gpu_names() -> tuple[str, ...]:
    """Each GPU preset's name, in upper and lower case, and its family's name (``H100``, ``h100``)
    when no other preset shares the family."""
    families: dict[str, list[str]] = {}
    for name in GPU_PRESETS:
        families.setdefault(re.sub(r"-\d+GB$", "", name), []).append(name)
    out: list[str] = []
    for name in GPU_PRESETS:
        out += [name, name.lower()]
    for family, members in families.items():
        if len(members) == 1 and family not in GPU_PRESETS:
            out += [family, family.lower()]
    return tuple(dict.fromkeys(out))


def _one_of(known: tuple[str, ...], what: str, listed: Any, label: str = "known") -> Any:
    """A validator that refuses a name not in ``known``, listing ``listed``."""
    def check(name: str) -> str:
        if name not in known:
            raise ValueError(f"unknown {what} {name!r}; {label}: {', '.join(listed)}")
        return name
    return AfterValidator(check)


GpuName = Annotated[str, _one_of(gpu_names(), "GPU", GPU_PRESETS, "known GPUs"), WithJsonSchema(
    {"type": "string", "enum": list(gpu_names()), "description": "A GPU preset (GET /v1/clusters/presets); "
     "lower case and the short name of a one-size family (h100) are accepted too."})]
PresetName = Annotated[str, _one_of(tuple(PRESETS), "model preset", PRESETS, "known presets"), WithJsonSchema(
    {"type": "string", "enum": list(PRESETS), "description": "A model preset (GET /v1/models)."})]
PrecisionName = Annotated[str, _one_of(tuple(PRECISIONS), "precision", PRECISIONS), WithJsonSchema(
    {"type": "string", "enum": list(PRECISIONS), "default": DEFAULT_PRECISION, "description": "Training "
     "precision: bf16 (Megatron-LM's default), bf16-grad16, bf16-states16 (every model state in bf16: DeepSpeed's "
     "bf16_master_weights_and_grads with bf16_optimizer_states), fp16, fp16-grad16, fp32, fp8 (Transformer "
     "Engine's FP8 recipe, delayed scaling), fp8-cs (the same with current scaling), fp8-grad16 and fp8-cs-grad16 "
     "(those with 16-bit gradients), fp8-pg, fp8-cs-pg, fp8-pg-grad16 and fp8-cs-pg-grad16 (those with "
     "Megatron-LM's --fp8-param-gather: FP8 weights only, gathered in FP8; target megatron only), or "
     "torchao's Float8 as torchtitan runs it (target torchtitan only): "
     "fp8-torchao (tensorwise), fp8-torchao-fsdp8 (the same with FSDP2's float8 all-gather) and "
     "fp8-torchao-rowwise; bf16, bf16-grad16, fp8 and fp8-grad16 with -remainders (Transformer Engine FusedAdam's "
     "store_param_remainders: the fp32 master as the bf16 weight and its 16-bit remainder, 2 bytes), -moments-bf16 "
     "(Adam's moments in bf16) or both (Megatron-LM's --use-precision-aware-optimizer; target megatron only); FP8 "
     "needs a GPU with FP8 math."})]
TargetName = Annotated[str, _one_of(tuple(t.value for t in Target), "target", [t.value for t in Target]),
                       WithJsonSchema({"type": "string", "enum": [t.value for t in Target], "default": "any"})]

_STRICT = ConfigDict(extra="forbid", strict=True)


# -- the wire shape -----------------------------------------------------------------------------


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

    def source(self) -> ModelSource:
        """The model this names, read (RequestError naming ``model.<kind>`` when it does not read)."""
        (kind, value), = self.to_body().items()
        try:
            if kind == "preset":
                cfg = get_preset(value)
                return ModelSource(cfg.name, config=cfg)
            return model_from_json(dict(value), name=str(value.get("name") or value.get("_name_or_path") or kind))
        except SolverError as e:  # (its context stays: a graph's issues name their nodes)
            raise RequestError(f"model.{kind}", str(e)) from None


class ClusterSpec(BaseModel):
    model_config = _STRICT

    gpus: Integer = Field(ge=1, le=MAX_DEVICES, description="Number of devices.", examples=[8])
    gpus_per_node: PositiveInteger | None = Field(default=None, description="Default: the GPU preset's.")
    gpu: GpuName = Field(default=DEFAULT_GPU, description="GET /v1/clusters/presets")
    gpu_memory_gib: float | None = Field(default=None, ge=MIN_MEMORY_GIB, le=MAX_MEMORY_GIB,
                                         description="Override the device memory.")
    host_memory_gib: float | None = Field(default=None, ge=MIN_MEMORY_GIB, le=MAX_HOST_MEMORY_GIB, description=(
        "Override one machine's host memory, which an offloaded optimizer must fit (default: the GPU preset's "
        "reference system)."))


class TrainingSpec(BaseModel):
    model_config = _STRICT

    global_batch: Annotated[int, Field(ge=1, le=MAX_GLOBAL_BATCH), AS_INT] | None = Field(
        default=None, description="Samples per step (default: the GPU count).")
    seq_len: PositiveInteger | None = Field(default=None, description="Tokens per sample (default: the model's).")
    micro_batch: PositiveInteger | None = Field(default=None, description=(
        "Samples per micro-batch of one data-parallel replica (default: searched). The searches then use only "
        "the data-parallel degrees dp with global_batch a multiple of micro_batch x dp; none: 422."))
    precision: PrecisionName = DEFAULT_PRECISION
    optimizer_offload: bool = Field(default=DEFAULT_OPTIMIZER_OFFLOAD, description=(
        "Targets megatron and deepspeed: when none of their strategies fits, try them with part of the "
        "optimizer's states and master weights on the host (Megatron-LM's --optimizer-offload-fraction 0.5 or 1, "
        "DeepSpeed's offload_optimizer)."))


class ObjectiveSpec(BaseModel):
    model_config = _STRICT

    kind: Objective = "min-memory"
    alpha: float | None = Field(default=None, ge=0, le=1e12,
                                description="GiB of memory one second of step time is worth.")
    max_slowdown: float = Field(default=DEFAULT_MAX_SLOWDOWN, ge=0, le=1e6, description="min-memory: at most "
                                "this much slower than the fastest plan that fits.")
    memory_budget_gib: float | None = Field(default=None, ge=MIN_MEMORY_GIB, le=MAX_MEMORY_GIB,
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
    search: Search = "auto"
    time_limit: float | None = Field(default=None, gt=0, le=MAX_TIME_LIMIT_SECONDS, description=(
        f"Search time limit (seconds; default {DEFAULT_TIME_LIMIT_SECONDS:g}, at most the service's "
        "PARPLAN_MAX_TIME_LIMIT_SECONDS)."))
    mesh: list[PositiveInteger] | None = Field(
        default=None, min_length=1, max_length=3, description="Fix the ILP's device mesh: axis sizes, outermost "
        "first, whose product is the GPU count (default: searched).", examples=[[2, 4]])
    pareto: bool = Field(default=False, description="The DP's whole memory vs step-time frontier in `pareto` "
                         "(slower); without it the frontier holds only the plans the search needed.")
    target: TargetName = Field(
        default=Target.ANY.value, description="The trainer the plan is for: the search keeps to what it runs, "
        "prices its buffers and compares with its own baseline (`target` in the plan); `any` searches everything.")

    def to_body(self) -> dict[str, Any]:
        """The request as JSON (what a job stores); fields not given are left out."""
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
        if self.target != Target.ANY.value:
            body["target"] = self.target
        return body

    def resolve(self, calibration: Calibration = DEFAULT_CALIBRATION, *,
                model: ModelSource | None = None) -> PlanRequest:
        """The typed request, defaults applied (RequestError naming the field of a failed check).

        ``model``, when given, is what ``self.model`` reads as, already read and validated (the
        CLI's traced graph): it is used instead of reading the body's copy again."""
        model = model if model is not None else self.model.source()
        cl = self.cluster
        try:
            cluster = make_cluster(cl.gpus, cl.gpus_per_node, cl.gpu, cl.gpu_memory_gib, cl.host_memory_gib)
        except ConfigError as e:
            raise RequestError("cluster", str(e)) from None
        tr = self.training or TrainingSpec()
        ob = self.objective or ObjectiveSpec()
        _check_precision(tr.precision, cluster)
        target = Target(self.target)
        if PRECISIONS[tr.precision].torchao and target is not Target.TORCHTITAN:
            raise RequestError("training.precision", f"{tr.precision} is torchao's Float8 as torchtitan runs it: "
                               f"plan it with target torchtitan (target is {target.value})")
        if PRECISIONS[tr.precision].fp8_weight_gather and not PRECISIONS[tr.precision].torchao \
                and target is not Target.MEGATRON:
            raise RequestError("training.precision", f"{tr.precision} is Megatron-LM's --fp8-param-gather: "
                               f"plan it with target megatron (target is {target.value})")
        if PRECISIONS[tr.precision].te_adam and target is not Target.MEGATRON:
            raise RequestError("training.precision", f"{tr.precision} is Transformer Engine FusedAdam's low-precision "
                               f"states (Megatron-LM's --use-precision-aware-optimizer): plan it with target megatron "
                               f"(target is {target.value})")
        self._check_search(target, cluster)
        global_batch = tr.global_batch or cl.gpus
        if model.config is not None and tr.seq_len:
            try:
                check_seq_len(model.config, tr.seq_len)
            except ConfigError as e:
                raise RequestError("training.seq_len", str(e)) from None
        _check_micro_batch(global_batch, tr.micro_batch, target, cluster.num_devices)
        return PlanRequest(
            model=model, cluster=cluster, global_batch=global_batch,
            seq_len=tr.seq_len or model.default_seq_len, micro_batch=tr.micro_batch, objective=ob.kind,
            alpha=ob.alpha, max_slowdown=ob.max_slowdown,
            memory_budget_bytes=int(ob.memory_budget_gib * 2**30) if ob.memory_budget_gib else None,
            search=self.search,
            time_limit_seconds=DEFAULT_TIME_LIMIT_SECONDS if self.time_limit is None else self.time_limit,
            calibration=calibration, mesh=tuple(self.mesh) if self.mesh is not None else None, pareto=self.pareto,
            target=target, precision=tr.precision, model_spec=self.model.to_body(),
            optimizer_offload=tr.optimizer_offload)

    def _check_search(self, target: Target, cluster: Cluster) -> None:
        """The mesh factors the cluster; the target runs the search asked for and the mesh's plans."""
        mesh = self.mesh
        if mesh is not None and math.prod(mesh) != cluster.num_devices:
            raise RequestError("mesh", f"{'x'.join(map(str, mesh))} = {math.prod(mesh)} devices does not factor "
                                       f"the cluster's {cluster.num_devices}")
        spec = SPECS[target]
        if spec.uniform and self.search != "auto":
            raise RequestError("search", f"target {target.value} runs one strategy for every layer, which parplan "
                                         "searches exhaustively; leave search at auto")
        if self.search != "auto" and self.search not in spec.searches:
            raise RequestError("search", f"target {target.value} runs the plans of the "
                                         f"{' or '.join(spec.searches)} search, not {self.search}")
        if mesh is not None and "ilp" not in spec.searches:
            raise RequestError("mesh", f"a device mesh fixes the ILP's per-operator plans, which target "
                                       f"{target.value} does not run")


def _check_micro_batch(global_batch: int, micro_batch: int | None, target: Target, devices: int) -> None:
    """With a micro-batch given, some data-parallel degree the target's search can use divides the
    global batch into whole micro-batches (:func:`~parplan.solver.strategy.data_parallel_degrees`)."""
    if micro_batch is None:
        return
    usable = data_parallel_choices(target, devices)
    if data_parallel_degrees(usable, global_batch, micro_batch):
        return
    dp = f"dp = {usable[0]} (target {target.value})" if len(usable) == 1 else f"any dp dividing the {devices} GPUs"
    raise RequestError("training.micro_batch", f"global batch {global_batch} is not a multiple of micro_batch "
                       f"{micro_batch} x dp for {dp}; give a global batch that is a multiple of "
                       f"{micro_batch * min(usable)}")


def _check_precision(name: str, cluster: Cluster) -> None:
    """The cluster's GPU has the math of the precision ``name``."""
    prec = PRECISIONS[name]
    try:
        for dtype in {prec.compute_dtype, prec.matmul_dtype or prec.compute_dtype}:
            cluster.gpu.peak(dtype)
    except ConfigError as e:
        raise RequestError("training.precision", str(e)) from None


# -- the typed request --------------------------------------------------------------------------


@dataclass(frozen=True)
class PlanRequest:
    """A validated plan request. Sizes in samples/tokens; memory in bytes; time in seconds."""

    model: ModelSource
    cluster: Cluster
    global_batch: int
    seq_len: int
    micro_batch: int | None = None
    objective: Objective = "min-memory"
    alpha: float | None = None
    max_slowdown: float = DEFAULT_MAX_SLOWDOWN
    memory_budget_bytes: int | None = None
    search: Search = "auto"
    time_limit_seconds: float = DEFAULT_TIME_LIMIT_SECONDS
    calibration: Calibration = DEFAULT_CALIBRATION
    mesh: tuple[int, ...] | None = None  # fix the ILP's device mesh (sizes, outermost first)
    pareto: bool = False  # the DP's whole memory vs step-time frontier (else: only down to the answer)
    target: Target = Target.ANY  # the trainer the plan is for (parplan.solver.targets)
    precision: str = DEFAULT_PRECISION  # parplan.solver.cost.precision.PRECISIONS
    optimizer_offload: bool = DEFAULT_OPTIMIZER_OFFLOAD  # uniform targets: offload when nothing fits without
    #: The request's ``model`` as given (``{"preset": ...}``, ``{"hf_config": ...}`` or ``{"graph": ...}``):
    #: the cache key names the model by it.
    model_spec: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def data_parallel_degrees(self) -> list[int]:
        """The data-parallel degrees the searches consider (every one with ``micro_batch`` None)."""
        return data_parallel_degrees(data_parallel_choices(self.target, self.cluster.num_devices), self.global_batch,
                                     self.micro_batch)

    @property
    def budget_bytes(self) -> int:
        """The allocated peak a plan may reach: the budget if given, and in any case no more than fits the
        device (:func:`parplan.solver.device_memory.allocated_budget_bytes`, the fit verdict)."""
        fits = allocated_budget_bytes(self.cluster)
        return min(self.memory_budget_bytes, fits) if self.memory_budget_bytes else fits


# -- reading bodies and hashing -----------------------------------------------------------------


def _message(error: Mapping[str, Any]) -> str:
    """One pydantic error in the request's words."""
    ctx = error.get("ctx") or {}
    kind = error.get("type")
    if kind == "less_than_equal":
        return f"must be at most {ctx['le']}"
    if kind == "greater_than_equal":
        return f"must be at least {ctx['ge']}"
    if kind == "greater_than":
        return f"must be > {ctx['gt']}"
    return str(error.get("msg", "invalid")).removeprefix("Value error, ")


def read_body(body: Any) -> PlanRequestIn:
    """A request body (parsed JSON) as the request model (RequestError naming the first bad field)."""
    if not isinstance(body, Mapping):
        raise RequestError("body", "expected a JSON object")
    try:
        return PlanRequestIn.model_validate(dict(body))
    except ValidationError as e:
        first = e.errors()[0]
        raise RequestError(".".join(str(p) for p in first["loc"]) or "body", _message(first)) from None


def parse_plan_request(body: Mapping[str, Any] | PlanRequestIn, calibration: Calibration = DEFAULT_CALIBRATION, *,
                       model: ModelSource | None = None) -> PlanRequest:
    """The typed request of a body (a mapping, read with :func:`read_body`, or the model itself);
    ``model`` as in :meth:`PlanRequestIn.resolve`. Raises RequestError."""
    return (body if isinstance(body, PlanRequestIn) else read_body(body)).resolve(calibration, model=model)


def model_from_spec(spec: Any) -> ModelSource:
    """The model of a request's ``model`` object (RequestError naming the field when it is bad)."""
    try:
        return ModelSpec.model_validate(spec).source()
    except ValidationError as e:
        first = e.errors()[0]
        raise RequestError(".".join(str(p) for p in ("model", *first["loc"])), _message(first)) from None


def canonical_request(request: PlanRequest | Mapping[str, Any]) -> str:
    """The resolved request as canonical JSON (sorted keys, no spaces), for hashing; a mapping is
    read with :func:`parse_plan_request` first."""
    req = request if isinstance(request, PlanRequest) else parse_plan_request(request)
    doc: dict[str, Any] = {
        "model": dict(req.model_spec),
        "cluster": {"gpus": req.cluster.num_devices, "gpus_per_node": req.cluster.gpus_per_node,
                    "gpu": req.cluster.gpu.name, "memory_bytes": req.cluster.device_memory_bytes},
        "training": {"global_batch": req.global_batch, "seq_len": req.seq_len, "micro_batch": req.micro_batch},
        "objective": {"kind": req.objective, "alpha": req.alpha, "max_slowdown": req.max_slowdown,
                      "memory_budget_bytes": req.memory_budget_bytes},
        "search": req.search, "time_limit": req.time_limit_seconds, "mesh": list(req.mesh) if req.mesh else None,
        "pareto": req.pareto,
    }
    if req.target is not Target.ANY:  # a request for any trainer has no target key
        doc["target"] = req.target.value
    if req.precision != DEFAULT_PRECISION:  # and one in the default precision no precision key
        doc["training"]["precision"] = req.precision
    if req.optimizer_offload != DEFAULT_OPTIMIZER_OFFLOAD:  # keys of the defaults left out, as above
        doc["training"]["optimizer_offload"] = req.optimizer_offload
    if req.cluster.host_memory_bytes_override is not None:
        doc["cluster"]["host_memory_bytes"] = req.cluster.host_memory_bytes_override
    return json.dumps(doc, sort_keys=True, separators=(",", ":"))


def request_hash(request: PlanRequest | Mapping[str, Any]) -> str:
    """sha256 of the canonical request and the solver version (the plan cache key)."""
    return hashlib.sha256(f"{SOLVER_VERSION}\n{canonical_request(request)}".encode()).hexdigest()
