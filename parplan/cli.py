"""The ``parplan`` command line: ``memory``, ``plan``, ``export`` and ``models`` (DESIGN.md's CLI contract).

Every command prints a readable table, or one JSON document on stdout with ``--json``. Bad
arguments, unknown models and strategies that do not fit the devices exit with status 2 and a
one-line message on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from parplan.exports import EXPORT_TARGETS
from parplan.solver.cluster import GPU_PRESETS, make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.memory import CATEGORIES
from parplan.solver.cost.precision import PRECISIONS
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import SolverError
from parplan.solver.evaluate import evaluate
from parplan.solver.frontends.presets import PRESETS
from parplan.solver.models import ModelSource, resolve_model
from parplan.solver.strategy import ParallelConfig, Schedule, microbatches_for
from parplan.solver.targets import Target
from parplan.solver.wire import graph_to_dict

GIB = 2**30


class UsageError(Exception):
    """A command-line argument that cannot be honoured (exit status 2)."""


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


_positive = int_at_least(1)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def _mesh(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.lower().split("x")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected sizes like 2x4, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"expected positive sizes like 2x4, got {text!r}")
    return sizes


def _add_cluster_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--gpus", type=_positive, required=required, help="number of devices")
    p.add_argument("--gpus-per-node", type=_positive, default=None, help="devices per node (default: the GPU's)")
    p.add_argument("--gpu", default="A100-80GB", help=f"GPU preset: {', '.join(GPU_PRESETS)} (default A100-80GB)")
    p.add_argument("--gpu-memory-gib", type=_positive_float, default=None, help="override the device memory (GiB)")


def _add_strategy_args(p: argparse.ArgumentParser, importable: bool = False) -> None:
    """The strategy flags; ``importable``: they may come from a trainer's file instead (``--from``)."""
    p.add_argument("--model", required=not importable,
                   help="preset name (see `parplan models`), graph JSON or HF config.json")
    _add_cluster_args(p, required=not importable)
    p.add_argument("--tp", type=_positive, required=not importable, help="tensor-parallel degree")
    p.add_argument("--pp", type=_positive, required=not importable, help="pipeline-parallel degree")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                   help="ZeRO stage over the data-parallel group (1 = Megatron's distributed optimizer)")
    p.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism (needs tp > 1)")
    p.add_argument("--recompute", choices=[r.value for r in Recompute], default="selective",
                   help="activation recomputation (default selective)")
    p.add_argument("--micro-batch", type=_positive, default=1, help="samples per micro-batch (default 1)")
    p.add_argument("--global-batch", type=_positive, default=None,
                   help="samples per step (default: micro-batch x dp x 4pp, or x 1 without pipelining)")
    p.add_argument("--seq-len", type=_positive, default=None, help="tokens per sample (default: the model's)")
    p.add_argument("--schedule", choices=[s.value for s in Schedule], default="1f1b", help="pipeline schedule")
    p.add_argument("--virtual-stages", type=_positive, default=2,
                   help="model chunks per device for --schedule interleaved (default 2)")
    p.add_argument("--no-flash-attention", action="store_true",
                   help="attention materialises the s x s scores (adds Korthikanti's 5as/h term)")
    p.add_argument("--precision", choices=list(PRECISIONS), default="bf16",
                   help="bf16 (default: fp32 grads + master + Adam, 18 B/param), bf16-grad16 (16 B/param), "
                        "fp16, fp16-grad16, fp32, fp8 (Transformer Engine's FP8 recipe, 20 B/param)")
    p.add_argument("--expert-parallel", type=_positive, default=1, help="expert-parallel degree (MoE), divides dp")
    p.add_argument("--cp", type=_positive, default=1,
                   help="context-parallel degree (ring attention, Megatron-LM's --context-parallel-size): the "
                        "sequence split over CP ranks; 2 x CP must divide the sequence length")
    p.add_argument("--cp-comm", choices=["p2p", "a2a"], default="p2p",
                   help="how attention exchanges under context parallelism: the p2p ring (default) or all-to-alls "
                        "(a2a, Ulysses: tp x cp must divide the heads)")
    p.add_argument("--sync-every-microbatch", action="store_true",
                   help="reduce gradients after every micro-batch, not only the last (FSDP2 with gradient sync on "
                        "for every backward)")
    p.add_argument("--json", action="store_true", help="print one JSON document")


def add_plan_args(plan: argparse.ArgumentParser) -> None:
    """The flags of ``parplan plan`` (``parplan remote plan`` takes the same)."""
    plan.add_argument("--model", required=True, help="preset name, graph JSON or HF config.json")
    plan.add_argument("--trace", action="store_true",
                      help="trace an HF config.json with transformers even when parplan maps its model_type by hand")
    _add_cluster_args(plan)
    plan.add_argument("--seq-len", type=_positive, default=None, help="tokens per sample (default: the model's)")
    plan.add_argument("--global-batch", type=_positive, default=None, help="samples per step (default: the GPUs)")
    plan.add_argument("--micro-batch", type=_positive, default=None,
                      help="samples per micro-batch of one data-parallel replica (default: searched)")
    plan.add_argument("--precision", choices=list(PRECISIONS), default="bf16",
                      help="training precision, as for parplan memory (default bf16; fp8: Transformer Engine's FP8 "
                           "recipe)")
    plan.add_argument("--objective", choices=["min-memory", "max-throughput"], default="min-memory")
    plan.add_argument("--alpha", type=float, default=None,
                      help="min-memory as memory + alpha x time: GiB per device one second of step time is worth")
    plan.add_argument("--max-slowdown", type=float, default=0.1,
                      help="min-memory: step time within (1 + this) of the best plan found (default 0.1)")
    plan.add_argument("--memory-budget-gib", type=_positive_float, default=None,
                      help="memory each device may use (default: all of it)")
    plan.add_argument("--search", choices=["auto", "ilp", "dp"], default="auto")
    plan.add_argument("--time-limit", type=_positive_float, default=60.0, help="solver time limit, seconds")
    plan.add_argument("--mesh", type=_mesh, default=None,
                      help="fix the ILP's device mesh, e.g. 2x4 (default: searched)")
    plan.add_argument("--pareto", action="store_true",
                      help="search and print the whole memory vs step-time frontier (plans no other plan beats on "
                           "both; slower: every candidate's budget ladder is walked)")
    plan.add_argument("--target", choices=[t.value for t in Target], default="any",
                      help="the trainer the plan is for: only what it runs, priced with its buffers, against its "
                           "own baseline (default any; see README)")
    plan.add_argument("--export", metavar="DIR", default=None,
                      help="also write the plan for --target into DIR (its config files and launch lines)")
    plan.add_argument("--json", action="store_true", help="print one JSON document")


def build_parser() -> argparse.ArgumentParser:
    """The whole CLI: this module's subcommands plus the service's and the agent's. Every
    subparser sets ``handler`` (a function of the parsed arguments returning the exit status)."""
    from parplan.agent.commands import register as register_agent
    from parplan.graph_command import register as register_graph
    from parplan.remote_command import register as register_remote
    from parplan.service.commands import register as register_service

    parser = argparse.ArgumentParser(prog="parplan", description="Automatic parallelism planner for training "
                                     "large models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    mem = sub.add_parser("memory", help="memory and time of one strategy, per device",
                         description="Predict per-device memory (by category) and step time of one strategy.")
    _add_strategy_args(mem, importable=True)
    mem.add_argument("--from", dest="from_", nargs=2, metavar=("KIND", "FILE"), default=None,
                     help="price a trainer's own configuration: megatron-args FILE (pretrain_gpt.py flags or its "
                          "torchrun line), ds-config FILE (DeepSpeed; give --model and --gpus), torchtitan-config "
                          "FILE, or galvatron-config FILE (galvatron_config.json or its train_galvatron.sh; give "
                          "--model and --gpus); the strategy flags are then not used")
    mem.add_argument("--suggest", action="store_true",
                     help="with --from: also plan for the same trainer and show the best plan beside it")
    mem.add_argument("--runtime", choices=[r.value for r in Runtime], default="megatron",
                     help="whose buffers to count: megatron (default), torch (PyTorch-native DTensor/FSDP2 on "
                          "GPUs), torch-cpu (the same with CPU kernels), interpreter-cpu (the agent's per-operator "
                          "plan interpreter on CPUs), deepspeed, torchtitan (torchtitan's trainer) or "
                          "torchtitan-cpu; see README")
    mem.set_defaults(handler=cmd_memory)
    plan = sub.add_parser("plan", help="search for a parallelism plan", description="Search for the plan that fits "
                          "with the least redundant memory (or the fastest one), with baselines.")
    add_plan_args(plan)
    plan.set_defaults(handler=cmd_plan)
    exp = sub.add_parser("export", help="write a saved plan as a trainer's config and launch lines",
                         description="Convert a plan document (parplan plan --json, GET /v1/plans/{id}) into the "
                                     "configuration files and launch commands of a trainer, pinned to a stated "
                                     "version. A plan the trainer cannot run is an error naming why.")
    exp.add_argument("plan", help="plan JSON file (- for standard input)")
    exp.add_argument("--target", required=True, choices=EXPORT_TARGETS)
    exp.add_argument("--out", metavar="DIR", default=None, help="write the files into DIR (default: print them)")
    exp.add_argument("--json", action="store_true", help="print one JSON document (files, launch, notes)")
    exp.set_defaults(handler=cmd_export)
    models = sub.add_parser("models", help="list model presets with their parameter counts")
    models.add_argument("--json", action="store_true", help="print one JSON document")
    models.set_defaults(handler=cmd_models)
    register_graph(sub)
    register_service(sub)
    register_agent(sub)
    register_remote(sub)
    return parser


def strategy_from_args(args: argparse.Namespace) -> tuple[ModelSource, Any, ParallelConfig]:
    """Model, cluster and strategy from parsed ``memory``-style arguments (UsageError if bad)."""
    model = resolve_model(args.model, seq_len=args.seq_len)
    cluster = make_cluster(args.gpus, args.gpus_per_node, args.gpu, args.gpu_memory_gib)
    cp = getattr(args, "cp", 1)
    per_replica = args.tp * args.pp * cp
    if cluster.num_devices % per_replica:
        what = "tp x pp x cp" if cp > 1 else "tp x pp"
        degrees = f"{args.tp} x {args.pp}" + (f" x {cp}" if cp > 1 else "")
        raise UsageError(f"{what} = {degrees} = {per_replica} does not divide the {args.gpus} GPUs")
    dp = cluster.num_devices // per_replica
    if args.global_batch is None:
        m = 4 * args.pp if args.pp > 1 else 1
    else:
        m = microbatches_for(args.global_batch, args.micro_batch, dp)
    schedule = Schedule(args.schedule)
    strategy = ParallelConfig(
        tp=args.tp, pp=args.pp, dp=dp, zero=args.zero, sequence_parallel=args.sequence_parallel,
        recompute=Recompute(args.recompute), micro_batch=args.micro_batch, num_microbatches=m,
        schedule=schedule, virtual_stages=args.virtual_stages if schedule is Schedule.INTERLEAVED else 1,
        flash_attention=not args.no_flash_attention, precision=args.precision,
        expert_parallel=args.expert_parallel, runtime=Runtime(getattr(args, "runtime", "megatron")),
        sync_every_microbatch=args.sync_every_microbatch, cp=cp, cp_comm=getattr(args, "cp_comm", "p2p"))
    return model, cluster, strategy


def _gib(n: float) -> str:
    return f"{n / GIB:9.2f}"


def _memory_table(doc: dict[str, Any]) -> str:
    mem, t, s = doc["memory"], doc["time"], doc["strategy"]
    lines = [
        f"model     {doc['model']['name']}  ({doc['model']['parameters'] / 1e9:.2f} B parameters, "
        f"seq {doc['model']['seq_len']})",
        f"cluster   {doc['cluster']['gpus']} x {doc['cluster']['gpu']} "
        f"({doc['cluster']['gpus_per_node']} per node, {doc['cluster']['device_memory_bytes'] / GIB:.1f} GiB each)",
        f"strategy  {s['summary']}  global batch {s['global_batch']}, precision {s['precision']}"
        f"{'' if s['flash_attention'] else ', no flash attention'}"
        f"{'' if s.get('runtime', 'megatron') == 'megatron' else ', buffers of the ' + s['runtime'] + ' runtime'}",
        "",
        f"most loaded device: stage {mem['peak_stage']}  (GiB)       held  redundant",
    ]
    for cat in CATEGORIES:
        lines.append(f"  {cat:<18s}          {_gib(mem['breakdown'][cat])}  {_gib(mem['redundant'][cat])}")
    verdict = "fits" if mem["fits"] else "DOES NOT FIT"
    lines.append(f"  {'peak':<18s}          {_gib(mem['peak_bytes'])}  ({verdict} in "
                 f"{mem['device_memory_bytes'] / GIB:.1f} GiB)")
    total = sum(mem["breakdown"][cat] for cat in CATEGORIES)
    if mem["peak_bytes"] < total * (1 - 1e-9):
        lines.append(f"  (each category at its own peak; they add up to {total / GIB:.2f} GiB, but they do not "
                     "peak at the same moment of the step)")
    if len(mem["stages"]) > 1:
        lines += ["", "per stage (GiB)   params    grads  optim    activ    temp     peak   in-flight  blocks"]
        for st in mem["stages"]:
            b = st["breakdown"]
            lines.append(
                f"  stage {st['stage']:<3d} {b['parameters'] / GIB:8.2f} {b['gradients'] / GIB:8.2f} "
                f"{b['optimizer_states'] / GIB:7.2f} {b['activations'] / GIB:8.2f} {b['temporary'] / GIB:7.2f} "
                f"{st['peak_bytes'] / GIB:8.2f}   {st['in_flight_microbatches']:6.1f}    "
                f"{st['first_unit']}..{st['last_unit']}")
    lines += ["", f"step time  {t['step_seconds']:.3f} s   {t['tokens_per_second']:,.0f} tokens/s   "
              f"bubble {t['bubble_fraction']:.1%}   (calibration: {t['calibration']})"]
    if t.get("accuracy"):
        lines.append(f"           {t['accuracy']['note']}")
    return "\n".join(lines)


def cmd_memory(args: argparse.Namespace) -> int:
    if args.from_ is not None:
        return _memory_from(args)
    missing = [f"--{n.replace('_', '-')}" for n in ("model", "gpus", "tp", "pp") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or --from KIND FILE)")
    if args.suggest:
        raise UsageError("--suggest needs --from KIND FILE")
    model, cluster, strategy = strategy_from_args(args)
    doc = evaluate(model, cluster, strategy, seq_len=args.seq_len).to_dict()
    print(json.dumps(doc, indent=2) if args.json else _memory_table(doc))
    return 0


def _memory_from(args: argparse.Namespace) -> int:
    """``parplan memory --from KIND FILE``: the trainer's configuration, priced (and ``--suggest``:
    the best plan for the same trainer beside it)."""
    from parplan.imports import IMPORT_KINDS, price, read_config

    kind, path = args.from_
    if kind not in IMPORT_KINDS:
        raise UsageError(f"--from: unknown kind {kind!r}; known: {', '.join(IMPORT_KINDS)}")
    used = [f"--{n.replace('_', '-')}" for n in ("tp", "pp") if getattr(args, n) is not None]
    if used:
        raise UsageError(f"--from reads the strategy from {path}; leave out {', '.join(used)}")
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise UsageError(f"cannot read {path}: {e.strerror or e}") from None
    model = resolve_model(args.model, seq_len=args.seq_len) if args.model else None
    launch = None
    if kind == "galvatron-config":
        text, launch = _galvatron_files(Path(path), text)
    imported = read_config(kind, text, model=model, gpus=args.gpus, seq_len=args.seq_len, launch=launch)
    assert imported.model is not None and imported.gpus is not None
    cluster = make_cluster(imported.gpus, args.gpus_per_node or imported.gpus_per_node, args.gpu, args.gpu_memory_gib)
    doc = price(imported, cluster)
    if args.suggest:
        from parplan.solver.planner import parse_plan_request, solve

        spec = _model_spec(imported.model, doc["model"]["seq_len"])
        body = {"model": spec, "cluster": {"gpus": cluster.num_devices, "gpus_per_node": cluster.gpus_per_node,
                                           "gpu": args.gpu, "gpu_memory_gib": args.gpu_memory_gib},
                "training": {"global_batch": doc["strategy"]["global_batch"], "seq_len": doc["model"]["seq_len"]},
                "objective": {"kind": "min-memory"}, "target": imported.target}
        plan = solve(parse_plan_request(body))
        doc["suggestion"] = {k: plan.get(k) for k in ("strategy", "memory", "time", "target", "solver")}
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(_memory_table(doc) if doc["strategy"].get("kind") != "per-layer" else _layer_table(doc))
    for what in ("unknown", "ignored", "unpriced"):
        if imported.report()[what]:
            print(f"{what} in {path}: {', '.join(imported.report()[what])}")
    if args.suggest:
        sug = doc["suggestion"]
        if sug["memory"] is None:
            print("suggestion: no plan for the same trainer fits")
        else:
            print(f"suggestion for {imported.target}: {sug['strategy']['summary']}: "
                  f"{sug['memory']['peak_bytes'] / GIB:.2f} GiB, {sug['time']['step_seconds']:.3f} s per step "
                  f"(this configuration: {doc['memory']['peak_bytes'] / GIB:.2f} GiB, "
                  f"{doc['time']['step_seconds']:.3f} s)")
    return 0


def _galvatron_files(path: Path, text: str) -> tuple[str, str | None]:
    """(strategy file text, launch text) of a Galvatron export given either file: the strategy
    file's ``train_galvatron.sh`` beside it, or the script's ``--galvatron_config_path``."""
    if path.suffix == ".json":
        script = path.with_name("train_galvatron.sh")
        return text, script.read_text() if script.is_file() else None
    words = text.replace("\\\n", " ").split()
    if "--galvatron_config_path" not in words or words.index("--galvatron_config_path") + 1 >= len(words):
        raise UsageError(f"{path} has no --galvatron_config_path; give the strategy file itself")
    target = words[words.index("--galvatron_config_path") + 1].strip("\"'")
    target = target.replace("$PLAN_DIR", str(path.parent)).replace("${PLAN_DIR}", str(path.parent))
    try:
        return Path(target).read_text(), text
    except OSError as e:
        raise UsageError(f"cannot read the strategy file {target}: {e.strerror or e}") from None


def _layer_table(doc: dict[str, Any]) -> str:
    """A per-layer configuration's memory and time (``memory --from galvatron-config``)."""
    s, mem, t = doc["strategy"], doc["memory"], doc["time"]
    lines = [f"model     {doc['model']['name']}  ({doc['model']['parameters'] / 1e9:.2f} B parameters, "
             f"seq {doc['model']['seq_len']})", f"strategy  {s['summary']}", ""]
    for run in s["layers"]:
        span = run["first"] if run["count"] == 1 else f"{run['first']} .. {run['last']}"
        lines.append(f"  stage {run['stage']}  {span:<28s} (x{run['count']})  {run['strategy']}")
    lines += ["", f"most loaded device: stage {mem['peak_stage']}  (GiB)       held  redundant"]
    for cat in CATEGORIES:
        lines.append(f"  {cat:<18s}          {_gib(mem['breakdown'][cat])}  {_gib(mem['redundant'][cat])}")
    lines.append(f"  {'peak':<18s}          {_gib(mem['peak_bytes'])}  ({'fits' if mem['fits'] else 'DOES NOT FIT'})")
    lines += ["", f"step time  {t['step_seconds']:.3f} s   {t['tokens_per_second']:,.0f} tokens/s   "
              f"bubble {t['bubble_fraction']:.1%}   (calibration: {t['calibration']})"]
    if t.get("accuracy"):
        lines.append(f"           {t['accuracy']['note']}")
    return "\n".join(lines)


def _model_spec(model: ModelSource, seq_len: int) -> dict[str, Any]:
    """The request's ``model`` for a model read from a trainer's file: the preset of the same
    architecture when there is one, else its graph."""
    import dataclasses

    if model.config is not None:
        for name, cfg in PRESETS.items():
            if dataclasses.replace(cfg, name=model.config.name, seq_len=model.config.seq_len) == model.config:
                return {"preset": name}
    return {"graph": graph_to_dict(model.build(1, seq_len))}


def plan_request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The HTTP request body (DESIGN.md's shape) equivalent to ``parplan plan`` arguments."""
    model = resolve_model(args.model, seq_len=args.seq_len, trace=args.trace)
    if model.config is not None and not args.model.endswith(".json"):
        spec: dict[str, Any] = {"preset": model.name}
    else:
        spec = {"graph": graph_to_dict(model.graph)} if model.graph is not None else {"hf_config": json.loads(
            Path(args.model).read_text())}
    return {
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


def _plan_table(doc: dict[str, Any], pareto: bool = False) -> str:
    lines = []
    solver = doc["solver"]
    if doc.get("memory") is None:
        lines.append(f"no plan: {doc.get('message', 'infeasible')}")
    else:
        st = doc["strategy"]
        lines += [f"model     {doc['model']['name']}", f"plan      {st['summary']}", ""]
        for run in st.get("layers", []):
            span = run["first"] if run["count"] == 1 else f"{run['first']} .. {run['last']}"
            lines.append(f"  stage {run['stage']}  {span:<28s} (x{run['count']})  {run['strategy']}")
        for unit in st.get("units", []):
            lines.append(f"  {unit['units']}  (x{unit['count']})")
            for op, info in unit["ops"].items():
                lines.append(f"      {op.split('.', 2)[-1] if unit['count'] > 1 else op:<28s} {info['strategy']}")
        mem = doc["memory"]
        lines += ["", "memory per device (GiB)     held  redundant"]
        for cat in CATEGORIES:
            lines.append(f"  {cat:<22s} {_gib(mem['breakdown'][cat])}  {_gib(mem['redundant'][cat])}")
        lines.append(f"  {'peak':<22s} {_gib(mem['peak_bytes'])}")
        lines.append(f"step time {doc['time']['step_seconds']:.3f} s, {doc['time']['tokens_per_second']:,.0f} tokens/s")
    lines += ["", "baselines            peak GiB   step s   memory ratio  throughput ratio   strategy"]
    for name, b in doc["baselines"].items():
        if b is None:
            lines.append(f"  {name:<16s}  (none applies)")
            continue
        rel = (doc.get("relative") or {}).get(name) or {}
        ratio = f"{rel['memory']:.2f}" if rel else "-"
        thr = f"{rel['throughput']:.2f}" if rel else "-"
        fit = "" if b["fits"] else " (does not fit)"
        lines.append(f"  {name:<16s} {b['memory']['peak_bytes'] / GIB:9.2f} {b['time']['step_seconds']:8.3f}   "
                     f"{ratio:>10s}   {thr:>12s}        {b['strategy']['summary']}{fit}")
    target = doc.get("target") or {}
    vs = target.get("versus_baseline")
    if target.get("name", "any") != "any":
        line = f"target    {target['name']} (buffers of the {target['runtime']} runtime)"
        if vs:
            faster = "faster" if vs["seconds_saved"] >= 0 else "slower"
            line += (f": vs its baseline {target['baseline']}, {vs['memory_saved_bytes'] / GIB:+.2f} GiB saved per "
                     f"device, {abs(vs['seconds_saved']):.3f} s per step {faster}")
        lines += ["", line] + [f"          not in the prediction: {u}" for u in target.get("unpriced", [])]
    if pareto:
        lines += ["", "memory vs step time (plans no other plan beats on both)"]
        if not doc.get("pareto"):
            lines.append("  (the frontier comes from the per-layer DP search: use --search dp or auto)")
        for p in doc.get("pareto") or []:
            lines.append(f"  {p['peak_bytes'] / GIB:8.2f} GiB  {p['step_seconds']:8.3f} s   {p['summary']}")
    gap = solver.get("gap")
    lines += ["", f"solver    {solver['method']} ({solver.get('why', '')}): {solver['status']}, "
              f"{solver['seconds']:.2f} s" + (f", gap {gap:.2e}" if isinstance(gap, float) else "")]
    return "\n".join(lines)


def cmd_plan(args: argparse.Namespace) -> int:
    from parplan.solver.planner import parse_plan_request, solve

    body = plan_request_from_args(args)
    if args.export is not None and args.target == "any":
        raise UsageError("--export needs --target (megatron, torchtitan, deepspeed, galvatron or parplan)")
    doc = solve(parse_plan_request(body))
    if args.export is not None and doc.get("memory") is not None:
        from parplan.exports import export_plan

        written = _write_export(export_plan(doc, args.target).to_dict(), Path(args.export))
        print(f"wrote {', '.join(written)} to {args.export}", file=sys.stderr)
    print(json.dumps(doc, indent=2) if args.json else _plan_table(doc, args.pareto))
    return 0 if doc.get("memory") is not None else 3


def _write_export(exported: dict[str, Any], out: Path) -> list[str]:
    """Write an export's files into ``out`` (created); their names."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in exported["files"].items():
            (out / name).write_text(text)
    except OSError as e:
        raise UsageError(f"cannot write to {out}: {e.strerror or e}") from None
    return sorted(exported["files"])


def cmd_export(args: argparse.Namespace) -> int:
    from parplan.exports import export_plan

    try:
        text = sys.stdin.read() if args.plan == "-" else Path(args.plan).read_text()
    except OSError as e:
        raise UsageError(f"cannot read {args.plan}: {e.strerror or e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"{args.plan} is not JSON: {e.msg} at line {e.lineno}") from None
    exported = export_plan(doc, args.target).to_dict()
    if args.out is not None:
        written = _write_export(exported, Path(args.out))
        print(f"wrote {', '.join(written)} to {args.out}", file=sys.stderr)
    if args.json:
        print(json.dumps(exported, indent=2))
    elif args.out is None:
        for name, body in exported["files"].items():
            print(f"==> {name} <==\n{body}")
    if not args.json:
        print(f"{exported['target']} {exported['version']}: launch with")
        for line in exported["launch"]:
            print(f"  {line}")
        for note in exported["notes"]:
            print(f"note: {note}")
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    rows = []
    for name, cfg in PRESETS.items():
        src = ModelSource(name, config=cfg)
        rows.append({"name": name, "family": cfg.family, "parameters": src.parameter_count(),
                     "layers": cfg.total_layers,
                     "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.n_kv_heads, "ffn": cfg.ffn,
                     "vocab": cfg.vocab, "seq_len": cfg.tokens_per_sample, "experts": cfg.num_experts})
    if args.json:
        print(json.dumps({"models": rows}, indent=2))
        return 0
    print(f"{'name':<14s} {'family':<8s} {'parameters':>16s} {'layers':>6s} {'hidden':>6s} {'heads':>5s} "
          f"{'kv':>4s} {'ffn':>6s} {'vocab':>7s} {'seq':>5s}")
    for r in rows:
        print(f"{r['name']:<14s} {r['family']:<8s} {r['parameters']:>16,d} {r['layers']:>6d} {r['hidden']:>6d} "
              f"{r['heads']:>5d} {r['kv_heads']:>4d} {r['ffn']:>6d} {r['vocab']:>7d} {r['seq_len']:>5d}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except (SolverError, UsageError) as e:
        print(f"parplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    # Run as ``python -m parplan.cli``: use the module's importable copy, so that the exceptions the
    # subcommands raise (imported from parplan.cli) are the ones main() catches.
    from parplan.cli import main as _main

    sys.exit(_main())
