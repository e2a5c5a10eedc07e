"""nanotron's gradient buffers and loss on PyTorch's DDP: what runtime ``nanotron`` prices
(:mod:`parplan.solver.cost.nanotron`), run on the agent's Llama with data parallelism.

As nanotron trains with ``accumulate_grad_in_fp32`` (read from ``src/nanotron/optim/
gradient_accumulator.py``, ``helpers.py`` and ``parallel/tensor_parallel/functional.py``):

- the weights are bf16 (its accumulator refuses fp32 weights); :class:`Fp32Accumulator` keeps an
  fp32 gradient buffer for every parameter (never sharded) and an fp32 copy of the weights, which
  the optimizer (Adam) updates and copies back into the bf16 weights after each step
  (``FP32GradientAccumulator``, ``OptimizerFromGradientAccumulator``);
- data parallelism is ``DistributedDataParallel`` without ``gradient_as_bucket_view`` (its bf16
  buckets are a copy of the gradients), whose communication hook adds each bucket's gradients into
  the fp32 buffer and all-reduces that (``get_fp32_accum_hook``); micro-batches before the last run
  under ``no_sync``;
- every micro-batch's backward makes the bf16 ``param.grad``, which is added into the fp32 buffer
  (the last micro-batch's by the hook) and set to None once ``loss.backward()`` returns
  (``FP32GradientAccumulator.backward``);
- the loss is Megatron-LM's vocabulary-parallel cross entropy on logits cast to fp32, keeping the
  fp32 softmax for backward and turning it into the gradient in place (``_ShardedCrossEntropy``;
  one tensor-parallel rank here).

gloo has no averaging all-reduce (nanotron's ``ReduceOp.AVG``): the buffers are summed, then divided
in place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, get_type_hints

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import GradBucket  # type: ignore[attr-defined]

from parplan.agent.memtrack import CategoryTracker, made_as_gradients
from parplan.agent.model import StageModule, Transformer
from parplan.agent.runner import LEARNING_RATE, Runner


class Fp32CrossEntropy(torch.autograd.Function):
    """Megatron-LM's cross entropy of fp32 logits (one vocabulary shard): saves the softmax only and
    makes it the logits' gradient in place."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        shifted = logits - logits.max(dim=-1).values.unsqueeze(-1)
        picked = shifted.gather(-1, target.unsqueeze(-1)).squeeze(-1)
        exp = torch.exp(shifted, out=shifted)
        sums = exp.sum(dim=-1)
        loss = torch.log(sums) - picked
        exp.div_(sums.unsqueeze(-1))
        ctx.save_for_backward(exp, target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        softmax, target = ctx.saved_tensors
        rows = torch.arange(softmax.shape[0], device=softmax.device)
        softmax[rows, target] -= 1.0
        softmax.mul_(grad.unsqueeze(-1))
        return softmax, None


def fp32_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """nanotron's ``Loss``: the cross entropy of the logits cast to fp32, averaged over the tokens."""
    per_token: torch.Tensor = Fp32CrossEntropy.apply(  # type: ignore[no-untyped-call]
        logits.flatten(0, 1).float(), labels.flatten(0, 1))
    return per_token.mean()


@dataclass
class Fp32Accumulator:
    """fp32 gradients and weights of ``params`` (the bf16 ones), each in one contiguous buffer."""

    params: list[nn.Parameter]
    grad_buffer: torch.Tensor = field(init=False)
    master_buffer: torch.Tensor = field(init=False)
    grads: dict[int, torch.Tensor] = field(init=False)  # id(param) -> its view of grad_buffer
    masters: list[nn.Parameter] = field(init=False)
    works: list[Any] = field(default_factory=list)
    buckets: dict[int, torch.Tensor] = field(default_factory=dict)  # DDP's, by index (seen by the hook)

    def __post_init__(self) -> None:
        n = sum(p.numel() for p in self.params)
        device = self.params[0].device
        self.grad_buffer = torch.zeros(n, dtype=torch.float32, device=device)
        self.master_buffer = torch.empty(n, dtype=torch.float32, device=device)
        self.grads, self.masters = {}, []
        offset = 0
        for p in self.params:
            self.grads[id(p)] = self.grad_buffer[offset:offset + p.numel()].view_as(p)
            master = nn.Parameter(self.master_buffer[offset:offset + p.numel()].view_as(p))
            with torch.no_grad():
                master.copy_(p)
            self.masters.append(master)
            offset += p.numel()

    def accumulate(self, added_by_hook: bool) -> None:
        """After a micro-batch's backward: add each bf16 gradient (unless the hook did) and drop it."""
        with torch.no_grad():
            for p, master in zip(self.params, self.masters, strict=True):
                assert p.grad is not None
                if not added_by_hook:
                    self.grads[id(p)].add_(p.grad)
                p.grad = None
                master.grad = self.grads[id(p)]

    def hook(self, group: Any, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """DDP's communication hook: add the bucket's gradients into the fp32 buffer and all-reduce
        those; DDP gets its bucket back as it was."""
        self.buckets[bucket.index()] = bucket.buffer()
        for p, g in zip(bucket.parameters(), bucket.gradients(), strict=True):
            buf = self.grads[id(p)]
            buf.add_(g.view_as(buf))
            self.works.append(dist.all_reduce(buf, group=group, async_op=True))
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    def finish(self, dp: int) -> None:
        """Wait for the all-reduces and average."""
        for w in self.works:
            w.wait()
        self.works.clear()
        self.grad_buffer.div_(dp)


# DDP's register_comm_hook compares the hook's annotations with the classes, not their names
Fp32Accumulator.hook.__annotations__ = get_type_hints(Fp32Accumulator.hook)


class OptimizerFromAccumulator:
    """Adam on the fp32 weights, copied into the bf16 ones after each step; zeroing clears the buffer."""

    def __init__(self, acc: Fp32Accumulator) -> None:
        self.acc = acc
        self.optim = torch.optim.Adam(acc.masters, lr=LEARNING_RATE, foreach=False)

    def step(self) -> None:
        self.optim.step()
        with torch.no_grad():
            for p, master in zip(self.acc.params, self.acc.masters, strict=True):
                p.copy_(master)

    def zero_grad(self, set_to_none: bool = False) -> None:
        for p in self.acc.params:
            p.grad = None
        self.acc.grad_buffer.zero_()


class NanotronRunner(Runner):
    """:class:`~parplan.agent.executor.Runner` with nanotron's buffers (module docstring)."""

    acc: Fp32Accumulator

    def _prepare_model(self, model: Transformer) -> None:
        for p in model.parameters():
            p.data = p.data.to(torch.bfloat16)
        model.head.loss_fn = fp32_loss

    def _data_parallel(self, sm: StageModule) -> nn.Module:
        if self.spec.dp == 1:
            return sm
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(sm, process_group=self.mesh["dp"].get_group(), broadcast_buffers=False)
        pre_forward = ddp._pre_forward

        def rebuilt_as_gradients(*args: Any, **kwargs: Any) -> Any:
            # the second step rebuilds DDP's buckets here: they are the gradients' copy, made anew
            with made_as_gradients():
                return pre_forward(*args, **kwargs)  # type: ignore[no-untyped-call]

        ddp._pre_forward = rebuilt_as_gradients  # type: ignore[method-assign]
        return ddp

    def _make_optimizer(self) -> Any:
        self.acc = Fp32Accumulator(self.params)
        w = self.wrapped[0]
        if self.spec.dp > 1:
            assert isinstance(w, nn.parallel.DistributedDataParallel)
            w.register_comm_hook(self.mesh["dp"].get_group(), self.acc.hook)
        return OptimizerFromAccumulator(self.acc)

    def gradient(self, p: nn.Parameter) -> torch.Tensor | None:
        return self.acc.grads.get(id(p))

    def register_state(self, tracker: CategoryTracker) -> None:
        """Besides the parameters and Adam's states: the fp32 gradient buffer and DDP's buckets as the
        last hook saw them (gradients), the fp32 weights (optimizer states). No reference to the buckets
        is kept: DDP frees them when it rebuilds its buckets."""
        super().register_state(tracker)
        tracker.register_state([], [], gradients=[self.acc.grad_buffer, *self.acc.buckets.values()],
                               optimizer_states=[self.acc.master_buffer])
        self.acc.buckets.clear()

    def forward_backward(self) -> float | None:
        m = self.spec.num_microbatches
        w = self.wrapped[0]
        total = 0.0
        for j, (tok, lab) in enumerate(zip(self.tokens.chunk(m), self.labels.chunk(m), strict=True)):
            last = j == m - 1
            with self._sync_ctx(w, last):
                out = w(tok, labels=lab)
                (out / m).backward()
            self.acc.accumulate(added_by_hook=last and self.spec.dp > 1)
            total += float(out.detach())
        self.acc.finish(self.spec.dp)
        return total / m
