"""Replanning when a job's allocation changes: which layout changes a trainer's checkpoint can be
resumed into, and what the switch costs.

Resume rules (what a checkpoint saved under one layout loads into), per target:

- ``megatron`` — Megatron-LM's distributed checkpoint (``--ckpt-format torch_dist``): model
  weights reshard across TP, PP, DP, CP and EP (megatron/core/dist_checkpointing/README: "a
  checkpoint saved under one parallel configuration (tensor, pipeline, or data parallelism) can be
  loaded under a different parallel configuration"). The distributed optimizer's state reshards
  across TP and PP only when saved with ``--dist-ckpt-optim-fully-reshardable``; its default
  ``dp_reshardable`` format reshards across DP alone (that flag's help in arguments.py).
- ``torchtitan`` — PyTorch DCP: load-time resharding of DTensor state to any placement
  (torch.distributed.checkpoint docs: "saving in one cluster topology and loading into another");
  the state dict's names do not depend on the pipeline split, so PP changes load too.
- ``deepspeed`` — a native ZeRO checkpoint resumes on the layout it was saved with; another TP,
  PP or DP needs it converted offline to a universal checkpoint (``ds_to_universal.py``) first.
- ``galvatron`` — no documented resharding: the same layout only.
- ``any`` and ``parplan`` name no checkpoint format: nothing is checked (``rule`` is None).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from parplan.solver.capacity import CapacityError

#: The parallel degrees a layout names (``etp``: the experts' tensor-parallel degree, Megatron-LM's
#: --expert-tensor-parallel-size, compared only where a plan sets one of its own; else it is ``tp``).
AXES = ("tp", "pp", "dp", "cp", "ep", "etp")


@dataclass(frozen=True)
class ResumeRule:
    target: str
    checkpoint: str  # the checkpoint format the rule is about
    reshards: frozenset[str]  # the axes whose degree may change on load
    checkpoint_bytes_per_parameter: float  # weights + optimizer state as saved
    source: str


_MEGATRON_SOURCE = ("Megatron-LM megatron/core/dist_checkpointing/README.md; arguments.py "
                    "--dist-ckpt-optim-fully-reshardable")

# Bytes per parameter saved: Megatron and DeepSpeed keep 16-bit weights in the model (2) and fp32
# master weights, Adam m and v in the optimizer (12); torchtitan's FSDP2 keeps fp32 parameters (4)
# and Adam m and v (8).
RULES: Mapping[str, ResumeRule] = {
    "megatron": ResumeRule("megatron", "torch_dist, --dist-ckpt-optim-fully-reshardable",
                           frozenset(AXES), 14.0, _MEGATRON_SOURCE),
    "megatron-dp": ResumeRule("megatron", "torch_dist, dp_reshardable optimizer state",
                              frozenset({"dp"}), 14.0, _MEGATRON_SOURCE),
    "torchtitan": ResumeRule("torchtitan", "PyTorch DCP", frozenset(AXES), 12.0,
                             "PyTorch docs, torch.distributed.checkpoint (load-time resharding)"),
    "deepspeed": ResumeRule("deepspeed", "ZeRO checkpoint (native)", frozenset(), 14.0,
                            "DeepSpeed universal checkpointing docs (ds_to_universal.py)"),
    "galvatron": ResumeRule("galvatron", "per-rank state dicts", frozenset(), 14.0,
                            "Hetu-Galvatron: no resharding documented"),
}


def rule_for(target: str, reshardable_optimizer: bool = True) -> ResumeRule | None:
    """The resume rule of ``target`` (Megatron: by its optimizer checkpoint format), or None."""
    if target == "megatron" and not reshardable_optimizer:
        return RULES["megatron-dp"]
    return RULES.get(target)


@dataclass(frozen=True)
class Layout:
    """A plan's parallel degrees; a per-layer plan may use several TP, DP or EP degrees."""

    degrees: tuple[tuple[str, tuple[int, ...]], ...]

    def of(self, axis: str) -> tuple[int, ...]:
        if axis == "etp" and not self.sets_etp:
            return self.of("tp")
        return dict(self.degrees).get(axis, (1,))

    @property
    def sets_etp(self) -> bool:
        """Whether the plan gives the experts a tensor-parallel degree of their own."""
        return "etp" in dict(self.degrees)


def _expert_tp(st: Mapping[str, Any]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A strategy's (or a layer group's) own expert tensor-parallel degree as a layout entry, if set."""
    etp = st.get("expert_tensor_parallel")
    return (("etp", (int(etp),)),) if etp is not None else ()


def layout_of(document: Mapping[str, Any]) -> Layout | None:
    """The layout of a plan document's ``strategy``: a uniform one's degrees, or a per-layer one's
    ``pp``, ``cp`` and each layer group's degrees; None for a per-operator plan (a device mesh whose
    axes split operators' dimensions: no degrees)."""
    st = document.get("strategy") or {}
    if st.get("kind") == "uniform":
        return Layout(tuple((a, (int(st.get(key) or 1),)) for a, key in _KEYS) + _expert_tp(st))
    if st.get("kind") != "per-layer":
        return None
    layers = [x for x in st.get("layers") or [] if isinstance(x, Mapping)]

    def per_layer(key: str) -> tuple[int, ...]:
        return tuple(sorted({int(x.get(key) or 1) for x in layers})) or (1,)
    own = any(x.get("expert_tensor_parallel") is not None for x in layers)
    etp = tuple(sorted({int(x.get("expert_tensor_parallel") or x.get("tp") or 1) for x in layers})) or (1,)
    return Layout((("tp", per_layer("tp")), ("pp", (int(st.get("pp") or 1),)), ("dp", per_layer("dp")),
                   ("cp", (int(st.get("cp") or 1),)), ("ep", per_layer("expert_parallel")))
                  + ((("etp", etp),) if own else ()))


#: Each axis and its key in a strategy document.
_KEYS = (("tp", "tp"), ("pp", "pp"), ("dp", "dp"), ("cp", "cp"), ("ep", "expert_parallel"))


@dataclass(frozen=True)
class Change:
    axis: str
    before: tuple[int, ...]
    after: tuple[int, ...]


def changes(before: Layout | None, after: Layout | None) -> tuple[Change, ...] | None:
    """The degrees that differ; None when either plan is per-operator (no degrees to compare)."""
    if before is None or after is None:
        return None
    own = before.sets_etp or after.sets_etp  # (else the experts follow tp: no change of their own)
    return tuple(Change(a, before.of(a), after.of(a)) for a in AXES
                 if before.of(a) != after.of(a) and (a != "etp" or own))


def blocked(rule: ResumeRule, before: Layout | None, after: Layout | None) -> tuple[str, ...]:
    """Why ``rule``'s checkpoint cannot be loaded into ``after`` (empty: it can). A per-operator
    plan loads only where every axis reshards (any placement of every tensor)."""
    changed = changes(before, after)
    if changed is None:
        if rule.reshards == frozenset(AXES):
            return ()
        return (f"a per-operator plan's placements are not a TP/PP/DP layout, and a {rule.target} checkpoint "
                f"({rule.checkpoint}) reshards only {', '.join(sorted(rule.reshards)) or 'nothing'}",)
    return tuple(f"{c.axis} changes {'/'.join(map(str, c.before))} -> {'/'.join(map(str, c.after))}, which a "
                 f"{rule.target} checkpoint ({rule.checkpoint}) does not reshard"
                 for c in changed if c.axis not in rule.reshards)


def new_gpu_count(gpus: int, gpus_per_node: int, *, new_gpus: int | None = None,
                  nodes_lost: int | None = None) -> int:
    """The allocation after the change: ``new_gpus``, or ``gpus`` less ``nodes_lost`` whole nodes."""
    if new_gpus is not None:
        return new_gpus
    assert nodes_lost is not None
    left = gpus - nodes_lost * gpus_per_node
    if left < 1:
        raise CapacityError("nodes_lost", f"{nodes_lost} nodes of {gpus_per_node} GPUs leave none of {gpus}")
    return left


@dataclass(frozen=True)
class SwitchCost:
    """What moving to the new plan costs, seconds. A failure (``planned`` false) cannot save: the
    job resumes from its last checkpoint, losing the steps since; a planned change saves first."""

    checkpoint_bytes: float
    save_seconds: float
    load_seconds: float
    lost_steps: float
    lost_seconds: float
    total_seconds: float


def switch_cost(parameters: float, rule: ResumeRule | None, storage_bytes_per_second: float,
                step_seconds: float, checkpoint_interval_steps: int, *, planned: bool) -> SwitchCost:
    """Save (planned changes only) and load of the checkpoint at the storage's aggregate bandwidth,
    plus, after a failure, half a checkpoint interval of steps on average at the old step time.
    Without a rule, 14 bytes per parameter (16-bit weights, fp32 Adam states)."""
    size = parameters * (rule.checkpoint_bytes_per_parameter if rule is not None else 14.0)
    io = size / storage_bytes_per_second
    save = io if planned else 0.0
    lost = 0.0 if planned else checkpoint_interval_steps / 2
    return SwitchCost(checkpoint_bytes=size, save_seconds=save, load_seconds=io, lost_steps=lost,
                      lost_seconds=lost * step_seconds, total_seconds=save + io + lost * step_seconds)
