"""Run one strategy on real processes with PyTorch's own distributed APIs, and measure it.

Runs inside every rank of a process group (see :mod:`parplan.agent.launch`). For a
:class:`RunSpec` it

1. builds the model (:mod:`parplan.agent.model`, identical on every rank from one seed), cuts
   it into pipeline stages, applies tensor parallelism with ``parallelize_module`` (Megatron's
   column/row split of attention and MLP, a vocabulary-parallel embedding and LM head with
   ``loss_parallel``; with sequence parallelism ``SequenceParallel`` norms and
   ``PrepareModuleInput`` all-gathers), data parallelism with DDP (``replicate`` when the
   parameters are TP DTensors), ZeRO-1 as DDP plus ``ZeroRedundancyOptimizer`` (optimizer
   states sharded), FSDP2 ``fully_shard`` over the ``dp`` mesh dimension for ZeRO-3 (ZeRO-2: the
   same without resharding after forward; with TP the 2-D FSDP x DTensor recipe), per block when
   a plan mixes ZeRO stages, activation checkpointing (``torch.utils.checkpoint``, non-reentrant;
   per block when a plan mixes it) and ``torch.distributed.pipelining`` stages with the GPipe,
   1F1B or interleaved 1F1B schedule and an even or given partition of the blocks, all over one
   ``init_device_mesh`` mesh ``(pp, dp, tp)`` (``(pp, tp, dp)`` with DP inner); without
   pipelining, several micro-batches per step accumulate gradients with the synchronisation
   skipped but for the last micro-batch (DDP ``no_sync``, FSDP2 ``set_requires_gradient_sync``, as
   ``torch.distributed.pipelining`` does too), or, with ``fsdp_sync_every_microbatch``, FSDP2
   reduce-scattering every micro-batch so that gradients stay sharded;
2. checks correctness with dropout off: the loss and every gradient of the first step, and the
   loss after one Adam step, against a single-process run of the same model on the same global
   batch;
3. measures, with dropout on, on a fresh copy (the check ran the first steps of its own): after
   one warm-up step, per-category peak memory of the second step — the steady state, and the
   one-off rebuild of DDP's gradient buckets that happens in it — with
   :class:`~parplan.agent.memtrack.CategoryTracker` (and ``torch.cuda.max_memory_allocated`` of
   a further step on GPUs), then the median wall time of several steps.

:mod:`.run_spec` holds the spec and what cannot run, :mod:`.runner` the runner of one rank (the model
built and parallelised, its step, the reference), :mod:`.parallelize` the tensor and data
parallelism of a stage. Per-operator (ILP) plans are executed by :mod:`parplan.agent.ilp_exec`.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from parplan.agent.memtrack import CategoryTracker
from parplan.agent.model import attention_kernel
from parplan.agent.run_spec import RunSpec as RunSpec  # the spec :func:`run_spec` runs, importable from here
from parplan.agent.runner import Runner, reference_for, sync_device
from parplan.solver.errors import StrategyError


def run_spec(spec: RunSpec, device: torch.device) -> dict[str, Any]:
    """Run ``spec`` on this rank (inside an initialised process group) and return its report."""
    spec.validate()
    if dist.get_world_size() != spec.world:
        raise StrategyError(f"tp x pp x dp = {spec.world} but the process group has {dist.get_world_size()} ranks")
    runner = runner_for(spec, device)
    rank = dist.get_rank()
    out: dict[str, Any] = {
        "rank": rank, "stage": runner.pp_rank, "coords": {"pp": runner.pp_rank, "dp": runner.dp_rank,
                                                          "tp": runner.tp_rank},
        "label": spec.label, "device": device.type,
        "shared_device": device.type == "cuda" and dist.get_backend() == "gloo",
        "attention_kernel": attention_kernel(device, 0.1 if runner.cfg.family == "gpt" else 0.0, runner.dtype),
    }
    if spec.check:
        ref = reference_for(runner.cfg, runner.global_tokens, runner.global_labels, spec.seed)
        out["check"] = runner.check(ref)
        # the check ran the first steps: measure a fresh copy's, as a run that starts now runs them
        del runner, ref
        gc.collect()
        dist.barrier()
        runner = runner_for(spec, device)
    runner.train_step()  # step 1, outside the tracker: creates the optimizer's states
    dist.barrier()
    tracker = CategoryTracker(diagnose=spec.diagnose)
    runner.register_state(tracker)
    with tracker.measuring():
        runner.train_step()  # step 2: the steady state, and DDP's one-off rebuild of its gradient buckets
    measured = tracker.result(device)
    if spec.optimizer_offload:
        measured["host"] = tracker.host_result()
    if spec.diagnose:
        measured["modules"] = tracker.module_peaks(depth=4)
        measured["contents"] = {k: summarise_contents(v) for k, v in tracker.peak_contents.items()}
    del tracker
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.train_step()
        torch.cuda.synchronize(device)
        measured["tracker_peak_bytes"] = measured["peak_bytes"]
        measured["peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
        measured["resident_before_step_bytes"] = int(base)
    times = []
    for _ in range(max(1, spec.timing_steps)):
        dist.barrier()
        sync_device(device)
        t0 = time.perf_counter()
        runner.train_step()
        sync_device(device)
        times.append(time.perf_counter() - t0)
    out["measured"] = measured
    out["step_seconds"] = {"median": statistics.median(times), "all": times}
    return out


def runner_for(spec: RunSpec, device: torch.device) -> Runner:
    """The runner of ``spec``'s trainer: PyTorch's own, or nanotron's buffers
    (:mod:`parplan.agent.nanotron_exec`)."""
    if spec.trainer == "nanotron":
        from parplan.agent.nanotron_exec import NanotronRunner

        return NanotronRunner(spec, device)
    return Runner(spec, device)


def summarise_contents(items: list[tuple[int, str]], top: int = 16) -> dict[str, list[list[Any]]]:
    """The largest live storages by creating op and module, and totals by op with the layer
    index removed (``layers.3.attn`` -> ``layers.*.attn``)."""
    import re

    by_label: dict[str, int] = {}
    by_kind: dict[str, list[int]] = {}
    for nbytes, label in items:
        by_label[label] = by_label.get(label, 0) + nbytes
        kind = re.sub(r"layers\.\d+", "layers.*", label)
        kind = re.sub(r"^\w+: ", "", kind) if label.startswith(("parameters:", "gradients:", "optimizer")) else kind
        entry = by_kind.setdefault(kind, [0, 0])
        entry[0] += nbytes
        entry[1] += 1
    return {"largest": [[b, k] for k, b in sorted(by_label.items(), key=lambda kv: -kv[1])[:top]],
            "by_kind": [[b, n, k] for k, (b, n) in sorted(by_kind.items(), key=lambda kv: -kv[1][0])]}


def device_for_rank() -> torch.device:
    if torch.cuda.is_available() and os.environ.get("PARPLAN_AGENT_DEVICE", "cuda") == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


Worker = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
