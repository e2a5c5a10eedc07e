"""Per-category memory measurement on top of PyTorch's ``MemTracker``.

``torch.distributed._tools.mem_tracker.MemTracker`` sees every tensor storage that a dispatched
op creates, frees or resizes (FSDP2 frees unsharded parameters with ``storage.resize_``, which it
also patches) and records the peak. Its own categories are "created in forward" (activation)
versus "created in backward" (temporary), which files ZeRO-3's gathered weights, the logits and
every forward intermediate under activations. :class:`CategoryTracker` keeps MemTracker's
bookkeeping but assigns categories by what a storage *is*, which is what the cost model's
categories mean:

- ``parameters``, ``gradients``, ``optimizer_states``: the storages of the model's resident
  parameters (the local shards under TP / FSDP2), of their ``.grad`` and of the optimizer's
  state, registered before the measured step (:meth:`CategoryTracker.register_state`);
- ``activations``: storages autograd packs for backward during the forward pass (an outermost
  ``saved_tensors_hooks``), plus what the executor marks explicitly because something other than
  autograd keeps it for backward (a checkpointed block's input; a pipeline stage's output, which
  ``torch.distributed.pipelining`` holds until that micro-batch's backward);
- ``temporary``: every other storage created during the step (gradients of activations, gathered
  ZeRO-3 weights, communication buffers, recomputed activations, workspace), and the receive
  buffers ``torch.distributed.pipelining`` allocates once per micro-batch before the step
  (communication buffers, docs/design.md's definition of temporary; registered as resident, so a
  received activation that autograd saves stays there);
- ``other``: resident storages that are none of the above (module buffers such as RoPE tables).

Two measurements come out: the breakdown at the moment of the peak total, and the peak of each
category over the step (the cost model's categories are themselves per-category peaks).

Host memory: an offloaded optimizer (:mod:`parplan.agent.offload`) keeps its tensors in the host's
memory, which on a CPU run is the same memory as the "device"'s. The tracker tells them apart by
what owns a storage, not by its device: the storages registered as host
(:meth:`CategoryTracker.register_host`) and those made inside :func:`made_on_host` (the host
optimizer's step) are filed under :data:`HOST`, a key of their own beside the device's, with their own
categories and peak; the device's peak never counts them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.distributed._tools.common_utils import get_untyped_storages
from torch.distributed._tools.mem_tracker import _TOTAL_KEY, MemTracker, _MemRefType, _UpdateType
from torch.utils.weak import WeakIdKeyDictionary

#: Output categories, in the cost model's order, plus ``other``.
CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "temporary", "other")

_TO_CATEGORY = {
    _MemRefType.PARAM: "parameters",
    _MemRefType.GRAD: "gradients",
    _MemRefType.OPT: "optimizer_states",
    _MemRefType.ACT: "activations",
    _MemRefType.TEMP: "temporary",
    _MemRefType.BUFFER: "other",
    _MemRefType.OTH: "other",
}

#: The key host storages are filed under (a CPU device index no tensor of a run has), apart from the
#: run's device (``cpu`` or ``cuda:N``) even when that is the CPU.
HOST = torch.device("cpu", 1)

#: Set by the executor's model code to mark tensors kept for backward outside autograd's saved
#: tensors (``None`` when no tracker is active).
_ACTIVE: CategoryTracker | None = None


def mark_activation(t: torch.Tensor) -> None:
    """Count ``t`` as an activation if a :class:`CategoryTracker` is measuring."""
    if _ACTIVE is not None:
        _ACTIVE.relabel_as_activation(t)


@contextmanager
def made_as_gradients() -> Iterator[None]:
    """Floating-point storages made inside count as gradients (a data-parallel wrapper's gradient
    buckets made anew during the step; its integer bookkeeping stays temporary), if a
    :class:`CategoryTracker` is measuring."""
    tracker = _ACTIVE
    if tracker is None:
        yield
        return
    tracker._making_gradients = True
    try:
        yield
    finally:
        tracker._making_gradients = False


@contextmanager
def made_on_host() -> Iterator[None]:
    """Storages made inside are host memory (an offloaded optimizer's step on the host's CPUs), if a
    :class:`CategoryTracker` is measuring."""
    tracker = _ACTIVE
    if tracker is None:
        yield
        return
    tracker._making_host = True
    try:
        yield
    finally:
        tracker._making_host = False


class CategoryTracker(MemTracker):  # type: ignore[no-untyped-call]
    """MemTracker with categories by role (see the module docstring) and per-category peaks."""

    def __init__(self, diagnose: bool = False) -> None:
        super().__init__()
        self._resident: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._gathered: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._category_peaks: dict[torch.device, dict[str, int]] = {}
        self._diagnose = diagnose
        self._func = ""
        self._origin: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._making_gradients = False  # inside made_as_gradients
        self._making_host = False  # inside made_on_host
        self._host: WeakIdKeyDictionary = WeakIdKeyDictionary()  # storages filed under HOST
        #: With ``diagnose``: per category, the live storages (bytes, creating op, module) at
        #: that category's peak.
        self.peak_contents: dict[str, list[tuple[int, str]]] = {}

    # ----------------------------------------------------------------- registration
    def register_state(self, modules: Iterable[nn.Module], optimizers: Iterable[torch.optim.Optimizer],
                       other: Iterable[torch.Tensor] = (), communication: Iterable[torch.Tensor] = (),
                       gradients: Iterable[torch.Tensor] = (), optimizer_states: Iterable[torch.Tensor] = ()) -> None:
        """Record the resident storages (call before entering the tracker); ``communication``:
        buffers allocated before the step for its collectives (temporary); ``gradients`` and
        ``optimizer_states``: such buffers a trainer keeps besides the parameters' ``.grad`` and
        the optimizers' state (an accumulation buffer, master weights)."""
        for m in modules:
            for p in m.parameters():
                self._register(p, _MemRefType.PARAM)
                if p.grad is not None:
                    self._register(p.grad, _MemRefType.GRAD)
            for b in m.buffers():
                self._register(b, _MemRefType.BUFFER)
        for opt in optimizers:
            for state in opt.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        self._register(v, _MemRefType.OPT)
        for t in other:
            self._register(t, _MemRefType.OTH)
        for t in communication:
            self._register(t, _MemRefType.TEMP)
        for t in gradients:
            self._register(t, _MemRefType.GRAD)
        for t in optimizer_states:
            self._register(t, _MemRefType.OPT)

    def register_host(self, optimizer_states: Iterable[torch.Tensor] = (),
                      gradients: Iterable[torch.Tensor] = ()) -> None:
        """Record resident storages an offloaded optimizer keeps on the host (call before entering
        the tracker): its master weights and moments (``optimizer_states``) and the gradient buffers
        the device's gradients are copied into (``gradients``). They count under :data:`HOST`."""
        for reftype, tensors in ((_MemRefType.OPT, optimizer_states), (_MemRefType.GRAD, gradients)):
            for t in tensors:
                for st in get_untyped_storages(t):
                    self._host[st] = True
                self._register(t, reftype)

    def _register(self, t: torch.Tensor, reftype: _MemRefType) -> None:
        for st in get_untyped_storages(t):
            self._resident[st] = reftype
        self._update_and_maybe_create_winfos(t, reftype)

    def _update_and_maybe_create_winfos(self, t: torch.Tensor, reftype: Any,
                                        update_existing: bool = False) -> Any:
        winfos = super()._update_and_maybe_create_winfos(t, reftype, update_existing)
        self._file_host(t)
        return winfos

    def _file_host(self, t: torch.Tensor) -> None:
        """Move ``t``'s host storages (and, inside :func:`made_on_host`, every new one) to :data:`HOST`."""
        for st in get_untyped_storages(t):
            if self._making_host and st not in self._resident:
                self._host[st] = True
            if st not in self._host:
                continue
            winfo, _ = self._WINFO.get(st, (None, None))  # type: ignore[no-untyped-call]
            if winfo is None or winfo.device == HOST:
                continue
            if winfo.mem_consumed > 0:
                self._update_snap(_UpdateType.DEL, winfo)
            winfo.device = HOST
            if winfo.mem_consumed > 0:
                self._update_snap(_UpdateType.ADD, winfo)

    # ----------------------------------------------------------------- classification
    def _track(self, reftype: Any, t: torch.Tensor) -> None:
        # Everything a step creates is temporary until it is packed for backward (or marked).
        gradient = self._making_gradients and t.is_floating_point()
        super()._track(_MemRefType.GRAD if gradient else _MemRefType.TEMP, t)
        self._file_host(t)
        if self._diagnose:
            active = [p for p in self._mod_tracker.parents if p != "Global"]
            where = max(active, key=lambda p: (p.count("."), p)) if active else ""
            phase = "bw" if self._mod_tracker.is_bw else "fw"
            for st in get_untyped_storages(t):
                if st not in self._origin and st not in self._resident:
                    self._origin[st] = f"{self._func} [{phase} {where}]"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self._func = str(func)
        return super().__torch_dispatch__(func, types, args, kwargs)  # type: ignore[no-untyped-call]

    def _track_module_params_and_buffers(self, module: nn.Module, install_grad_hooks: bool = True) -> tuple[int, int]:
        # Resident parameters were registered up front; a module parameter that is not resident
        # is a gathered (FSDP2-unsharded) copy: temporary, and never an activation.
        param_mem = 0
        for p in module.parameters():
            for st in get_untyped_storages(p):
                if st not in self._resident:
                    self._gathered[st] = True
            winfos = self._update_and_maybe_create_winfos(p, self._role(p, _MemRefType.TEMP))
            param_mem += sum(w.mem_consumed for w in winfos)
        buffer_mem = 0
        for b in module.buffers():
            winfos = self._update_and_maybe_create_winfos(b, self._role(b, _MemRefType.BUFFER))
            buffer_mem += sum(w.mem_consumed for w in winfos)
        return param_mem, buffer_mem

    def _role(self, t: torch.Tensor, default: _MemRefType) -> _MemRefType:
        for st in get_untyped_storages(t):
            role = self._resident.get(st)  # type: ignore[no-untyped-call]
            if role is not None:
                return role  # type: ignore[no-any-return]
        return default

    def relabel_as_activation(self, t: torch.Tensor) -> None:
        """Move ``t``'s storages from temporary to activations (resident and gathered storages
        keep their category)."""
        if not isinstance(t, torch.Tensor):
            return
        for st in get_untyped_storages(t):
            if st in self._resident or st in self._gathered:
                continue
            winfo, _ = self._WINFO.get(st, (None, None))  # type: ignore[no-untyped-call]
            if winfo is None:
                self._update_and_maybe_create_winfos(t, _MemRefType.ACT)
            elif winfo.reftype == _MemRefType.TEMP:
                old = winfo.reftype
                winfo.reftype = _MemRefType.ACT
                self._update_snap(_UpdateType.REF, winfo, old_reftype=old)
        self._update_peak_stats(None)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        if not self._mod_tracker.is_bw:
            self.relabel_as_activation(t)
        return t

    # ----------------------------------------------------------------- repeated calls
    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        # A pipeline stage (or a gradient-accumulation loop) calls its root module once per
        # micro-batch; MemTracker refuses a second root call, so start the module's stats anew.
        if module in self.memory_tracking and not self._mod_tracker.is_bw:
            name = self._mod_tracker.get_known_fqn(module)  # type: ignore[no-untyped-call]
            if set(self._mod_tracker.parents) - {name} == {"Global"}:
                del self.memory_tracking[module]
        super()._pre_fw_hook(module, inputs)

    # ----------------------------------------------------------------- peaks
    def _update_peak_stats(self, peak_state: Any) -> None:
        # Per-module peaks (MemTracker's walk over every tracked module at every operator: 8 matrix
        # runs took 31.6 s with it, 24.6 s without) are read only by :meth:`module_peaks`, i.e. with
        # ``diagnose``; the device's peak below is MemTracker's own rule either way.
        if peak_state is not None and self._diagnose:
            super()._update_peak_stats(peak_state)
        else:
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap[_TOTAL_KEY]:
                    self._peak_mem[dev] = snap[_TOTAL_KEY]
                    self._peak_mem_snap[dev] = dict(snap)
        for dev, snap in self._curr_mem_snap.items():
            peaks = self._category_peaks.setdefault(dev, {})
            for k, v in snap.items():
                if v > peaks.get(k, 0):
                    peaks[k] = v
                    if self._diagnose and k != _TOTAL_KEY:
                        self._record_contents(k)
        if self._diagnose and self._curr_mem_snap:
            total = sum(s.get(_TOTAL_KEY, 0) for s in self._curr_mem_snap.values())
            if total >= max(self._peak_mem.values(), default=0):
                self._record_contents(None)

    def _record_contents(self, reftype: Any) -> None:
        live: list[tuple[int, str]] = []
        for st, (winfo, _) in list(self._WINFO.items()):  # type: ignore[no-untyped-call]
            if (reftype is None or winfo.reftype == reftype) and winfo.mem_consumed > 0:
                label = self._origin.get(st, "resident")  # type: ignore[no-untyped-call]
                if reftype is None:
                    label = f"{_TO_CATEGORY[winfo.reftype]}: {label}"
                live.append((winfo.mem_consumed, label))
        live.sort(reverse=True)
        self.peak_contents["total" if reftype is None else _TO_CATEGORY[reftype]] = live

    @contextmanager
    def measuring(self) -> Iterator[CategoryTracker]:
        """Enter the tracker with the activation hooks installed."""
        global _ACTIVE
        with torch.autograd.graph.saved_tensors_hooks(self._pack, _identity), self:
            _ACTIVE = self
            try:
                yield self
            finally:
                _ACTIVE = None

    # ----------------------------------------------------------------- results
    def _categorised(self, snap: dict[Any, int]) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for k, v in snap.items():
            if k == _TOTAL_KEY:
                continue
            out[_TO_CATEGORY[k]] += int(v)
        return out

    def result(self, device: torch.device) -> dict[str, Any]:
        """``peak_bytes``, ``breakdown`` (per-category peaks) and ``at_peak`` for ``device``."""
        peak_snap = self._peak_mem_snap.get(device, {})
        peaks = self._category_peaks.get(device, {})
        return {
            "peak_bytes": int(self._peak_mem.get(device, 0)),
            "breakdown": self._categorised(peaks),
            "at_peak": self._categorised(peak_snap),
        }

    def host_result(self) -> dict[str, Any]:
        """What the host held for an offloaded optimizer: ``peak_bytes`` over the step, ``breakdown``
        (per-category peaks: ``optimizer_states`` for the master weights and moments, ``gradients`` for
        the copied gradients, ``temporary`` for what its step made) and ``resident_bytes``, the
        registered storages alone."""
        out = self.result(HOST)
        host: list[torch.UntypedStorage] = list(self._host.keys())  # type: ignore[no-untyped-call]
        out["resident_bytes"] = sum(int(st.nbytes()) for st in host if st in self._resident)
        return out

    def module_peaks(self, depth: int = 3) -> dict[str, dict[str, dict[str, int]]]:
        """Per module (up to ``depth`` levels): the categories at its forward and backward peaks."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for stats in self.memory_tracking.values():  # type: ignore[no-untyped-call]
            if stats.mod_fqn.count(".") + 1 > depth:
                continue
            entry: dict[str, dict[str, int]] = {}
            for state in ("Peak-Forward", "Peak-Backward"):
                snaps = [s for st, lst in stats.snapshots.items() if st.value == state for s in lst]
                best: dict[str, int] | None = None
                for snap in snaps:
                    for dev_snap in snap.values():
                        cat = self._categorised(dev_snap)
                        cat["total"] = int(dev_snap.get(_TOTAL_KEY, 0))
                        if best is None or cat["total"] > best["total"]:
                            best = cat
                if best is not None:
                    entry[state] = best
            out[stats.mod_fqn] = entry
        return out


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


def storages_of(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages behind ``tensors``."""
    seen: dict[int, int] = {}
    for t in tensors:
        for st in get_untyped_storages(t):
            seen[id(st)] = st.nbytes()
    return sum(seen.values())


__all__ = ["CATEGORIES", "HOST", "CategoryTracker", "made_as_gradients", "made_on_host", "mark_activation",
           "storages_of"]
