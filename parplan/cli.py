"""The ``parplan`` command line: ``memory``, ``plan``, ``export`` and ``models`` (docs/design.md's CLI contract).

Every command prints a readable table, or one JSON document on stdout with ``--json``. Bad
arguments, unknown models and strategies that do not fit the devices exit with status 2 and a
one-line message on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from parplan.cli_args import (
    Parser,
    UsageError,
    add_plan_args,
    add_strategy_args,
    plan_request_and_model,
    strategy_from_args,
)
from parplan.cli_output import GIB, gib, idle_time, plan_table, write_export
from parplan.exports import EXPORT_TARGETS
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.memory import CATEGORIES
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import SolverError
from parplan.solver.evaluate import evaluate
from parplan.solver.frontends.presets import PRESETS
from parplan.solver.models import ModelSource, resolve_model

__all__ = ["UsageError", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The whole CLI: this module's subcommands plus the service's and the agent's. Every
    subparser sets ``handler`` (a function of the parsed arguments returning the exit status)."""
    from parplan.agent.commands import register as register_agent
    from parplan.capacity_command import register as register_capacity
    from parplan.graph_command import register as register_graph
    from parplan.remote_command import register as register_remote
    from parplan.server import register as register_server
    from parplan.service.commands import register as register_service

    parser: argparse.ArgumentParser = Parser(prog="parplan", description="Automatic parallelism planner for "
                                             "training large models.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    mem = sub.add_parser("memory", help="memory and time of one strategy, per device",
                         description="Predict per-device memory (by category) and step time of one strategy.")
    add_strategy_args(mem, importable=True, expert_tensor=True)
    mem.add_argument("--from", dest="from_", nargs=2, metavar=("KIND", "FILE"), default=None,
                     help="price a trainer's own configuration: megatron-args FILE (pretrain_gpt.py flags or its "
                          "torchrun line), ds-config FILE (DeepSpeed; give --model and --gpus), torchtitan-config "
                          "FILE (0.3.0 arguments or their launch line, or a TOML job file of an earlier release: "
                          "give --gpus), or galvatron-config FILE (galvatron_config.json or its train_galvatron.sh; "
                          "give --model and --gpus); the strategy flags are then not used")
    mem.add_argument("--suggest", action="store_true",
                     help="with --from: also plan for the same trainer and show the best plan beside it")
    mem.add_argument("--runtime", choices=[r.value for r in Runtime], default="megatron",
                     help="whose buffers to count: megatron (default), torch (PyTorch-native DTensor/FSDP2 on "
                          "GPUs), torch-cpu (the same with CPU kernels), interpreter-cpu (the agent's per-operator "
                          "plan interpreter on CPUs), deepspeed, torchtitan (torchtitan's trainer), "
                          "torchtitan-cpu, torchtitan-unchunked-loss (its trainer without the chunked loss), nanotron "
                          "(nanotron's trainer) or nanotron-cpu; see docs/concepts.md")
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
    register_server(sub)
    register_service(sub)
    register_agent(sub)
    register_remote(sub)
    register_capacity(sub)
    return parser


def _step_time_lines(t: dict[str, Any], pp: int) -> list[str]:
    """The step time line of ``parplan memory``'s table (``pp``: the plan's pipeline stages) and,
    wrapped under it, the time model's error on published runs (``time.accuracy``)."""
    lines = ["", f"step time  {t['step_seconds']:.3f} s   {t['tokens_per_second']:,.0f} tokens/s   "
             f"{idle_time(t, pp)}   (calibration: {t['calibration']})"]
    if t.get("accuracy"):
        lines += textwrap.wrap(t["accuracy"]["note"], 100, initial_indent=" " * 11, subsequent_indent=" " * 11)
    return lines


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
        lines.append(f"  {cat:<18s}          {gib(mem['breakdown'][cat])}  {gib(mem['redundant'][cat])}")
    lines.append(f"  {'peak':<18s}          {gib(mem['peak_bytes'])}  ({_verdict(mem)})")
    if "host_bytes_per_node" in mem:  # optimizer offloading
        limit = mem["host_memory_bytes"]
        lines.append(f"  host memory per machine {mem['host_bytes_per_node'] / GIB:.1f} GiB for the offloaded optimizer"
                     + (f" of {limit / GIB:.1f} GiB" if limit else " (no limit known: --host-memory-gib)")
                     + ("" if mem["host_fits"] else f": does not fit ({mem['host_reason']})"))
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
    return "\n".join(lines + _step_time_lines(t, s["pp"]))


def cmd_memory(args: argparse.Namespace) -> int:
    if args.from_ is not None:
        return _memory_from(args)
    missing = [f"--{n.replace('_', '-')}" for n in ("model", "gpus") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or --from KIND FILE)")
    if args.suggest:
        raise UsageError("--suggest needs --from KIND FILE")
    model, cluster, strategy = strategy_from_args(args)
    doc = evaluate(model, cluster, strategy, seq_len=args.seq_len).to_dict()
    arch = model.architecture()
    if arch is not None:  # so that `parplan export` can write the strategy priced
        doc["model"]["architecture"] = arch
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
        from parplan.solver.planner import solve
        from parplan.solver.request import parse_plan_request

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
    for what in ("adjusted", "unknown", "ignored", "unpriced"):
        if imported.report()[what]:
            print(f"{what} in {path}: {('; ' if what == 'adjusted' else ', ').join(imported.report()[what])}")
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
        lines.append(f"  {cat:<18s}          {gib(mem['breakdown'][cat])}  {gib(mem['redundant'][cat])}")
    lines.append(f"  {'peak':<18s}          {gib(mem['peak_bytes'])}  ({_verdict(mem)})")
    if "host_bytes_per_node" in mem:  # optimizer offloading
        limit = mem["host_memory_bytes"]
        lines.append(f"  host memory per machine {mem['host_bytes_per_node'] / GIB:.1f} GiB for the offloaded optimizer"
                     + (f" of {limit / GIB:.1f} GiB" if limit else " (no limit known: --host-memory-gib)")
                     + ("" if mem["host_fits"] else f": does not fit ({mem['host_reason']})"))
    return "\n".join(lines + _step_time_lines(t, s["pp"]))


def _verdict(mem: dict[str, Any]) -> str:
    """The fit verdict in words: the reserved peak against the device's usable memory."""
    verdict = "fits" if mem["reserved_peak_bytes"] <= mem["usable_bytes"] else "DOES NOT FIT"
    return (f"reserved {mem['reserved_peak_bytes'] / GIB:.2f} GiB {verdict} in {mem['usable_bytes'] / GIB:.2f} "
            f"GiB usable of {mem['device_memory_bytes'] / GIB:.1f}")


def _model_spec(model: ModelSource, seq_len: int) -> dict[str, Any]:
    """The request's ``model`` for a model read from a trainer's file: the preset of the same
    architecture when there is one, else its graph."""
    import dataclasses

    if model.config is not None:
        for name, cfg in PRESETS.items():
            if dataclasses.replace(cfg, name=model.config.name, seq_len=model.config.seq_len) == model.config:
                return {"preset": name}
    from parplan.solver.wire import graph_to_dict  # (pydantic: imported only when a graph is written)

    return {"graph": graph_to_dict(model.build(1, seq_len))}


def cmd_plan(args: argparse.Namespace) -> int:
    from parplan.solver.planner import solve
    from parplan.solver.request import parse_plan_request

    body, model = plan_request_and_model(args)
    if args.export is not None and args.target == "any":
        raise UsageError("--export needs --target (megatron, torchtitan, deepspeed, galvatron or parplan)")
    doc = solve(parse_plan_request(body, model=model))
    if args.export is not None and doc.get("memory") is not None:
        from parplan.exports import export_plan

        written = write_export(export_plan(doc, args.target).to_dict(), Path(args.export))
        print(f"wrote {', '.join(written)} to {args.export}", file=sys.stderr)
    print(json.dumps(doc, indent=2) if args.json else plan_table(doc, args.pareto))
    return 0 if doc.get("memory") is not None else 3


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
        written = write_export(exported, Path(args.out))
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
    # subcommands raise (parplan.cli_args.UsageError) are the ones main() catches.
    from parplan.cli import main as _main

    sys.exit(_main())
