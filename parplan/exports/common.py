"""What every export shares: the plan read back from its document, the result, and the error.

An export reads a plan document (``parplan plan --json``, ``GET /v1/plans/{id}``), never the
search's objects, so a saved plan converts the same as a fresh one. Sizes in samples; the model's
architecture comes from ``model.architecture`` (written for presets and Hugging Face configs).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from parplan.solver.cluster import gpu_preset
from parplan.solver.errors import ConfigError, SolverError
from parplan.solver.frontends.config import decoder_variants, extra_features
from parplan.solver.strategy import hybrid_groups


class NotExpressibleError(SolverError):
    """The plan cannot be written for the target; ``reasons`` says each thing that cannot."""

    def __init__(self, target: str, reasons: list[str]) -> None:
        self.target = target
        self.reasons = reasons
        super().__init__(f"{target} cannot express this plan: " + "; ".join(reasons))


NotExpressible = NotExpressibleError  # the short name the export modules use


@dataclass(frozen=True)
class Export:
    """A plan written for one trainer: its files (name -> text) and the commands that launch it
    (one per node where they differ), for the stated version of that trainer."""

    target: str
    version: str
    files: dict[str, str]
    launch: list[str]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "version": self.version, "files": dict(self.files),
                "launch": list(self.launch), "notes": list(self.notes)}


@dataclass(frozen=True)
class UniformPlan:
    """One strategy for every layer: the shape Megatron-LM, torchtitan and DeepSpeed take.
    ``tp * cp * pp * dp`` devices; ``micro_batch * num_microbatches * dp`` samples per step."""

    tp: int
    pp: int
    dp: int
    zero: int
    sequence_parallel: bool
    recompute: str  # none | selective | full
    micro_batch: int
    num_microbatches: int
    global_batch: int
    schedule: str = "1f1b"
    virtual_stages: int = 1
    precision: str = "bf16"
    expert_parallel: int = 1
    partition: tuple[int, ...] | None = None  # blocks per pipeline stage (None: even)
    cp: int = 1  # context-parallel degree (the sequence split over cp ranks)
    cp_comm: str = "p2p"  # attention's exchange under CP: the ring (p2p) or all-to-alls (a2a)
    tp_comm_overlap: bool = False  # Megatron-LM's --tp-comm-overlap (set only by `parplan memory`)
    overlap_param_gather: bool = False  # Megatron-LM's --overlap-param-gather (also set by the uniform search)
    overlap_grad_reduce: bool = True  # Megatron-LM's --overlap-grad-reduce (false only from `parplan memory`)
    optimizer_offload: float = 0.0  # the optimizer's fraction on the host (ParallelConfig.optimizer_offload)
    dp_shard: int = 0  # hybrid sharding: ZeRO within groups of dp_shard data-parallel ranks (0: all of dp)
    expert_tensor_parallel: int | None = None  # the experts' own TP degree (Megatron-LM's; None: tp)

    @property
    def shard(self) -> int:
        """Data-parallel ranks ZeRO shards over (:func:`~parplan.solver.strategy.hybrid_groups`)."""
        return hybrid_groups(self.dp, self.dp_shard)[0]

    @property
    def replicate(self) -> int:
        """Groups of hybrid sharding that hold the same shards (:func:`~parplan.solver.strategy.hybrid_groups`)."""
        return hybrid_groups(self.dp, self.dp_shard)[1]

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def degrees(self) -> str:
        """``tp x pp x dp`` (``tp x cp x pp x dp`` when context-parallel) = the devices, for messages."""
        if self.cp > 1:
            return f"tp x cp x pp x dp = {self.tp} x {self.cp} x {self.pp} x {self.dp} = {self.world}"
        return f"tp x pp x dp = {self.world}"


@dataclass(frozen=True)
class PlanContext:
    """What an export needs besides the strategy: model, cluster, sequence length."""

    model_name: str
    architecture: Mapping[str, Any] | None  # parplan's TransformerConfig fields, or None for a bare graph
    seq_len: int
    gpus: int
    gpus_per_node: int
    #: GPUs one machine holds where fewer than a node's (its GPU preset's ``gpus_per_host``: a GB200
    #: compute tray's 4 of a 72-GPU NVLink domain); None: a node is one machine
    gpus_per_host: int | None = None

    @property
    def host_gpus(self) -> int:
        """GPUs one launcher node (one machine) runs."""
        return min(self.gpus_per_node, self.gpus_per_host or self.gpus_per_node)

    @property
    def nodes(self) -> int:
        """Launcher nodes (machines): ``--nnodes``."""
        return max(1, -(-self.gpus // self.host_gpus))

    @property
    def procs_per_node(self) -> int:
        """Processes one launcher node starts: ``--nproc-per-node``."""
        return min(self.gpus, self.host_gpus)


def context_of(doc: Mapping[str, Any]) -> PlanContext:
    """The model and cluster a plan document was made for."""
    model = doc.get("model") or {}
    cluster = doc.get("cluster") or {}
    if not cluster.get("gpus"):
        raise NotExpressible("any", ["the document has no cluster (is it a plan document?)"])
    arch = model.get("architecture")
    seq = model.get("seq_len") or (arch or {}).get("seq_len") or 0
    return PlanContext(str(model.get("name") or "model"), arch if isinstance(arch, Mapping) else None, int(seq),
                       int(cluster["gpus"]), int(cluster.get("gpus_per_node") or cluster["gpus"]),
                       _gpus_per_host(cluster.get("gpu")))


def _gpus_per_host(gpu: Any) -> int | None:
    """The GPU preset's ``gpus_per_host`` for a plan's GPU name (None for an unknown name)."""
    try:
        return gpu_preset(str(gpu)).gpus_per_host if gpu else None
    except ConfigError:
        return None


#: Targets whose exports write Qwen's q/k/v biases and q/k norms (Megatron-LM: --add-qkv-bias,
#: --qk-layernorm), the architecture's own dropout (--hidden-dropout, --attention-dropout) and its own
#: normalisation, positions and linear biases (--normalization, --position-embedding-type,
#: --disable-bias-linear).
WRITES_QWEN = frozenset({"megatron"})


def unwritten_features(arch: Mapping[str, Any] | None, target: str) -> list[str]:
    """What of the model's architecture ``target``'s export does not write yet: Qwen's q/k/v biases
    and q/k norms, a dropout, normalisation, positions or linear biases set in the architecture
    (:func:`~parplan.solver.frontends.config.decoder_variants`) outside :data:`WRITES_QWEN`, and
    DeepSeek's, Gemma's and gpt-oss's features
    (:func:`~parplan.solver.frontends.config.extra_features`) everywhere (a trainer launched without
    them would train another model)."""
    arch = arch or {}
    out = [f"the model's {feature} is not written by parplan's {target} export yet" for feature in extra_features(arch)]
    if target in WRITES_QWEN:
        return out
    if arch.get("dropout") is not None:
        out.append(f"the model's dropout ({arch['dropout']}) is not written by parplan's {target} export yet")
    if arch.get("qkv_bias"):
        out.append(f"the model's q/k/v biases (Qwen2) are not written by parplan's {target} export yet")
    if arch.get("qk_norm"):
        out.append(f"the model's q/k norms (Qwen3) are not written by parplan's {target} export yet")
    out += [f"the model's {variant} is not written by parplan's {target} export yet"
            for variant in decoder_variants(arch)]
    return out


def layered_strategy(doc: Mapping[str, Any], target: str, runs: str) -> Mapping[str, Any]:
    """The document's strategy, when it gives layers their strategies (a trainer's unit); else
    NotExpressible: no plan at all, or an ILP plan's per-operator shardings (``runs``: what the
    target runs instead)."""
    s = doc.get("strategy")
    if not isinstance(s, Mapping):
        raise NotExpressible(target, ["the document has no strategy (an infeasible request has no plan)"])
    if s.get("kind") == "intra-operator":
        raise NotExpressible(target, [f"the plan shards each operator on its own ({s.get('summary')}); {runs} "
                                      f"(ask for the plan with --target {target}, or use target parplan)"])
    return s


def expert_tensor_parallel_of(s: Mapping[str, Any], target: str) -> int | None:
    """The strategy's ``expert_tensor_parallel`` (None where not set); NotExpressible for a target other
    than Megatron-LM, the one trainer with an expert tensor-parallel size of its own."""
    etp = s.get("expert_tensor_parallel")
    if etp is None:
        return None
    if target != "megatron":
        raise NotExpressible(target, [f"expert_tensor_parallel {etp}: the experts on a tensor-parallel degree of "
                                      f"their own is Megatron-LM's --expert-tensor-parallel-size; {target} splits "
                                      "the experts like the dense layers"])
    return int(etp)


def uniform_of(doc: Mapping[str, Any], target: str) -> UniformPlan:
    """The plan as one strategy for every layer; NotExpressible when it is not one (an ILP plan's
    per-operator shardings; a DP plan whose layers differ)."""
    s = layered_strategy(doc, target, f"{target} runs one tensor/pipeline/data-parallel layout for every layer")
    kind = s.get("kind", "uniform")
    if kind == "uniform":
        return UniformPlan(tp=int(s["tp"]), pp=int(s["pp"]), dp=int(s["dp"]), zero=int(s["zero"]),
                           sequence_parallel=bool(s["sequence_parallel"]), recompute=str(s["recompute"]),
                           micro_batch=int(s["micro_batch"]), num_microbatches=int(s["num_microbatches"]),
                           global_batch=int(s["global_batch"]), schedule=str(s.get("schedule", "1f1b")),
                           virtual_stages=int(s.get("virtual_stages", 1)), precision=str(s.get("precision", "bf16")),
                           expert_parallel=int(s.get("expert_parallel", 1)),
                           partition=tuple(s["partition"]) if s.get("partition") else None,
                           cp=int(s.get("cp") or 1), cp_comm=str(s.get("cp_comm") or "p2p"),
                           tp_comm_overlap=bool(s.get("tp_comm_overlap")),
                           overlap_param_gather=bool(s.get("overlap_param_gather")),
                           overlap_grad_reduce=s.get("overlap_grad_reduce") is not False,
                           optimizer_offload=float(s.get("optimizer_offload") or 0.0),
                           dp_shard=int(s.get("dp_shard") or 0),
                           expert_tensor_parallel=expert_tensor_parallel_of(s, target))
    if kind == "per-layer":
        runs = list(s.get("layers") or [])
        keys = ("tp", "dp", "zero", "sequence_parallel", "recompute", "expert_parallel", "tp_inner", "cp", "cp_comm",
                "dp_shard", "expert_tensor_parallel")
        distinct = {tuple(r.get(k) for k in keys) for r in runs}
        reasons = []
        if len(distinct) > 1:
            described = sorted({str(r.get("strategy")) for r in runs})
            reasons.append(f"its layers use {len(described)} different strategies ({'; '.join(described)}); "
                           f"{target} applies one to every layer (target galvatron or parplan runs per-layer plans)")
        if any(r.get("tp_inner") is False and int(r["tp"]) > 1 and int(r["dp"]) > 1 for r in runs):
            reasons.append("a layer places its data-parallel ranks inside its tensor-parallel group (tp_inner "
                           f"false); {target} puts tensor-parallel ranks next to each other")
        if reasons:
            raise NotExpressible(target, reasons)
        if not runs:
            raise NotExpressible(target, ["the per-layer plan has no layers"])
        r = runs[0]
        mb = int(s["global_batch"]) // (int(s["num_microbatches"]) * int(r["dp"]))
        return UniformPlan(tp=int(r["tp"]), pp=int(s["pp"]), dp=int(r["dp"]), zero=int(r["zero"]),
                           sequence_parallel=bool(r["sequence_parallel"]), recompute=str(r["recompute"]),
                           micro_batch=mb, num_microbatches=int(s["num_microbatches"]),
                           global_batch=int(s["global_batch"]), schedule=str(s.get("schedule", "1f1b")),
                           precision=str(s.get("precision", "bf16")),
                           expert_parallel=int(r.get("expert_parallel") or 1),
                           partition=tuple(s["partition"]) if s.get("partition") else None,
                           cp=int(r.get("cp") or 1), cp_comm=str(r.get("cp_comm") or "p2p"),
                           dp_shard=int(r.get("dp_shard") or 0),
                           expert_tensor_parallel=expert_tensor_parallel_of(r, target))
    raise NotExpressible(target, [f"unknown strategy kind {kind!r}"])


def flag_lines(args: list[str], quote: Callable[[str], str] = str) -> list[str]:
    """Command-line tokens as lines of a flag and its values (a flag followed by another flag is a
    switch, alone on its line; a list flag, ``--recompute-modules core_attn mlp``, has several);
    ``quote`` the values (``shlex.quote`` for a shell script)."""
    lines: list[str] = []
    i = 0
    while i < len(args):
        j = i + 1
        while j < len(args) and not args[j].startswith("--"):
            j += 1
        lines.append(" ".join([args[i], *map(quote, args[i + 1:j])]))
        i = j
    return lines


#: What to give instead of an operator graph, for an export that builds the model from its sizes.
SIZES_HINT = ("give a preset, or a Hugging Face config of a model_type parplan maps by hand; a traced "
              "config or a posted graph has no sizes")
