"""What the executor runs: one strategy of a model on ``tp x pp x dp`` ranks (:class:`RunSpec`),
JSON-able, with the checks of what :mod:`.executor` cannot run."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from parplan.agent.model import check_supported
from parplan.solver.cost import recompute_modules
from parplan.solver.cost.activations import Recompute
from parplan.solver.errors import StrategyError
from parplan.solver.frontends.config import TransformerConfig


@dataclass(frozen=True)
class RunSpec:
    """One strategy to run: JSON-able, sent to every rank."""

    model: dict[str, Any]  # TransformerConfig fields
    tp: int = 1
    pp: int = 1
    dp: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    recompute: str = "none"
    micro_batch: int = 1
    num_microbatches: int = 1
    schedule: str = "1f1b"
    virtual_stages: int = 1
    seq_len: int = 128
    seed: int = 0
    timing_steps: int = 3
    check: bool = True
    rtol: float = 1e-4
    atol: float = 1e-6
    diagnose: bool = False
    label: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: blocks per pipeline stage (``pp`` entries, 1F1B or GPipe); None: the even split
    partition: tuple[int, ...] | None = None
    #: per block, its ZeRO stage (2 or 3: FSDP2 with or without resharding after forward); the
    #: embedding and head (FSDP2's root) follow the first block; None: ``zero`` for every block
    layer_zero: tuple[int, ...] | None = None
    #: per block, its recomputation (none / selective / full); None: ``recompute`` for every block
    layer_recompute: tuple[str, ...] | None = None
    #: TP ranks are consecutive (mesh ``(pp, dp, tp)``); False: DP ranks are (mesh ``(pp, tp, dp)``)
    tp_inner: bool = True
    #: accumulation without pipelining under FSDP2: reduce-scatter every micro-batch (gradients stay
    #: sharded) instead of only the last (unsharded gradients kept through the step)
    fsdp_sync_every_microbatch: bool = False
    #: whose buffers the step keeps: ``torch`` (PyTorch's own, fp32) or ``nanotron`` (its bf16 training with
    #: fp32 gradient accumulation under DDP, and its fp32 loss: :mod:`parplan.agent.nanotron_exec`)
    trainer: str = "torch"
    #: the fraction of the optimizer stepped on the host (Megatron-LM's ``--optimizer-offload-fraction``
    #: under its distributed optimizer: ZeRO-1), run by :class:`parplan.agent.offload.HostOffloadAdam`
    optimizer_offload: float = 0.0

    @property
    def precision(self) -> str:
        """The cost model's precision of the run: nanotron trains in bf16 (its fp32 gradient accumulator
        refuses fp32 weights), PyTorch's own runs in fp32."""
        return "bf16" if self.trainer == "nanotron" else "fp32"

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def per_layer(self) -> bool:
        """Whether blocks differ in strategy (the prediction is then the whole-plan evaluator's)."""
        return self.layer_zero is not None or self.layer_recompute is not None

    def block_zero(self, i: int) -> int:
        """ZeRO stage of block ``i``."""
        return self.zero if self.layer_zero is None else self.layer_zero[i]

    def block_recompute(self, i: int) -> str:
        """Recomputation of block ``i``."""
        return self.recompute if self.layer_recompute is None else self.layer_recompute[i]

    @property
    def sharded(self) -> bool:
        """Whether data parallelism is FSDP2 (ZeRO-2/3 on some block)."""
        zeros = self.layer_zero if self.layer_zero is not None else (self.zero,)
        return self.dp > 1 and max(zeros) >= 2

    def config(self) -> TransformerConfig:
        return TransformerConfig(**self.model)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> RunSpec:
        d = dict(d)
        for key in ("partition", "layer_zero", "layer_recompute"):
            if d.get(key) is not None:
                d[key] = tuple(d[key])
        return RunSpec(**d)

    def _validate_recompute(self) -> None:
        """StrategyError for a recomputation the agent's blocks do not run."""
        try:
            rec = Recompute(self.recompute)
        except ValueError as e:
            raise StrategyError(str(e)) from None
        why = recompute_modules.refusal(rec.modules, True, False) if rec.per_module else None
        if why is None and "layernorm" in rec.modules and self.sequence_parallel:
            why = ("recompute module layernorm with sequence parallelism: the agent frees a norm's output storage, "
                   "and a sequence-parallel norm returns a DTensor")
        if why is not None:
            raise StrategyError(why)

    def validate(self) -> None:
        """StrategyError for what the executor cannot run."""
        cfg = self.config()
        check_supported(cfg)
        if self.trainer not in ("torch", "nanotron"):
            raise StrategyError(f"unknown trainer {self.trainer!r} (torch, nanotron)")
        if self.trainer == "nanotron" and (self.tp, self.pp, self.zero, cfg.family) != (1, 1, 0, "llama"):
            raise StrategyError("the nanotron trainer runs data parallelism (ZeRO-0) of a Llama here: its "
                                "tensor and pipeline parallelism and ZeRO-1 are its own code, not PyTorch's")
        self._validate_recompute()
        if self.trainer == "nanotron" and (self.per_layer or self.recompute == "selective"
                                           or Recompute(self.recompute).per_module):
            raise StrategyError("the nanotron trainer runs one strategy for every block, recomputing whole "
                                "blocks or nothing")
        if self.optimizer_offload and (self.trainer != "torch" or self.zero != 1 or self.per_layer
                                       or not 0 < self.optimizer_offload <= 1):
            raise StrategyError("optimizer_offload is a fraction in (0, 1] of the distributed optimizer (zero 1) "
                                "of the torch trainer, as Megatron-LM's --optimizer-cpu-offload")
        if self.zero == 1 and self.tp > 1:
            raise StrategyError(
                "zero=1 with tp > 1: ZeroRedundancyOptimizer broadcasts every parameter from its owner "
                "with c10d.broadcast_, which DTensor (TP) parameters do not support, and DDP, which it "
                "is made for, rejects DTensor parameters; PyTorch has no native ZeRO-1 for TP modules")
        if self.layer_zero is not None:
            if len(self.layer_zero) != cfg.layers:
                raise StrategyError(f"layer_zero has {len(self.layer_zero)} entries for {cfg.layers} blocks")
            if self.dp == 1 or not set(self.layer_zero) <= {2, 3}:
                raise StrategyError("layer_zero mixes ZeRO-2 and ZeRO-3 (FSDP2 resharding after forward or "
                                    "not) per block and needs dp > 1; DDP (zero 0/1) wraps a whole stage")
        if self.layer_recompute is not None:
            if len(self.layer_recompute) != cfg.layers:
                raise StrategyError(f"layer_recompute has {len(self.layer_recompute)} entries for "
                                    f"{cfg.layers} blocks")
            if not set(self.layer_recompute) <= {"none", "selective", "full", "op"}:
                raise StrategyError(f"unknown recompute in {list(self.layer_recompute)}")
        if self.partition is not None:
            if self.schedule == "interleaved":
                raise StrategyError("a partition is blocks per pipeline stage; the interleaved schedule's "
                                    "virtual stages split the blocks evenly")
            if len(self.partition) != self.pp or sum(self.partition) != cfg.layers or min(self.partition) < 1:
                raise StrategyError(f"partition {list(self.partition)} must give each of the {self.pp} stages at "
                                    f"least one of the {cfg.layers} blocks")
        if self.tp > 1:
            for what, n in (("heads", cfg.heads), ("kv_heads", cfg.n_kv_heads), ("ffn", cfg.ffn),
                            ("vocab", cfg.vocab)):
                if n % self.tp:
                    raise StrategyError(f"tp={self.tp} does not divide {what} ({n})")
            if self.sequence_parallel and self.seq_len % self.tp:
                raise StrategyError(f"sequence parallel tp={self.tp} does not divide seq_len {self.seq_len}")
        if self.pp * self.virtual_stages > cfg.layers:
            raise StrategyError(f"pp x virtual stages = {self.pp * self.virtual_stages} exceeds the "
                                f"{cfg.layers} blocks")
        if self.schedule not in ("1f1b", "gpipe", "interleaved"):
            raise StrategyError(f"the agent runs the 1f1b, gpipe and interleaved schedules, not {self.schedule}")
        if self.pp > 1 and self.num_microbatches < self.pp and self.schedule != "gpipe":
            raise StrategyError(f"the {self.schedule} schedule needs at least pp={self.pp} micro-batches")
        if self.schedule == "interleaved" and self.num_microbatches % self.pp:
            raise StrategyError("the interleaved schedule needs a micro-batch count that is a multiple of pp")
        if self.seq_len > cfg.seq_len and cfg.position_kind == "learned":
            raise StrategyError(f"seq_len {self.seq_len} exceeds the {cfg.seq_len} learned positions")
