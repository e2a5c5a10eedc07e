"""From a plan (or command-line strategy) to a :class:`~parplan.agent.run_spec.RunSpec` that
fits this machine, shrinking the model when it must.

Scaling down keeps the strategy — the same TP, PP and DP degrees, ZeRO stage, sequence
parallelism, recomputation, schedule and micro-batch size — and runs it on a copy of the model
with fewer layers and a smaller hidden size (heads, key/value heads, FFN width and vocabulary
scaled to match and kept divisible by the TP degree), a shorter sequence and at most a few
micro-batches per step. The report then compares the measurement of that copy with the cost
model's prediction *for that copy*: what is validated is the cost model's accounting for the
strategy, at a size the machine can run.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from parplan.agent.model import check_supported
from parplan.agent.run_spec import RunSpec
from parplan.solver.errors import ConfigError, StrategyError
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource, model_from_json
from parplan.solver.strategy import ParallelConfig

#: Defaults of the shrunk copy (per dimension, never larger than the original).
SHRUNK_HIDDEN = 256
SHRUNK_SEQ = 128
SHRUNK_VOCAB = 1024
#: Models above this many parameters are shrunk by ``parplan validate`` unless told otherwise.
AUTO_SHRINK_PARAMETERS = 50_000_000


def _round_up(x: int, m: int) -> int:
    return max(m, math.ceil(x / m) * m)


def shrink_config(cfg: TransformerConfig, strategy: ParallelConfig, layers: int | None = None,
                  hidden: int | None = None) -> TransformerConfig:
    """A small copy of ``cfg`` runnable with ``strategy``'s degrees (see the module docstring)."""
    check_supported(cfg)
    tp = strategy.tp
    v = strategy.virtual_stages if strategy.schedule.chunked else 1
    n_layers = layers or min(cfg.layers, max(4, 2 * strategy.pp * v))
    if n_layers < strategy.pp * v:
        raise StrategyError(f"a shrunk model needs at least pp x virtual stages = {strategy.pp * v} layers")
    target = min(cfg.hidden, hidden or SHRUNK_HIDDEN)
    head_dim = 32 if target < 512 else 64
    heads = max(tp, target // head_dim)
    heads = _round_up(heads, tp)
    ratio = max(1, cfg.heads // cfg.n_kv_heads)
    kv = heads // ratio if heads % ratio == 0 else heads
    if kv % tp or heads % kv:
        kv = heads
    new_hidden = heads * head_dim
    ffn = _round_up(round(cfg.ffn / cfg.hidden * new_hidden), 8 * tp)
    vocab = _round_up(min(cfg.vocab, SHRUNK_VOCAB), 8 * tp)
    seq = min(cfg.seq_len, SHRUNK_SEQ)
    return cfg.with_(name=f"{cfg.name}-shrunk", layers=n_layers, hidden=new_hidden, heads=heads,
                     kv_heads=kv if kv != heads else None, head_dim=None, ffn=ffn, vocab=vocab, seq_len=seq)


def spec_for(cfg: TransformerConfig, strategy: ParallelConfig, seq_len: int | None, *, shrink: bool,
             shrink_layers: int | None = None, shrink_hidden: int | None = None, max_procs: int = 8,
             check: bool = True, timing_steps: int = 3, diagnose: bool = False, label: str = "") -> RunSpec:
    """The run for ``strategy`` on ``cfg`` (shrunk when ``shrink``), within ``max_procs`` ranks."""
    check_supported(cfg)
    if strategy.expert_parallel > 1:
        raise StrategyError("expert parallelism is not executed by the agent")
    if strategy.cp > 1:
        raise StrategyError("context parallelism (ring attention) is not executed by the agent: its gloo runs "
                            "have no ring-attention kernel, so a CP plan's prediction is not validated here")
    run_cfg = shrink_config(cfg, strategy, shrink_layers, shrink_hidden) if shrink else cfg
    seq = min(seq_len or run_cfg.seq_len, run_cfg.seq_len) if shrink else (seq_len or run_cfg.seq_len)
    dp = strategy.dp
    notes: list[str] = []
    if strategy.tp * strategy.pp * dp > max_procs:
        if strategy.zero == 0 and strategy.tp * strategy.pp <= max_procs:
            # Without ZeRO every data-parallel replica holds the same memory; fewer replicas
            # change nothing per rank but the gradient all-reduce.
            new_dp = max(d for d in range(1, dp + 1) if dp % d == 0 and strategy.tp * strategy.pp * d <= max_procs)
            notes.append(f"dp reduced from {dp} to {new_dp} to fit {max_procs} processes (zero=0: per-rank "
                         f"memory does not depend on dp)")
            dp = new_dp
        else:
            raise StrategyError(f"tp x pp x dp = {strategy.tp * strategy.pp * dp} processes exceed the "
                                f"{max_procs} this agent runs (ZeRO-{strategy.zero} memory depends on dp)")
    v = strategy.virtual_stages if strategy.schedule.chunked else 1
    m = strategy.num_microbatches
    if shrink:
        cap = max(strategy.pp, 2 * strategy.pp * v) if strategy.pp > 1 else 1
        if m > cap:
            notes.append(f"micro-batches per step reduced from {m} to {cap}")
            m = cap
        if strategy.schedule.value in ("interleaved", "interleaved-zb") and m % strategy.pp:
            m = _round_up(m, strategy.pp)
    if strategy.precision != "fp32":
        notes.append(f"precision {strategy.precision} requested: the agent runs, and predicts, fp32")
    partition = strategy.partition
    if partition is not None and run_cfg.layers != cfg.layers:
        notes.append(f"partition {list(partition)} dropped: the shrunk copy has {run_cfg.layers} blocks (even split)")
        partition = None
    mb = strategy.micro_batch
    if shrink and mb > 2:
        notes.append(f"micro-batch reduced from {mb} to 2")
        mb = 2
    return RunSpec(
        model=asdict(run_cfg), tp=strategy.tp, pp=strategy.pp, dp=dp, zero=strategy.zero,
        sequence_parallel=strategy.sequence_parallel, recompute=strategy.recompute.value, micro_batch=mb,
        num_microbatches=m, schedule=strategy.schedule.value, virtual_stages=v, seq_len=seq, partition=partition,
        timing_steps=timing_steps, check=check, diagnose=diagnose, label=label or run_cfg.name,
        fsdp_sync_every_microbatch=strategy.sync_every_microbatch and strategy.zero >= 2,
        optimizer_offload=strategy.optimizer_offload,
        extra={"original_model": cfg.name, "shrunk": shrink, "notes": notes,
               "requested": {"dp": strategy.dp, "num_microbatches": strategy.num_microbatches,
                             "micro_batch": strategy.micro_batch, "precision": strategy.precision}})


def config_of_source(model: ModelSource) -> TransformerConfig:
    """The architecture behind a model source (graph-only models are not executable)."""
    if model.config is None:
        raise ConfigError(f"model {model.name!r} is a bare operator graph; the agent builds models from an "
                          f"architecture (a preset or an HF config) only")
    return model.config


def model_of_request(request: dict[str, Any]) -> TransformerConfig:
    """The architecture named by a plan request's ``model`` field."""
    spec = request.get("model") or {}
    if "architecture" in spec:  # a plan document's model.architecture (parplan validate --plan)
        try:
            return TransformerConfig(**dict(spec["architecture"]))
        except TypeError as e:
            raise ConfigError(f"model.architecture is not a parplan architecture: {e}") from None
    if "preset" in spec:
        return get_preset(str(spec["preset"]))
    if "hf_config" in spec:
        return config_of_source(model_from_json(dict(spec["hf_config"]), name=str(spec.get("name", "hf-model"))))
    if "graph" in spec:
        return config_of_source(model_from_json(dict(spec["graph"]), name="graph"))
    raise ConfigError("the plan request names no model (preset, hf_config or graph)")


def strategy_of_plan(plan: dict[str, Any]) -> ParallelConfig:
    """The uniform strategy of a plan document (``parplan plan --json``'s ``strategy``)."""
    from parplan.solver.cost.activations import Recompute
    from parplan.solver.strategy import Schedule

    s = plan.get("strategy") or {}
    if s.get("dp_shard"):
        raise ConfigError(f"hybrid sharding (dp_shard {s['dp_shard']}): the agent's runner shards over all of dp; "
                          "validate the plan's torchtitan export with parplan validate --torchtitan")
    if s.get("expert_tensor_parallel") is not None:
        raise StrategyError(f"expert_tensor_parallel {s['expert_tensor_parallel']}: the agent's runner splits the "
                            "experts over the tensor-parallel ranks like the dense layers")
    offload = s.get("optimizer_offload") or 0.0
    if offload and int(s.get("zero", 0)) != 1:
        raise StrategyError(f"optimizer_offload {offload} at zero {s.get('zero', 0)}: the agent runs Megatron-LM's "
                            "offloaded optimizer, on the distributed optimizer (zero 1); DeepSpeed's ZeRO-Offload "
                            "under ZeRO-2/3 is not run")
    try:
        schedule = Schedule(str(s.get("schedule", "1f1b")))
        return ParallelConfig(
            tp=int(s["tp"]), pp=int(s["pp"]), dp=int(s["dp"]), zero=int(s.get("zero", 0)),
            sequence_parallel=bool(s.get("sequence_parallel", False)),
            recompute=Recompute(str(s.get("recompute", "selective"))), micro_batch=int(s.get("micro_batch", 1)),
            num_microbatches=int(s.get("num_microbatches", 1)), schedule=schedule,
            virtual_stages=int(s.get("virtual_stages", 1)) if schedule.chunked else 1,
            flash_attention=bool(s.get("flash_attention", True)), precision=str(s.get("precision", "bf16")),
            expert_parallel=int(s.get("expert_parallel", 1)), cp=int(s.get("cp", 1)),
            optimizer_offload=float(offload))
    except (KeyError, TypeError, ValueError) as e:
        raise ConfigError(f"plan strategy is incomplete or invalid: {e}") from None


def spec_for_validation(validation: dict[str, Any], max_procs: int, diagnose: bool = False) -> RunSpec:
    """The run for a claimed validation (its ``plan``, ``request`` and ``shrink``); ``diagnose``: also
    record what is alive at each category's peak."""
    plan = validation.get("plan") or {}
    request = validation.get("request") or {}
    cfg = model_of_request(request)
    strategy = strategy_of_plan(plan)
    shrink = validation.get("shrink")
    seq = (plan.get("model") or {}).get("seq_len") or (request.get("training") or {}).get("seq_len")
    params = ModelSource(cfg.name, config=cfg).parameter_count()
    do_shrink = shrink is not None or params > AUTO_SHRINK_PARAMETERS
    layers = (shrink or {}).get("layers")
    hidden = (shrink or {}).get("hidden")
    return spec_for(cfg, strategy, int(seq) if seq else None, shrink=do_shrink, shrink_layers=layers,
                    shrink_hidden=hidden, max_procs=max_procs, label=f"validation {validation.get('id', '')}",
                    diagnose=diagnose)
