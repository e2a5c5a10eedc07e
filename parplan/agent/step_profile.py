"""Where a measured training step's time goes: steps of one model on one device, each kernel timed
by ``torch.profiler`` and sorted into the time model's categories
(:data:`parplan.solver.cost.breakdown.CATEGORIES`) and phases (forward, backward, optimizer), so
that a step can be compared with :func:`parplan.solver.cost.breakdown.single_gpu_breakdown`
category by category.

On a GPU the timed things are the device's kernels, memory copies and fills; between them the
device idles (launch and host overhead), which the ``busy`` and ``window`` seconds of a phase
tell apart. On the CPU they are the ATen operators, each with its own (self) time.

A kernel's category comes from its name alone (:func:`kernel_category`). Known limit: an operator
PyTorch decomposes into generic kernels (an unfused RMSNorm is ``pow``, ``mean``, ``rsqrt`` and
``mul`` kernels) counts as ``elementwise``/``other``, not as what it decomposes; the top kernels
are kept with the operator that launched each, so a reader can re-attribute them.

The model is :class:`parplan.agent.model.Transformer` in ``dtype``; with a 16-bit dtype the
optimizer keeps fp32 master weights (Adam over them, the gradients cast up and the weights copied
back), as mixed-precision trainers do.
"""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.profiler import DeviceType

from parplan.agent.model import attention_kernel, build_model, set_recompute
from parplan.solver.cost.breakdown import CATEGORIES, PHASES
from parplan.solver.frontends.config import TransformerConfig

#: Name fragments of each category's kernels (CUDA) and operators (ATen), matched in this order on
#: the name lower-cased with its underscores removed; a name no rule matches is ``other``.
CATEGORY_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention", ("flash", "fmha", "sdpa", "scaleddotproduct", "efficientattention", "cudnnattention")),
    ("gemm", ("gemm", "nvjet", "xmma", "cutlass", "cublas", "wgmma", "s16816", "s1688", "gemv", "splitkreduce",
              "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")),
    ("norm", ("layernorm", "rmsnorm", "gammabeta", "rowwisemoments")),
    ("loss", ("softmax", "nllloss", "crossentropy")),
    ("embedding", ("embedding", "indexselect", "radixsort", "computegradweight", "sumandscatter",
                   "krnpartial", "segmentoffsets")),
    ("optimizer", ("adam", "multitensorapply", "foreach")),
    ("copy", ("copy", "memcpy", "memset", "fill", "aten::cat", "catarray", "transpose", "aten::clone",
              "contiguous", "aten::zero")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "dropout", "gelu", "silu", "sigmoid", "tanh",
                     "aten::add", "aten::mul", "aten::sub", "aten::div", "aten::neg", "aten::rsqrt",
                     "aten::pow", "aten::where", "aten::exp", "aten::cos", "aten::sin", "threshold")),
)

#: The user annotation each phase runs under.
PHASE_LABEL = "parplan::step::"


def kernel_category(name: str) -> str:
    """The category of a kernel or ATen operator by its name (:data:`CATEGORY_RULES`)."""
    key = name.lower().replace("_", "")
    for category, fragments in CATEGORY_RULES:
        if any(f in key for f in fragments):
            return category
    return "other"


def busy_seconds(intervals: Iterable[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (seconds): the time something ran."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


class MixedPrecisionStep:
    """One training step of ``model`` on ``tokens``, in three phases that can be run and timed one by one."""

    def __init__(self, model: nn.Module, tokens: torch.Tensor, labels: torch.Tensor) -> None:
        self.model, self.tokens, self.labels = model, tokens, labels
        self.params = list(dict.fromkeys(p for p in model.parameters() if p.requires_grad))
        self.low = any(p.dtype != torch.float32 for p in self.params)
        self.masters = ([p.detach().float().clone().requires_grad_() for p in self.params] if self.low
                        else self.params)
        self.optimizer = torch.optim.Adam(self.masters, lr=1e-5, foreach=True)
        self.loss: torch.Tensor | None = None

    def forward(self) -> None:
        self.loss = self.model(self.tokens, self.labels)

    def backward(self) -> None:
        assert self.loss is not None
        torch.autograd.backward(self.loss)
        self.loss = None

    def update(self) -> None:
        if self.low:
            for m, p in zip(self.masters, self.params, strict=True):
                m.grad = None if p.grad is None else p.grad.float()
        self.optimizer.step()
        if self.low:
            with torch.no_grad():
                torch._foreach_copy_([p.data for p in self.params], [m.data for m in self.masters])
        self.model.zero_grad(set_to_none=True)
        self.optimizer.zero_grad(set_to_none=True)

    def phases(self) -> dict[str, Callable[[], None]]:
        return {"forward": self.forward, "backward": self.backward, "optimizer": self.update}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _step_seconds(step: MixedPrecisionStep, device: torch.device, repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` whole steps (no synchronisation between phases)."""
    out = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for fn in step.phases().values():
            fn()
        _sync(device)
        out.append(time.perf_counter() - t0)
    return out


def _profiled(step: MixedPrecisionStep, device: torch.device, steps: int) -> Any:
    """Run ``steps`` steps under the profiler, each phase in its annotation and synchronised at its
    end (so its kernels lie inside its annotation's span)."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            for phase, fn in step.phases().items():
                with record_function(PHASE_LABEL + phase):
                    fn()
                    _sync(device)
    return prof


def summarize(events: Any, device_type: str, steps: int, top: int = 40) -> dict[str, Any]:
    """Seconds per phase and category, averaged over ``steps`` profiled steps, from the profiler's
    events: on ``cuda`` the device's kernels (by their span), else the ATen operators (by their
    self time). Also each phase's span (``window_seconds``) and the time something ran in it
    (``busy_seconds``), and the ``top`` kernels by time with the operator that launched each."""
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    windows: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for e in cpu:
        if e.name.startswith(PHASE_LABEL):
            windows[e.name.removeprefix(PHASE_LABEL)].append((e.time_range.start, e.time_range.end))
    cuda = device_type == "cuda"
    # the operators a kernel's ``linked_correlation_id`` names (as torch.autograd.profiler links them)
    launcher = {e.id: e.name for e in cpu if getattr(e, "linked_correlation_id", 0) == 0}
    # a range annotated on the host (a phase, ``Optimizer.step#Adam.step``) is mirrored on the
    # device's timeline under the same name: no kernel
    host_names = {e.name for e in cpu}
    timed = ([e for e in events if e.device_type == DeviceType.CUDA and e.name not in host_names
              and not getattr(e, "is_user_annotation", False)] if cuda
             else [e for e in cpu if e.name.startswith("aten::")])
    phases: dict[str, Any] = {}
    kernels: dict[tuple[str, str], dict[str, Any]] = {}
    for phase in PHASES:
        spans = windows.get(phase, [])
        cats = dict.fromkeys(CATEGORIES, 0.0)
        intervals, count = [], 0
        for e in timed:
            a, b = e.time_range.start, e.time_range.end
            if not any(lo <= a <= hi for lo, hi in spans):  # each phase ends synchronised: what starts in
                continue  # a phase's span is the phase's
            seconds = (b - a) / 1e6 if cuda else e.self_cpu_time_total / 1e6
            cat = "optimizer" if phase == "optimizer" else kernel_category(e.name)
            cats[cat] += seconds / steps
            intervals.append((a / 1e6, b / 1e6))
            count += 1
            by = launcher.get(getattr(e, "linked_correlation_id", 0), "") if cuda else ""
            k = kernels.setdefault((phase, e.name), {"phase": phase, "name": e.name[:200], "category": cat,
                                                     "launched_by": by, "seconds": 0.0, "count": 0})
            k["seconds"] += seconds / steps
            k["count"] += 1
        window = sum(hi - lo for lo, hi in spans) / 1e6 / steps
        busy = (busy_seconds(intervals) if cuda else sum(cats.values()) * steps) / steps
        phases[phase] = {"window_seconds": window, "busy_seconds": busy, "kernels": count // max(steps, 1),
                         "categories": cats}
    ranked = sorted(kernels.values(), key=lambda k: -k["seconds"])[:top]
    return {"phases": phases, "top_kernels": ranked}


def profile_run(cfg: TransformerConfig, micro_batch: int, recompute: str, device: str = "cuda",
                dtype: torch.dtype = torch.bfloat16, warmup: int = 2, timed_steps: int = 5,
                profiled_steps: int = 2, seed: int = 0) -> dict[str, Any]:
    """Train ``cfg`` (micro-batch ``micro_batch`` of ``cfg.seq_len`` tokens, ``recompute`` none,
    selective or full) on ``device`` in ``dtype``: the wall seconds of ``timed_steps`` whole steps,
    then :func:`summarize` of ``profiled_steps`` profiled ones."""
    dev = torch.device(device)
    with dev:  # built and initialised where it runs (a billion weights initialise slowly on a host)
        model = build_model(cfg, seed)
    model = model.to(device=dev, dtype=dtype)
    set_recompute(model, recompute)
    model.train()
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, cfg.vocab, (micro_batch, cfg.seq_len), generator=gen).to(dev)
    labels = torch.randint(0, cfg.vocab, (micro_batch, cfg.seq_len), generator=gen).to(dev)
    step = MixedPrecisionStep(model, tokens, labels)
    _step_seconds(step, dev, warmup)
    walls = _step_seconds(step, dev, timed_steps)
    prof = _profiled(step, dev, profiled_steps)
    out = summarize(prof.events(), dev.type, profiled_steps)
    return {"micro_batch": micro_batch, "seq_len": cfg.seq_len, "recompute": recompute,
            "dtype": str(dtype).removeprefix("torch."), "device": dev.type,
            "attention_kernel": attention_kernel(dev, cfg.dropout_p, dtype),
            "step_seconds": {"median": statistics.median(walls), "all": walls}, **out}
