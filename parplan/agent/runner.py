"""The runner of one strategy on one rank: the model built, cut into stages and parallelised with
PyTorch's own APIs, its training step, and the single-process reference its gradients are checked
against (:mod:`parplan.agent.executor` runs and measures it; the trainer-specific runners, such as
:mod:`parplan.agent.nanotron_exec`, derive from :class:`Runner`)."""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parplan.agent.memtrack import CategoryTracker, mark_activation
from parplan.agent.model import (
    StageModule,
    Transformer,
    build_model,
    set_dropout,
    set_recompute,
    stage_layer_ranges,
)
from parplan.agent.offload import HostOffloadAdam
from parplan.agent.parallelize import apply_dp, apply_tp
from parplan.agent.run_spec import RunSpec as RunSpec  # the spec :func:`run_spec` runs, importable from here
from parplan.solver.cost.pipeline import even_partition
from parplan.solver.frontends.config import TransformerConfig

LEARNING_RATE = 1e-4


# ---------------------------------------------------------------------------------- helpers
def _unique_params(modules: list[nn.Module]) -> list[nn.Parameter]:
    seen: dict[int, nn.Parameter] = {}
    for m in modules:
        for p in m.parameters():
            seen.setdefault(id(p), p)
    return list(seen.values())


def _local(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def _full(t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def _clean_name(name: str) -> str:
    for junk in ("module.", "_checkpoint_wrapped_module.", "_fsdp_wrapped_module."):
        name = name.replace(junk, "")
    return name


def _batch(spec: RunSpec, cfg: TransformerConfig, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch: ``micro_batch x num_microbatches x dp`` samples, same on every rank."""
    n = spec.micro_batch * spec.num_microbatches * spec.dp
    gen = torch.Generator().manual_seed(spec.seed + 1)
    tokens = torch.randint(0, cfg.vocab, (n, spec.seq_len), generator=gen)
    labels = torch.randint(0, cfg.vocab, (n, spec.seq_len), generator=gen)
    return tokens.to(device), labels.to(device)


@dataclass
class Reference:
    loss: float
    grads: dict[str, torch.Tensor]
    loss_after_step: float


#: This process's references by model, seed and batch: a launch runs its specs one after another in
#: the same processes, and specs of one model and batch (the matrix's strategies) share a reference.
#: Kept on the CPU, so a CUDA run's measured memory never holds one; on the CPU the tracker counts
#: only the registered states and what the tracked step makes, not a reference kept from before.
_REFERENCES: dict[tuple[str, int, bytes], Reference] = {}


def reference_for(cfg: TransformerConfig, tokens: torch.Tensor, labels: torch.Tensor, seed: int) -> Reference:
    """:func:`reference`, computed once per process for each model, seed and batch."""
    digest = hashlib.sha256()
    for t in (tokens, labels):
        digest.update(repr((t.dtype, tuple(t.shape))).encode())
        digest.update(t.detach().cpu().contiguous().numpy().tobytes())
    key = (repr(cfg), seed, digest.digest())
    if key not in _REFERENCES:
        ref = reference(cfg, tokens, labels, seed)
        _REFERENCES[key] = Reference(ref.loss, {n: g.cpu() for n, g in ref.grads.items()}, ref.loss_after_step)
    return _REFERENCES[key]


def reference(cfg: TransformerConfig, tokens: torch.Tensor, labels: torch.Tensor, seed: int) -> Reference:
    """Single-process run of the whole global batch: loss, gradients, loss after one Adam step."""
    model = build_model(cfg, seed).to(tokens.device)
    set_dropout(model, False)
    opt = torch.optim.Adam(model.parameters(), lr=LEARNING_RATE, foreach=False)
    loss = model(tokens, labels)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    opt.step()
    with torch.no_grad():
        after = model(tokens, labels)
    return Reference(float(loss.detach()), grads, float(after))


class Runner:
    """One rank's part of the parallel model and its training step."""

    def __init__(self, spec: RunSpec, device: torch.device) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self.spec = spec
        self.device = device
        self.cfg = spec.config()
        self.dtype = torch.bfloat16 if spec.precision == "bf16" else torch.float32
        names = ("pp", "dp", "tp") if spec.tp_inner else ("pp", "tp", "dp")
        sizes = {"pp": spec.pp, "dp": spec.dp, "tp": spec.tp}
        self.mesh = init_device_mesh(device.type, tuple(sizes[n] for n in names), mesh_dim_names=names)
        self.pp_rank = self.mesh.get_local_rank("pp")
        self.dp_rank = self.mesh.get_local_rank("dp")
        self.tp_rank = self.mesh.get_local_rank("tp")
        model: Transformer = build_model(self.cfg, spec.seed).to(device)
        set_recompute(model, spec.recompute)
        self._prepare_model(model)
        if spec.layer_recompute is not None:
            for name, blk in model.layers.items():
                set_recompute(blk, spec.block_recompute(int(name)))
        v = spec.virtual_stages if spec.schedule == "interleaved" else 1
        n_stages = spec.pp * v
        ranges = stage_layer_ranges(self.cfg.layers, spec.partition or even_partition(self.cfg.layers, n_stages))
        self.stage_ids = [self.pp_rank + k * spec.pp for k in range(v)]
        self.stage_modules = [StageModule(model, ranges[s], first=s == 0, last=s == n_stages - 1)
                              for s in self.stage_ids]
        del model
        self.tied = bool(self.cfg.tied_embeddings and spec.pp > 1)
        for sm in self.stage_modules:
            if spec.tp > 1:
                apply_tp(sm, self.mesh["tp"], spec.sequence_parallel)
            if spec.pp > 1 and sm.head is None:
                # torch.distributed.pipelining holds a stage's output until that micro-batch's
                # backward (fwd_cache): memory kept for backward, so count it as an activation.
                sm.register_forward_hook(lambda _m, _i, out: mark_activation(out))
        self.wrapped = [self._data_parallel(sm) for sm in self.stage_modules]
        self.is_first = 0 in self.stage_ids
        self.is_last = n_stages - 1 in self.stage_ids
        self.tie_group = self._tie_group() if self.tied else None
        self.params = _unique_params(list(self.stage_modules))
        self.optimizer: Any = self._make_optimizer()
        self.schedule: Any = None
        self.pipe_stages: list[Any] = []
        if spec.pp > 1:
            self._build_schedule(n_stages)
        tokens, labels = _batch(spec, self.cfg, device)
        rows = spec.micro_batch * spec.num_microbatches
        self.tokens = tokens[self.dp_rank * rows:(self.dp_rank + 1) * rows]
        self.labels = labels[self.dp_rank * rows:(self.dp_rank + 1) * rows]
        self.global_tokens, self.global_labels = tokens, labels

    # ------------------------------------------------------------------ construction
    def _prepare_model(self, model: Transformer) -> None:
        """Change the whole model before it is cut into stages (another trainer's dtype or loss)."""

    def _data_parallel(self, sm: StageModule) -> nn.Module:
        """Data parallelism of one stage (:func:`~parplan.agent.parallelize.apply_dp`)."""
        return apply_dp(sm, self.spec, self.mesh["dp"])

    def _make_optimizer(self) -> Any:
        """Adam over :attr:`params` (``step()``, ``zero_grad(set_to_none=...)``); under ZeRO-1 (DDP),
        ``ZeroRedundancyOptimizer``: each DP rank keeps Adam's states of a share of the parameters
        (whole tensors, greedily balanced by size), steps them and broadcasts them to the others."""
        spec = self.spec
        cls: Any = torch.optim.Adam
        kwargs: dict[str, Any] = {"lr": LEARNING_RATE, "foreach": False}
        if spec.optimizer_offload:
            # Megatron-LM's hybrid optimizer on the (distributed) optimizer's parameters (.offload)
            cls, kwargs = HostOffloadAdam, {**kwargs, "offload_fraction": spec.optimizer_offload}
        if spec.zero == 1 and spec.dp > 1 and not spec.sharded:
            from torch.distributed.optim import ZeroRedundancyOptimizer

            return ZeroRedundancyOptimizer(self.params, optimizer_class=cls,
                                           process_group=self.mesh["dp"].get_group(), **kwargs)
        return cls(self.params, **kwargs)

    def gradient(self, p: nn.Parameter) -> torch.Tensor | None:
        """The step's gradient of ``p`` as the optimizer reads it."""
        return p.grad

    def register_state(self, tracker: CategoryTracker) -> None:
        """Give ``tracker`` the resident storages: parameters and their ``.grad``, the optimizer's
        states, pipelining's receive buffers; an offloaded optimizer's host tensors as host memory."""
        opt = self.local_optimizer
        if isinstance(opt, HostOffloadAdam):
            host_states, host_grads = opt.host_tensors()
            tracker.register_host(host_states, host_grads)
            tracker.register_state(self.stage_modules, [o for o in (opt.device_optimizer,) if o is not None],
                                   communication=self.pipeline_buffers())
            return
        tracker.register_state(self.stage_modules, [opt], communication=self.pipeline_buffers())

    def _tie_group(self) -> Any:
        """Process group joining the first and last pipeline stage of each (dp, tp) position:
        they hold the two copies of the tied embedding and sum their gradients."""
        spec = self.spec
        ranks = self.mesh.mesh  # (pp, dp, tp) tensor of global ranks
        if not spec.tp_inner:
            ranks = ranks.transpose(1, 2)
        mine = None
        for d in range(spec.dp):
            for t in range(spec.tp):
                members = sorted({int(ranks[0, d, t]), int(ranks[spec.pp - 1, d, t])})
                g = dist.new_group(members)
                if dist.get_rank() in members:
                    mine = g
        return mine

    def _build_schedule(self, n_stages: int) -> None:
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

        group = self.mesh["pp"].get_group()
        self.pipe_stages = [PipelineStage(w, s, n_stages, self.device, group=group)
                            for w, s in zip(self.wrapped, self.stage_ids, strict=True)]
        m = self.spec.num_microbatches
        if self.spec.schedule == "interleaved":
            self.schedule = ScheduleInterleaved1F1B(self.pipe_stages, n_microbatches=m, loss_fn=_loss_is_output)
        else:
            cls = ScheduleGPipe if self.spec.schedule == "gpipe" else Schedule1F1B
            self.schedule = cls(self.pipe_stages[0], n_microbatches=m, loss_fn=_loss_is_output)

    # ------------------------------------------------------------------ the step
    @contextlib.contextmanager
    def _loss_ctx(self) -> Iterator[None]:
        if self.spec.tp > 1:
            from torch.distributed.tensor.parallel import loss_parallel

            with loss_parallel():
                yield
        else:
            yield

    def forward_backward(self) -> float | None:
        """Forward and backward of one step; the mean loss of this replica (last stage only)."""
        spec = self.spec
        if spec.pp > 1:
            losses: list[torch.Tensor] = []
            target = torch.zeros(self.tokens.shape[0], device=self.device)
            args = (self.tokens,) if self.is_first else ()
            with self._loss_ctx():
                self.schedule.step(*args, target=target, losses=losses, return_outputs=False, labels=self.labels)
            loss = float(torch.stack([x.detach() for x in losses]).mean()) if self.is_last else None
        else:
            m = spec.num_microbatches
            total = 0.0
            w = self.wrapped[0]
            for j, (tok, lab) in enumerate(zip(self.tokens.chunk(m), self.labels.chunk(m), strict=True)):
                last = j == m - 1
                with self._sync_ctx(w, last), self._loss_ctx():
                    out = w(tok, labels=lab)
                    (out / m).backward()
                total += float(out.detach())
            loss = total / m
        _match_grad_placements(self.params)
        if self.tie_group is not None:
            for p in self._tied_params():
                if p.grad is not None:
                    dist.all_reduce(_local(p.grad), group=self.tie_group)
        return loss

    @contextlib.contextmanager
    def _sync_ctx(self, w: nn.Module, last: bool) -> Iterator[None]:
        """Gradient synchronisation after the last micro-batch only: DDP ``no_sync`` before it, and
        FSDP2 (and ``replicate``) keep unsharded gradients until it, unless the spec asks FSDP2 to
        reduce-scatter every micro-batch into the sharded gradients."""
        from torch.distributed.fsdp import FSDPModule
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(w, DistributedDataParallel) and not last:
            with w.no_sync():
                yield
            return
        if isinstance(w, FSDPModule):
            w.set_requires_gradient_sync(last or self.spec.fsdp_sync_every_microbatch)
        yield

    @property
    def local_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer holding this rank's states (ZeroRedundancyOptimizer's inner one)."""
        inner = getattr(self.optimizer, "optim", None)
        return inner if isinstance(inner, torch.optim.Optimizer) else self.optimizer

    def _tied_params(self) -> list[torch.Tensor]:
        out: list[torch.Tensor] = []
        for sm in self.stage_modules:
            if sm.embed is not None:
                out.append(sm.embed.tokens.weight)
            if sm.head is not None:
                out.append(sm.head.lm.weight)
        return out

    def train_step(self) -> float | None:
        loss = self.forward_backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        return loss

    def replica_loss(self, loss: float | None) -> float | None:
        """The step's loss averaged over data-parallel replicas, on every rank of the last stage."""
        if not self.is_last or loss is None:
            return None
        t = torch.tensor([loss], dtype=torch.float64, device=self.device)
        if self.spec.dp > 1:
            dist.all_reduce(t, group=self.mesh["dp"].get_group())
            t /= self.spec.dp
        return float(t)

    def pipeline_buffers(self) -> list[torch.Tensor]:
        """Receive buffers ``torch.distributed.pipelining`` keeps for every micro-batch."""
        out: list[torch.Tensor] = []
        for st in self.pipe_stages:
            for infos in list(getattr(st, "args_recv_info", {}).values()) + \
                    list(getattr(st, "grad_recv_info", {}).values()):
                for info in infos:
                    buf = getattr(info, "buffer", None)
                    if isinstance(buf, torch.Tensor):
                        out.append(buf)
        return out

    # ------------------------------------------------------------------ checks
    def check(self, ref: Reference) -> dict[str, Any]:
        """Loss and gradients of step 1 and the loss after one Adam step, against ``ref``."""
        for m in self.stage_modules:
            set_dropout(m, False)
        loss = self.replica_loss(self.forward_backward())
        worst_abs = 0.0
        worst_name = ""
        bad: list[str] = []
        n = 0
        for sm in self.stage_modules:
            for name, p in sm.named_parameters():
                name = _clean_name(name)
                key = "embed.tokens.weight" if (self.cfg.tied_embeddings and name == "head.lm.weight") else name
                grad = self.gradient(p)
                if grad is None:
                    bad.append(f"{name}: no gradient")
                    continue
                g = _full(grad).detach().float()
                r = ref.grads[key].to(g.device)
                if g.shape != r.shape:
                    bad.append(f"{name}: shape {tuple(g.shape)} != {tuple(r.shape)}")
                    continue
                err = float((g - r).abs().max())
                if err > worst_abs:
                    worst_abs, worst_name = err, name
                if not torch.allclose(g, r, rtol=self.spec.rtol, atol=self.spec.atol):
                    bad.append(f"{name}: max |diff| {err:.3g}")
                n += 1
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        loss2 = self.replica_loss(self.forward_backward())
        self.optimizer.zero_grad(set_to_none=False)
        for m in self.stage_modules:
            set_dropout(m, True)
        out: dict[str, Any] = {"parameters_compared": n, "max_abs_grad_error": worst_abs,
                               "worst_parameter": worst_name, "mismatches": bad,
                               "rtol": self.spec.rtol, "atol": self.spec.atol}
        if loss is not None and loss2 is not None:
            out.update(loss=loss, reference_loss=ref.loss, loss_after_step=loss2,
                       reference_loss_after_step=ref.loss_after_step)
            for a, b, what in ((loss, ref.loss, "loss"), (loss2, ref.loss_after_step, "loss after one step")):
                if abs(a - b) > self.spec.atol + self.spec.rtol * abs(b):
                    bad.append(f"{what}: {a:.8g} != reference {b:.8g}")
        out["ok"] = not bad
        return out


def _match_grad_placements(params: list[nn.Parameter]) -> None:
    """Give every DTensor gradient its parameter's placements. DTensor computes the gradient of a
    vocabulary-parallel embedding replicated (full size on every TP rank) and the first backward
    stores it as ``.grad`` like that; kept resident it would cost TP times the sharded size."""
    from torch.distributed.tensor import DTensor

    for p in params:
        g = p.grad
        if isinstance(p, DTensor) and isinstance(g, DTensor) and g.placements != p.placements:
            p.grad = g.redistribute(p.device_mesh, p.placements)


def _loss_is_output(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The last stage computes its loss itself (Megatron-style); the schedule just uses it."""
    return output


# ---------------------------------------------------------------------------------- measure
def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
