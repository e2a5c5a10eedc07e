"""An offloaded optimizer as Megatron-LM runs it, on the agent's Adam (``RunSpec.optimizer_offload``).

Megatron-LM's ``HybridDeviceOptimizer`` (``megatron/core/optimizer/cpu_offloading/hybrid_optimizer.py``;
``--optimizer-cpu-offload --optimizer-offload-fraction F``) receives the parameters of this rank's optimizer
(the distributed optimizer's shard) and, in their order, moves whole tensors to the host until the moved
elements reach ``F`` of the total (``_get_sub_optimizer_param_groups``: a tensor is moved while the count
is still below the threshold). For each moved tensor the host keeps:

- a copy of the weight (``param.detach().clone().cpu()``, pinned; fp32 with ``param_update_in_fp32``):
  the master weight the host's optimizer updates;
- a gradient buffer of the same shape and type (``torch.empty(param.shape, dtype=param.dtype,
  pin_memory=...)``, ``_set_sub_optimizer_grads``) the device's gradient is copied into before each step;
- the host optimizer's Adam moments: ``torch.optim.AdamW(..., fused=True)`` on the host tensors
  (``megatron/core/optimizer/__init__.py`` imports ``AdamW as CPUAdam``), whose fused kernel updates in
  place.

The other tensors stay with the device's optimizer. After the host's step, each moved weight is copied
back into the device's parameter (``param_copy_back_gpu_hook``). :class:`HostOffloadAdam` does the same
around the agent's ``torch.optim.Adam`` (no weight decay, so Adam is AdamW here); under ZeRO-1 it is
``ZeroRedundancyOptimizer``'s optimizer class, i.e. it runs on the rank's shard, as Megatron-LM's runs on
the distributed optimizer's. The cost model's rule is ``parplan.solver.cost.offload``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from parplan.agent.memtrack import made_on_host


def offloaded_prefix(numels: list[int], fraction: float) -> int:
    """How many of the tensors (element counts, in the optimizer's order) the hybrid optimizer moves to the
    host: whole tensors, while the moved count is below ``fraction`` of the total."""
    threshold = fraction * sum(numels)
    moved = 0
    for i, n in enumerate(numels):
        if moved >= threshold:
            return i
        moved += n
    return len(numels)


def _host_copy(p: torch.Tensor) -> torch.Tensor:
    """The host's copy of a weight: a new CPU tensor (pinned when the weight is on a GPU), fp32."""
    host = p.detach().to("cpu", dtype=torch.float32, copy=True)
    return host.pin_memory() if p.is_cuda else host


class HostOffloadAdam(torch.optim.Optimizer):
    """Adam with ``offload_fraction`` of its parameters stepped on the host (see the module docstring):
    the device's part by ``torch.optim.Adam(foreach=False)``, the host's by ``torch.optim.Adam(fused=True)``
    on fp32 host copies, with gradients copied to the host before and weights copied back after."""

    def __init__(self, params: Iterable[Any], lr: float, offload_fraction: float, foreach: bool = False) -> None:
        super().__init__(params, defaults={"lr": lr})
        flat: list[nn.Parameter] = [p for g in self.param_groups for p in g["params"]]
        n_host = offloaded_prefix([p.numel() for p in flat], offload_fraction)
        #: device parameter -> (host master weight, host gradient buffer)
        self.host_of: dict[nn.Parameter, tuple[torch.Tensor, torch.Tensor]] = {}
        for p in flat[:n_host]:
            master = _host_copy(p)
            grad = torch.empty(master.shape, dtype=master.dtype, pin_memory=p.is_cuda)
            self.host_of[p] = (master, grad)
        self.host_optimizer = (torch.optim.Adam([m for m, _ in self.host_of.values()], lr=lr, fused=True)
                               if self.host_of else None)
        rest = flat[n_host:]
        self.device_optimizer = torch.optim.Adam(rest, lr=lr, foreach=foreach) if rest else None

    @property
    def offloaded_elements(self) -> int:
        return sum(p.numel() for p in self.host_of)

    def host_tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The host's optimizer states (master weights, then Adam's states) and its gradient buffers."""
        states = [m for m, _ in self.host_of.values()]
        if self.host_optimizer is not None:
            states += [v for st in self.host_optimizer.state.values() for v in st.values()
                       if isinstance(v, torch.Tensor)]
        return states, [g for _, g in self.host_of.values()]

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        lr = self.param_groups[0]["lr"]
        for opt in (self.device_optimizer, self.host_optimizer):
            if opt is not None:
                for g in opt.param_groups:
                    g["lr"] = lr
        if self.device_optimizer is not None:
            self.device_optimizer.step()
        if self.host_optimizer is None:
            return
        with made_on_host():
            for p, (master, buf) in self.host_of.items():
                if p.grad is None:
                    master.grad = None
                    continue
                buf.copy_(p.grad)  # device to host
                master.grad = buf
            self.host_optimizer.step()
        for p, (master, _) in self.host_of.items():
            p.copy_(master)  # host to device


__all__ = ["HostOffloadAdam", "offloaded_prefix"]
