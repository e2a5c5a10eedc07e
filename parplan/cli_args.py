"""The command line's shared arguments: :class:`UsageError`, argparse types, the strategy and plan
flags, and what they build (a strategy, an HTTP plan request). Every subcommand module imports
them from here, never from :mod:`parplan.cli`, so the CLI's modules import in one direction."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from parplan.solver.cluster import GPU_PRESETS, make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.precision import PRECISIONS
from parplan.solver.cost.runtime import Runtime
from parplan.solver.models import ModelSource, resolve_model
from parplan.solver.objective import DEFAULT_MAX_SLOWDOWN
from parplan.solver.request_defaults import DEFAULT_GPU, DEFAULT_PRECISION, DEFAULT_TIME_LIMIT_SECONDS
from parplan.solver.strategy import ParallelConfig, Schedule, microbatches_for
from parplan.solver.targets import Target

if TYPE_CHECKING:
    from parplan.solver.request import PlanRequestIn


class UsageError(Exception):
    """A command-line argument that cannot be honoured (exit status 2)."""


class Parser(argparse.ArgumentParser):
    """argparse's parser, but a bad argument is one line on standard error (``parplan plan: error:
    argument --gpus: expected a positive integer, got 0``) and exit status 2: the usage is printed by
    ``--help`` only. Subcommands' parsers are of this class too (``add_subparsers`` uses the parent's)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def int_at_least(minimum: int, why: str = "") -> Callable[[str], int]:
    """An argparse type: an integer of at least ``minimum`` (``why`` is added to the error)."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}{why}, got {value}")
        return value
    return parse


positive = int_at_least(1)

#: ``--tp`` and ``--pp`` when not given.
DEFAULT_DEGREE = 1


def recompute_policy(text: str) -> str:
    """``--recompute``'s value: a named policy or a Megatron-LM module set (``selective:core_attn+mlp``)."""
    try:
        return Recompute(text).value
    except ValueError as e:
        why = str(e) if text.startswith("selective:") else (
            f"expected {', '.join(r.value for r in Recompute)} or selective:MODULE+MODULE, got {text!r}")
        raise argparse.ArgumentTypeError(why) from None


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def mesh(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 2x4, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes like 2x4, got {text!r}")
    return sizes


def add_cluster_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--gpus", type=positive, required=required, help="number of devices")
    p.add_argument("--gpus-per-node", type=positive, default=None, help="devices per node (default: the GPU's)")
    p.add_argument("--gpu", default=DEFAULT_GPU, help=f"GPU preset: {', '.join(GPU_PRESETS)} (default {DEFAULT_GPU})")
    p.add_argument("--gpu-memory-gib", type=positive_float, default=None, help="override the device memory (GiB)")
    p.add_argument("--host-memory-gib", type=positive_float, default=None,
                   help="override one machine's host memory (GiB; default: the GPU preset's reference system), "
                        "which an offloaded optimizer must fit")


def add_strategy_args(p: argparse.ArgumentParser, importable: bool = False, expert_tensor: bool = False) -> None:
    """The strategy flags; ``importable``: they may come from a trainer's file instead (``--from``);
    ``expert_tensor``: with ``--expert-tensor-parallel`` (what is priced, not what an agent runs)."""
    p.add_argument("--model", required=not importable,
                   help="preset name (see `parplan models`), graph JSON or HF config.json")
    add_cluster_args(p, required=not importable)
    # left None when not given, so that --from can tell a degree given from its default
    p.add_argument("--tp", type=positive, default=None, help=f"tensor-parallel degree (default {DEFAULT_DEGREE})")
    p.add_argument("--pp", type=positive, default=None, help=f"pipeline-parallel degree (default {DEFAULT_DEGREE})")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                   help="ZeRO stage over the data-parallel group (1 = Megatron's distributed optimizer)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs tp > 1)")
    p.add_argument("--recompute", type=recompute_policy, default="selective", metavar="{none,selective,full,op}",
                   help="activation recomputation (default selective; op: torchtitan's per-operator policy, "
                        "PyTorch-native runtimes only; selective:MODULE+MODULE: Megatron-LM's --recompute-modules, "
                        "e.g. selective:core_attn+mlp, runtime megatron only)")
    p.add_argument("--micro-batch", type=positive, default=1, help="samples per micro-batch (default 1)")
    p.add_argument("--global-batch", type=positive, default=None,
                   help="samples per step (default: micro-batch x dp x 4pp, or x 1 without pipelining)")
    p.add_argument("--seq-len", type=positive, default=None, help="tokens per sample (default: the model's)")
    p.add_argument("--schedule", choices=[s.value for s in Schedule], default="1f1b", help="pipeline schedule")
    p.add_argument("--virtual-stages", type=positive, default=2,
                   help="model chunks per device for --schedule interleaved or interleaved-zb (default 2; zbv runs "
                        "exactly 2)")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="attention materialises the s x s scores (adds Korthikanti's 5as/h term)")
    p.add_argument("--precision", choices=list(PRECISIONS), default=DEFAULT_PRECISION,
                   help="bf16 (default: fp32 grads + master + Adam, 18 B/param), bf16-grad16 (16 B/param), "
                        "bf16-states16 (every model state in bf16, DeepSpeed's bf16 master weights and optimizer "
                        "states, 10 B/param), fp16, fp16-grad16, fp32, fp8 (Transformer Engine's FP8 recipe, "
                        "20 B/param), fp8-cs (the same with current scaling), fp8-grad16 and fp8-cs-grad16 (those "
                        "with 16-bit gradients); torchao's Float8 as torchtitan runs it (--runtime torchtitan only): "
                        "fp8-torchao (tensorwise, bf16's bytes), fp8-torchao-fsdp8 (the same with FSDP2's float8 "
                        "all-gather) and fp8-torchao-rowwise; bf16, bf16-grad16, fp8 and fp8-grad16 with Transformer "
                        "Engine FusedAdam's low-precision states (--runtime megatron or torch): -remainders (the fp32 "
                        "master as the bf16 weight and its 16-bit remainder, 2 B/param less), -moments-bf16 (Adam's "
                        "moments in bf16, 4 B/param less) or -remainders-moments-bf16")
    p.add_argument("--expert-parallel", type=positive, default=1, help="expert-parallel degree (MoE), divides dp")
    if expert_tensor:
        p.add_argument("--expert-tensor-parallel", type=positive, default=None, metavar="N",
                       help="the experts' own tensor-parallel degree (Megatron-LM's --expert-tensor-parallel-size; "
                            "default: --tp): each expert split over N ranks, the experts' data-parallel group "
                            "tp x dp x cp / (N x ep); needs --sequence-parallel with tp > 1")
    p.add_argument("--dp-shard", type=int, default=0, metavar="N",
                   help="hybrid sharded data parallelism (needs --zero 1-3): ZeRO shards within groups of N "
                        "data-parallel ranks, replicated across the dp/N groups (torchtitan's "
                        "data_parallel_shard_degree; Megatron-LM's --num-distributed-optimizer-instances dp/N); "
                        "default 0: all of dp")
    p.add_argument("--cp", type=positive, default=1,
                   help="context-parallel degree (ring attention, Megatron-LM's --context-parallel-size): the "
                        "sequence split over CP ranks; 2 x CP must divide the sequence length")
    p.add_argument("--cp-comm", choices=["p2p", "a2a"], default="p2p",
                   help="how attention exchanges under context parallelism: the p2p ring (default) or all-to-alls "
                        "(a2a, Ulysses: tp x cp must divide the heads)")
    p.add_argument("--sync-every-microbatch", action="store_true",
                   help="reduce gradients after every micro-batch, not only the last (FSDP2 with gradient sync on "
                        "for every backward)")
    p.add_argument("--tp-comm-overlap", action="store_true",
                   help="time only: Megatron-LM's --tp-comm-overlap (needs --sequence-parallel): TP collectives "
                        "hidden under the GEMMs beside them")
    p.add_argument("--overlap-param-gather", action="store_true",
                   help="time only: Megatron-LM's --overlap-param-gather (needs --zero 1 or 2, its distributed "
                        "optimizer): the updated weights' all-gather hidden under the next forward")
    p.add_argument("--no-overlap-grad-reduce", action="store_true",
                   help="time only: Megatron-LM without --overlap-grad-reduce (runtime megatron): the gradient "
                        "reduction runs after the backward instead of under it")
    p.add_argument("--pp-scatter-gather", action="store_true",
                   help="time only: Megatron-LM's pipeline hand-offs of 2021-22 (its default from February 2021 "
                        "until the move into Megatron-Core in January 2023; runtime megatron): without sequence "
                        "parallelism each TP rank sends 1/tp of the activation, all-gathered over TP after")
    p.add_argument("--optimizer-offload", type=float, default=0.0, metavar="F",
                   help="the fraction of each rank's optimizer states and fp32 master weights kept and stepped on "
                        "the host (runtime megatron: --optimizer-cpu-offload --optimizer-offload-fraction F, needs "
                        "--zero 1; runtime deepspeed: offload_optimizer, F = 1)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def add_plan_args(plan: argparse.ArgumentParser) -> None:
    """The flags of ``parplan plan`` (``parplan remote plan`` takes the same)."""
    plan.add_argument("--model", required=True, help="preset name, graph JSON or HF config.json")
    plan.add_argument("--trace", action="store_true",
                      help="trace an HF config.json with transformers even when parplan maps its model_type by hand")
    add_cluster_args(plan)
    plan.add_argument("--seq-len", type=positive, default=None, help="tokens per sample (default: the model's)")
    plan.add_argument("--global-batch", type=positive, default=None, help="samples per step (default: the GPUs)")
    plan.add_argument("--micro-batch", type=positive, default=None,
                      help="samples per micro-batch of one data-parallel replica (default: searched); the "
                           "searches then use only the dp with the global batch a multiple of micro-batch x dp")
    plan.add_argument("--precision", choices=list(PRECISIONS), default=DEFAULT_PRECISION,
                      help="training precision, as for parplan memory (default bf16; fp8: Transformer Engine's FP8 "
                           "recipe; fp8-cs: with current scaling; fp8-torchao, fp8-torchao-fsdp8, fp8-torchao-rowwise: "
                           "torchao's Float8 as torchtitan runs it, --target torchtitan only; *-remainders, "
                           "*-moments-bf16: Transformer Engine FusedAdam's states, --target megatron only)")
    plan.add_argument("--objective", choices=["min-memory", "max-throughput"], default="min-memory")
    plan.add_argument("--alpha", type=float, default=None,
                      help="min-memory as memory + alpha x time: GiB per device one second of step time is worth")
    plan.add_argument("--max-slowdown", type=float, default=DEFAULT_MAX_SLOWDOWN,
                      help="min-memory: step time within (1 + this) of the best plan found "
                           f"(default {DEFAULT_MAX_SLOWDOWN:g})")
    plan.add_argument("--memory-budget-gib", type=positive_float, default=None,
                      help="memory each device may use (default: all of it)")
    plan.add_argument("--search", choices=["auto", "ilp", "dp"], default="auto")
    plan.add_argument("--time-limit", type=positive_float, default=DEFAULT_TIME_LIMIT_SECONDS,
                      help=f"solver time limit, seconds (default {DEFAULT_TIME_LIMIT_SECONDS:g})")
    plan.add_argument("--mesh", type=mesh, default=None,
                      help="fix the ILP's device mesh, e.g. 2x4 (default: searched)")
    plan.add_argument("--pareto", action="store_true",
                      help="search and print the whole memory vs step-time frontier (plans no other plan beats on "
                           "both; slower: every candidate's budget ladder is walked)")
    plan.add_argument("--target", choices=[t.value for t in Target], default="any",
                      help="the trainer the plan is for: only what it runs, priced with its buffers, against its "
                           "own baseline (default any; see docs/plan-to-launch.md)")
    plan.add_argument("--export", metavar="DIR", default=None,
                      help="also write the plan for --target into DIR (its config files and launch lines)")
    plan.add_argument("--no-optimizer-offload", action="store_true",
                      help="targets megatron and deepspeed: do not try their strategies with part of the optimizer "
                           "on the host when none fits without (they do by default)")
    plan.add_argument("--json", action="store_true", help="print one JSON document")


def strategy_from_args(args: argparse.Namespace) -> tuple[ModelSource, Any, ParallelConfig]:
    """Model, cluster and strategy from parsed ``memory``-style arguments (UsageError if bad)."""
    model = resolve_model(args.model, seq_len=args.seq_len)
    cluster = make_cluster(args.gpus, args.gpus_per_node, args.gpu, args.gpu_memory_gib,
                           getattr(args, "host_memory_gib", None))
    cp = getattr(args, "cp", 1)
    tp = DEFAULT_DEGREE if args.tp is None else args.tp
    pp = DEFAULT_DEGREE if args.pp is None else args.pp
    per_replica = tp * pp * cp
    if cluster.num_devices % per_replica:
        what = "tp x pp x cp" if cp > 1 else "tp x pp"
        degrees = f"{tp} x {pp}" + (f" x {cp}" if cp > 1 else "")
        raise UsageError(f"{what} = {degrees} = {per_replica} does not divide the {args.gpus} GPUs")
    dp = cluster.num_devices // per_replica
    if args.global_batch is None:
        m = 4 * pp if pp > 1 else 1
    else:
        m = microbatches_for(args.global_batch, args.micro_batch, dp)
    schedule = Schedule(args.schedule)
    strategy = ParallelConfig(
        tp=tp, pp=pp, dp=dp, zero=args.zero, sequence_parallel=args.sequence_parallel,
        recompute=Recompute(args.recompute), micro_batch=args.micro_batch, num_microbatches=m,
        schedule=schedule, virtual_stages=args.virtual_stages if schedule.chunked else 1,
        flash_attention=not args.no_flash_attention, precision=args.precision,
        expert_parallel=args.expert_parallel, runtime=Runtime(getattr(args, "runtime", "megatron")),
        sync_every_microbatch=args.sync_every_microbatch, cp=cp, cp_comm=getattr(args, "cp_comm", "p2p"),
        tp_comm_overlap=getattr(args, "tp_comm_overlap", False),
        overlap_param_gather=getattr(args, "overlap_param_gather", False),
        overlap_grad_reduce=not getattr(args, "no_overlap_grad_reduce", False),
        pp_scatter_gather=getattr(args, "pp_scatter_gather", False),
        optimizer_offload=getattr(args, "optimizer_offload", 0.0), dp_shard=getattr(args, "dp_shard", 0),
        expert_tensor_parallel=getattr(args, "expert_tensor_parallel", None))
    return model, cluster, strategy


def plan_request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The HTTP request body (docs/design.md's shape) equivalent to ``parplan plan`` arguments, as
    ``parplan remote plan`` sends it (the service reads it with :class:`PlanRequestIn`)."""
    return _plan_body(args)[0]


def plan_request_and_model(args: argparse.Namespace) -> tuple[PlanRequestIn, ModelSource | None]:
    """The plan request of ``parplan plan`` arguments (the model ``POST /v1/plans`` reads), and the
    model its ``graph`` stands for as :meth:`~parplan.solver.request.ModelSpec.source` would read it
    back (None for a preset or an HF config): the CLI plans with it rather than reading the graph it
    just wrote (thousands of nodes for a traced config, validated again)."""
    from parplan.solver.request import read_body  # pydantic: only for commands that send a request

    body, model = _plan_body(args)
    return read_body(body), model


def _plan_body(args: argparse.Namespace) -> tuple[dict[str, Any], ModelSource | None]:
    model = resolve_model(args.model, seq_len=args.seq_len, trace=getattr(args, "trace", False))
    if model.config is not None and not args.model.endswith(".json"):
        spec: dict[str, Any] = {"preset": model.name}
    else:
        from parplan.solver.wire import graph_to_dict

        spec = {"graph": graph_to_dict(model.graph)} if model.graph is not None else {"hf_config": json.loads(
            Path(args.model).read_text())}
    # named as a graph document is named when read back (its name, else "graph")
    same = ModelSource(model.graph.name or "graph", graph=model.graph) if model.graph is not None else None
    body = {
        "model": spec,
        "cluster": {"gpus": args.gpus, "gpus_per_node": args.gpus_per_node, "gpu": args.gpu,
                    "gpu_memory_gib": args.gpu_memory_gib},
        "training": {"global_batch": args.global_batch or args.gpus, "seq_len": args.seq_len,
                     "micro_batch": args.micro_batch, "precision": args.precision},
        "objective": {"kind": args.objective, "alpha": args.alpha, "max_slowdown": args.max_slowdown,
                      "memory_budget_gib": args.memory_budget_gib},
        "search": args.search,
        "time_limit": args.time_limit,
        "mesh": args.mesh,
        "pareto": args.pareto,
        "target": args.target,
    }
    if getattr(args, "host_memory_gib", None) is not None:
        body["cluster"]["host_memory_gib"] = args.host_memory_gib
    if getattr(args, "no_optimizer_offload", False):
        body["training"]["optimizer_offload"] = False
    return body, same
