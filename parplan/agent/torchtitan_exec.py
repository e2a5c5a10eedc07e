"""Run a torchtitan 0.3.0 export (``torchtitan_args.txt``) with torchtitan's own code and measure it.

The argument file is parsed by torchtitan's ``ConfigManager`` into its ``Trainer.Config``; the ranks
then build what ``torchtitan.trainer.Trainer`` builds from that config, in its order and with its
functions: ``ParallelDims`` from the parallelism section, the registry's model on the meta device
(``update_from_config``), the model spec's ``parallelize_fn`` (tensor parallelism, activation
checkpointing, FSDP2 with the config's mixed precision and resharding policy), ``init_weights``, the
recipe's loss (the chunked cross entropy, with the output layer handed to it) and optimizer, and a
step as ``Trainer.train_step`` runs it (zero the gradients, forward and backward per accumulation
pass, ``clip_grad_norm_``, optimizer and scheduler steps).

What is not the trainer's: the data (random tokens of the model's vocabulary, no tokenizer or data
set), the process group (made by the agent's launcher) and, on a CPU only, two substitutions that
torch 2.13's CPU kernels and gloo force, reported with every measurement:

- attention: torchtitan's llama3 runs FlexAttention, whose backward has no CPU kernel; the ranks use
  torchtitan's own ``ScaledDotProductAttention`` module (causal) instead, which on a CPU runs the
  flash kernel and, like FlexAttention, keeps no sequence-squared tensor for backward;
- gradient reduction: torchtitan reduces FSDP2 gradients with a ``PREMUL_SUM`` (divide factor 1),
  which gloo lacks; the ranks set FSDP2's ``force_sum_reduction_for_comms`` (a plain sum, then a
  division by one).

Pipeline parallelism is refused here (torchtitan builds it through ``pipelining_fn``; not wired yet), and
so is tensor parallelism on a CPU (the CPU flash-attention kernel has no DTensor sharding rule).
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
import types
from collections.abc import Callable
from typing import Any

#: torchtitan's MoE token dispatcher imports these Triton kernels with every model module.
KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"

#: What the CPU ranks run differently from the exported job (see the module docstring).
CPU_SUBSTITUTIONS = (
    "attention: torchtitan's ScaledDotProductAttention (causal, CPU flash kernel) in place of FlexAttention, "
    "which has no CPU backward in torch 2.13; neither keeps a sequence-squared tensor for backward",
    "gradient reduction: FSDP2's force_sum_reduction_for_comms (gloo has no PREMUL_SUM)",
)
DATA_NOTE = "data: random tokens of the model's vocabulary (no tokenizer or data set)"


class TorchtitanRunError(ValueError):
    """The argument file asks for something this runner cannot run."""


def _kernel_stand_in() -> types.ModuleType:
    """A module standing in for torchtitan's Triton kernels: every public name a function that raises."""
    module = types.ModuleType(KERNELS)

    def missing(attr: str) -> Callable[..., Any]:
        if attr.startswith("__"):
            raise AttributeError(attr)

        def kernel(*_: Any, **__: Any) -> Any:
            raise RuntimeError(f"{KERNELS}.{attr} needs Triton")

        return kernel

    module.__getattr__ = missing  # type: ignore[method-assign]
    return module


def stand_in_kernels() -> bool:
    """Without Triton, stand in for the expert-parallel kernels torchtitan imports (a dense Llama
    never calls them); whether the stand-in was installed now."""
    if importlib.util.find_spec("triton") is None and KERNELS not in sys.modules:
        sys.modules[KERNELS] = _kernel_stand_in()
        return True
    return False


def parse_config(args: list[str]) -> Any:
    """torchtitan's ``Trainer.Config`` of ``args`` (the export's arguments), by its own loader."""
    import contextlib
    import io

    stand_in_kernels()
    from torchtitan.config.manager import ConfigManager

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return ConfigManager().parse_args(list(args))
    except SystemExit:  # tyro reports a bad argument and exits
        lines = [ln.strip(" │╭╰─") for ln in err.getvalue().splitlines()]
        detail = "; ".join(ln for ln in lines if ln and not set(ln) <= set("─- ")
                          and not ln.startswith("For full helptext")) or "no detail"
        raise TorchtitanRunError(f"torchtitan's loader refused the arguments: {detail[:600]}") from None


def check_runnable(config: Any, device_kind: str = "cuda") -> None:
    """:class:`TorchtitanRunError` for settings this runner does not run (on ``device_kind``)."""
    par = config.parallelism
    problems = []
    if device_kind == "cpu" and par.tensor_parallel_degree > 1:
        problems.append("tensor parallelism on a CPU (the CPU flash-attention kernel that stands in for "
                        "FlexAttention has no DTensor sharding rule in torch 2.13)")
    if par.pipeline_parallel_degree > 1:
        problems.append("pipeline parallelism (torchtitan's pipelining_fn is not wired into the agent yet)")
    if par.context_parallel_degree > 1 or par.expert_parallel_degree > 1:
        problems.append("context or expert parallelism")
    if config.compile.enable:
        problems.append("torch.compile (--compile.enable)")
    if problems:
        raise TorchtitanRunError("cannot run: " + "; ".join(problems))


class _Job:
    """The trainer's parts on this rank, built from ``config`` as ``Trainer.__init__`` builds them."""

    def __init__(self, config: Any, device_kind: str) -> None:
        import torch
        import torch.distributed as dist
        import torchtitan.distributed.parallel_dims as parallel_dims_module
        import torchtitan.tools.utils as titan_utils
        from torchtitan.config import TORCH_DTYPE_MAP
        from torchtitan.distributed import ParallelDims
        from torchtitan.distributed import utils as dist_utils

        if device_kind == "cpu":  # torchtitan falls back to "cuda" when no accelerator is found
            titan_utils.device_type = "cpu"
            parallel_dims_module.device_type = "cpu"
        self.config = config
        self.device = torch.device(device_kind, torch.cuda.current_device()) if device_kind == "cuda" \
            else torch.device("cpu")
        self.world = dist.get_world_size()
        self.dims = ParallelDims.from_config(config.parallelism, self.world)
        dist_utils.set_spmd_backend(config.parallelism.spmd_backend)
        spec = config.model_spec
        model_config = spec.model
        model_config.update_from_config(config=config)
        if device_kind == "cpu":
            from torchtitan.models.common.attention import ScaledDotProductAttention

            for layer in model_config.layers:
                layer.attention.inner_attention = ScaledDotProductAttention.Config()
        self.vocab = int(model_config.vocab_size)
        with torch.device("meta"), titan_utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
            model = model_config.build()
        self.loss_fn = config.loss.build(compile_config=config.compile)
        model = spec.parallelize_fn(
            model, parallel_dims=self.dims, training=config.training, parallelism=config.parallelism,
            compile_config=config.compile, ac_config=config.activation_checkpoint, dump_folder=config.dump_folder)
        if device_kind == "cpu":
            from torch.distributed.fsdp import FSDPModule

            for m in model.modules():
                if isinstance(m, FSDPModule):
                    m.set_force_sum_reduction_for_comms(True)
        model.to_empty(device=self.device)
        with torch.no_grad():
            model.init_weights(buffer_device=None)
        model.train()
        from torchtitan.components.loss import ChunkedLossWrapper

        if isinstance(self.loss_fn, ChunkedLossWrapper):
            self.loss_fn.set_lm_head(model.lm_head)
            model._skip_lm_head = True
        self.model = model
        self.optimizers = config.optimizer.build(model_parts=[model])
        self.schedulers = config.lr_scheduler.build(optimizers=self.optimizers, training_steps=config.training.steps)
        self.context = dist_utils.get_spmd_context(parallel_dims=self.dims)
        if self.dims.dp_enabled:
            batch_mesh = self.dims.get_mesh("batch")
            self.batch_degree, self.batch_rank = batch_mesh.size(), batch_mesh.get_local_rank()
        else:
            self.batch_degree, self.batch_rank = 1, 0
        tr = config.training
        global_batch = tr.global_batch_size if tr.global_batch_size > 0 else tr.local_batch_size * self.batch_degree
        self.accumulation = global_batch // (tr.local_batch_size * self.batch_degree)

    def batch(self, step: int, index: int) -> tuple[Any, Any]:
        """Input and label tokens of one accumulation pass, the same on every rank of a data-parallel
        replica (tensor-parallel ranks see the same tokens)."""
        import torch

        tr = self.config.training
        g = torch.Generator().manual_seed(1000 * step + 100 * index + self.batch_rank)
        tokens = torch.randint(0, self.vocab, (tr.local_batch_size, tr.seq_len + 1), generator=g)
        return tokens[:, :-1].to(self.device), tokens[:, 1:].contiguous().to(self.device)

    def step(self, step: int) -> float:
        """One optimizer step as ``Trainer.train_step`` runs it (no pipelining); the summed loss."""
        import torch
        from torchtitan.components.loss import IGNORE_INDEX
        from torchtitan.distributed import utils as dist_utils

        self.optimizers.zero_grad(set_to_none=self.config.training.disable_cuda_graphs)
        batches = [self.batch(step, i) for i in range(self.accumulation)]
        local_tokens = sum(int((labels != IGNORE_INDEX).sum()) for _, labels in batches)
        valid = torch.tensor(local_tokens, dtype=torch.int64, device=self.device)
        if self.dims.dp_enabled:
            valid = dist_utils.dist_sum_tensor(valid, self.dims.get_mesh("batch"))
        total = 0.0
        for inputs, labels in batches:
            with self.context():
                pred = self.model(inputs)
                loss, _ = self.loss_fn(pred, labels, valid)
                del pred
                loss.backward()
            total += float(loss.detach())
        dist_utils.clip_grad_norm_(list(self.model.parameters()), self.config.training.max_norm,
                                   foreach=True, pp_mesh=None, ep_enabled=self.dims.ep_enabled)
        self.optimizers.step()
        self.schedulers.step()
        return total


def run_rank(args: list[str], timing_steps: int) -> dict[str, Any]:
    """On one rank of an initialised process group: build the job of ``args``, run a first step
    (the optimizer creates its states), measure the second with the agent's tracker, time more."""
    import torch
    import torch.distributed as dist

    from parplan.agent.executor import device_for_rank
    from parplan.agent.memtrack import CategoryTracker

    device = device_for_rank()
    config = parse_config(args)
    check_runnable(config, device.type)
    job = _Job(config, device.type)
    losses = [job.step(0)]
    dist.barrier()
    tracker = CategoryTracker()
    tracker.register_state([job.model], list(getattr(job.optimizers, "optimizers", [job.optimizers])))
    with tracker.measuring():
        losses.append(job.step(1))
    measured = tracker.result(job.device)
    del tracker
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        losses.append(job.step(2))
        torch.cuda.synchronize(device)
        measured["tracker_peak_bytes"] = measured["peak_bytes"]
        measured["peak_bytes"] = int(torch.cuda.max_memory_allocated(device))
    times = []
    for i in range(max(1, timing_steps)):
        dist.barrier()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        losses.append(job.step(3 + i))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return {"rank": dist.get_rank(), "device": device.type, "measured": measured, "losses": losses,
            "step_seconds": {"median": statistics.median(times), "all": times},
            "parameters_local": sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                                    for p in job.model.parameters())}


def torchtitan_args(text: str) -> list[str]:
    """The arguments of an export's ``torchtitan_args.txt`` (one a line) or of a ``torchrun ...
    -m torchtitan.train ...`` line, shell variables left out (ImportProblemError if it does not split)."""
    from parplan.imports.torchtitan import split_launch

    return [w for w in split_launch(text)[1] if not w.startswith("$")]


def measure(text: str, nprocs: int, device_kind: str, timing_steps: int = 2) -> list[dict[str, Any]]:
    """Run the torchtitan job of ``text`` on ``nprocs`` local ranks; one report per rank."""
    from parplan.agent.launch import launch_function

    args = torchtitan_args(text)
    check_runnable(parse_config(args), device_kind)  # fail before starting processes
    return launch_function(run_rank, (args, timing_steps), nprocs, device_kind)


__all__ = ["CPU_SUBSTITUTIONS", "DATA_NOTE", "TorchtitanRunError", "measure", "parse_config", "run_rank",
           "torchtitan_args"]
