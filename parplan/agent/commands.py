"""CLI subcommands of the validation agent (``validate``, ``agent``); registered by :mod:`parplan.cli`."""

from __future__ import annotations

import argparse
import json
import logging
import math
import signal
import socket
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

MIB = 2**20


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the agent's subcommands to ``sub``; each sets ``handler`` with ``set_defaults``."""
    from parplan.cli_args import add_strategy_args

    val = sub.add_parser(
        "validate", help="run a strategy locally with torch.distributed; measured vs predicted memory per rank",
        description="Run one strategy on local processes (gloo on the CPU, NCCL on GPUs) with PyTorch's "
                    "distributed APIs, check loss and gradients against a single-process run, and print the "
                    "measured per-rank memory by category beside the cost model's prediction. Runs in fp32; "
                    "models too large for the machine run shrunk (same degrees, fewer layers, smaller hidden).")
    add_strategy_args(val, importable=True)
    val.add_argument("--plan", metavar="FILE", default=None,
                     help="run a saved plan instead of the strategy flags: a plan document (parplan plan --json, "
                          "GET /v1/plans/{id}) or target parplan's export (parplan_plan.json), the same file")
    val.add_argument("--graph", metavar="FILE", default=None,
                     help="with --plan: the graph JSON the plan was made for (parplan graph's output, e.g. a "
                          "traced config.json); runs a per-operator (ILP) plan on it, resized to its micro-step")
    val.add_argument("--torchtitan", metavar="FILE", default=None,
                     help="run a torchtitan 0.3.0 job with torchtitan's own code: the torchtitan_args.txt of "
                          "`parplan export --target torchtitan` (or its torchrun line); one rank per process, "
                          "--gpus ranks (default: the degrees' product); measured vs parplan's prediction for "
                          "the same file")
    val.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    val.add_argument("--max-procs", type=int, default=8, help="most processes to start (default 8)")
    val.add_argument("--shrink", choices=("auto", "yes", "no"), default="auto",
                     help=f"run a shrunk copy (auto: above {50_000_000:,} parameters)")
    val.add_argument("--shrink-layers", type=int, default=None, help="layers of the shrunk copy")
    val.add_argument("--shrink-hidden", type=int, default=None, help="hidden size of the shrunk copy")
    val.add_argument("--steps", type=int, default=3, help="timed steps after warm-up (median reported)")
    val.add_argument("--no-check", action="store_true", help="skip the comparison with a single-process run")
    val.add_argument("--diagnose", action="store_true",
                     help="also report what is alive at each category's peak, and per-module peaks")
    val.set_defaults(handler=cmd_validate)

    ag = sub.add_parser(
        "agent", help="validation agent: claim plans from a parplan service, run and report them",
        description="Register with a parplan service, heartbeat, post micro-benchmarks, then long-poll for "
                    "validations, run each locally and post the measurement. SIGTERM/SIGINT finish the "
                    "validation in progress and exit.")
    ag.add_argument("--server", required=True, help="service base URL, e.g. http://localhost:8000")
    ag.add_argument("--token", required=True, help="bearer token with scope agent")
    ag.add_argument("--name", default=None, help="agent name (default: host name)")
    ag.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available")
    ag.add_argument("--max-procs", type=int, default=None, help="most processes per run (default: GPUs, or 8)")
    ag.add_argument("--wait-seconds", type=int, default=30, help="long-poll wait per claim (0-30)")
    ag.add_argument("--heartbeat-seconds", type=float, default=15.0, help="heartbeat interval")
    ag.add_argument("--no-profile", action="store_true", help="do not run and post micro-benchmarks")
    ag.add_argument("--once", action="store_true", help="exit after one validation")
    ag.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    ag.set_defaults(handler=cmd_agent)


def _device(kind: str | None) -> str:
    import torch

    if kind is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        from parplan.cli_args import UsageError

        raise UsageError("--device cuda but no CUDA device is available")
    return kind


def measure_validation(validation: dict[str, Any], device: str, max_procs: int, hardware_key: str,
                       diagnose: bool = False) -> dict[str, Any]:
    """Run a validation's plan (per-operator plans as planned, uniform ones shrunk when they must
    be) and return its ``measurement``: per rank measured and predicted memory, the worst error;
    with ``diagnose``, each rank's ``measured.contents`` too (what was alive at each category's peak)."""
    from parplan.agent.plans import spec_for_validation
    from parplan.agent.validate import measurement_of, run_and_compare

    if ((validation.get("plan") or {}).get("strategy") or {}).get("kind") == "intra-operator":
        from parplan.agent.ilp_validate import measurement_for_validation

        return measurement_for_validation(validation, device, max_procs, hardware_key, diagnose)
    spec = spec_for_validation(validation, max_procs, diagnose)
    comparison = run_and_compare([spec], device)[0]
    out = measurement_of(comparison, hardware_key)
    out["config"]["shrunk_from"] = spec.extra["original_model"] if spec.extra.get("shrunk") else None
    out["config"]["notes"] = spec.extra.get("notes", [])
    out["config"]["requested"] = spec.extra.get("requested")
    return out


def _validate_plan_file(args: argparse.Namespace) -> int:
    """``parplan validate --plan FILE``: the saved plan itself, run and measured."""
    from parplan.agent.launch import LaunchError
    from parplan.agent.validate import hardware
    from parplan.cli_args import UsageError

    used = [f"--{n.replace('_', '-')}" for n in ("model", "gpus", "tp", "pp") if getattr(args, n) is not None]
    if used:
        raise UsageError(f"--plan runs the plan in {args.plan}; leave out {', '.join(used)}")
    try:
        doc = json.loads(Path(args.plan).read_text())
    except OSError as e:
        raise UsageError(f"cannot read {args.plan}: {e.strerror or e}") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"{args.plan} is not JSON: {e.msg} at line {e.lineno}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("strategy"), dict):
        raise UsageError(f"{args.plan} is not a plan document (no strategy)")
    if args.graph is not None:
        return _validate_graph_plan(args, doc)
    arch = (doc.get("model") or {}).get("architecture")
    if not isinstance(arch, dict):
        raise UsageError(f"{args.plan} has no model.architecture (plans of bare operator graphs cannot be run)")
    device = _device(args.device)
    validation = {"id": Path(args.plan).name, "plan": doc, "request": {"model": {"architecture": arch}}}
    try:
        m = measure_validation(validation, device, args.max_procs, hardware(device)["key"], args.diagnose)
    except LaunchError as e:
        print(f"parplan validate: the run failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(m, indent=2, default=str))
    else:
        print(f"plan      {doc['strategy'].get('summary', '')}  ({args.plan})")
        _print_peaks(m["ranks"], lambda r: r["relative_error"]["peak_bytes"], 2)
        if args.diagnose:
            _print_contents(m["ranks"])
        print(f"worst |error| {m['max_relative_error']:.1%}; results "
              + {True: "match a single-process run", False: "DO NOT match a single-process run",
                 None: "not checked"}[m.get("correct")])
    return 0 if m.get("correct") in (True, None) else 1


def _print_contents(ranks: list[dict[str, Any]]) -> None:
    """What the most loaded rank held at each category's peak (``--diagnose``): its largest storages
    (MiB, the operator that made each)."""
    r = max(ranks, key=lambda x: x["measured"]["peak_bytes"])
    for category, summary in (r["measured"].get("contents") or {}).items():
        print(f"rank {r['rank']} at its {category} peak:")
        for row in summary.get("largest", []):
            print(f"  {row[0] / MIB:9.3f} MiB  {row[1]}")


def _print_peaks(ranks: list[dict[str, Any]], error_of: Callable[[dict[str, Any]], float], digits: int) -> None:
    """Each rank's measured and predicted peak (MiB, ``digits`` decimals) and the relative error."""
    print("rank   measured MiB   predicted MiB   error")
    for r in ranks:
        measured, predicted = r["measured"]["peak_bytes"] / MIB, r["predicted"]["peak_bytes"] / MIB
        print(f"  {r['rank']:<4d} {measured:12.{digits}f}   {predicted:13.{digits}f}   {error_of(r):+.1%}")


def _validate_graph_plan(args: argparse.Namespace, doc: dict[str, Any]) -> int:
    """``parplan validate --plan PLAN --graph GRAPH``: a per-operator plan of a graph model (a traced
    one too), run on the graph by the plan interpreter and compared with the cost model."""
    from parplan.agent.ilp_exec import strategies_from_plan
    from parplan.agent.launch import LaunchError
    from parplan.agent.traced_validate import run_traced
    from parplan.cli_args import UsageError
    from parplan.solver.frontends.resize import resize_graph
    from parplan.solver.wire import graph_from_json

    strategy = doc["strategy"]
    if strategy.get("kind") != "intra-operator":
        raise UsageError(f"--graph runs per-operator (ILP) plans; {args.plan} is a {strategy.get('kind')} plan")
    try:
        graph = graph_from_json(Path(args.graph).read_text())
    except OSError as e:
        raise UsageError(f"cannot read {args.graph}: {e.strerror or e}") from None
    graph = resize_graph(graph, {"batch": int(strategy["micro_step_batch"])})
    mesh = tuple(int(x) for x in strategy["mesh"]["shape"])
    if math.prod(mesh) > args.max_procs:
        raise UsageError(f"the plan's mesh {list(mesh)} needs more than --max-procs {args.max_procs} processes")
    strategies = strategies_from_plan(doc, graph)
    demoted = [op for op, st in strategies.items() if int(st.get("zero", 0)) in (1, 2)]
    for op in demoted:  # as spec_for_plan: the executor runs ZeRO 0 and 3
        strategies[op] = {**strategies[op], "zero": 0}
    if demoted:
        print(f"parplan validate: note: {len(demoted)} operator(s) of the plan shard their optimizer states or "
              "gradients (ZeRO-1/2), which the plan interpreter cannot run; they run, and are predicted, as "
              f"ZeRO-0 (first: {demoted[0]})", file=sys.stderr)
    try:
        result = run_traced(graph, strategies, mesh, Path(args.plan).name, str(strategy.get("summary", "")),
                            _device(args.device), diagnose=args.diagnose)
    except LaunchError as e:
        print(f"parplan validate: the run failed: {e}", file=sys.stderr)
        return 1
    result["ran_as_zero0"] = demoted
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(f"plan      {result['plan']}  ({args.plan} on {args.graph})")
        _print_peaks(result["ranks"], lambda r: r["relative_error"], 3)
        print("results " + ("match" if result["correct"] else "DO NOT match") + " a single-process run")
    return 0 if result["correct"] else 1


def _validate_torchtitan(args: argparse.Namespace) -> int:
    """``parplan validate --torchtitan FILE``: the exported job, run by torchtitan's code and measured."""
    from parplan.agent.launch import LaunchError
    from parplan.agent.torchtitan_exec import TorchtitanRunError
    from parplan.agent.torchtitan_validate import compare_torchtitan, format_torchtitan
    from parplan.cli_args import UsageError
    from parplan.imports.common import ImportProblemError

    used = [f"--{n.replace('_', '-')}" for n in ("model", "tp", "pp", "plan") if getattr(args, n) is not None]
    if used:
        raise UsageError(f"--torchtitan runs the job in {args.torchtitan}; leave out {', '.join(used)}")
    try:
        text = Path(args.torchtitan).read_text()
    except OSError as e:
        raise UsageError(f"cannot read {args.torchtitan}: {e.strerror or e}") from None
    device = _device(args.device)
    try:
        result = compare_torchtitan(text, device, gpus=args.gpus, max_procs=args.max_procs, timing_steps=args.steps)
    except (ImportProblemError, TorchtitanRunError) as e:
        raise UsageError(" ".join(str(e).split())) from None
    except LaunchError as e:
        print(f"parplan validate: the run failed: {e}", file=sys.stderr)
        return 1
    print(json.dumps(result, indent=2, default=str) if args.json else format_torchtitan(result))
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from parplan.agent.launch import LaunchError
    from parplan.agent.plans import AUTO_SHRINK_PARAMETERS, config_of_source, spec_for
    from parplan.agent.validate import run_and_compare
    from parplan.cli_args import UsageError, strategy_from_args

    if args.plan is not None:
        return _validate_plan_file(args)
    if args.torchtitan is not None:
        return _validate_torchtitan(args)
    missing = [f"--{n.replace('_', '-')}" for n in ("model", "gpus") if getattr(args, n) is None]
    if missing:
        raise UsageError(f"the following arguments are required: {', '.join(missing)} (or --plan FILE)")
    model, cluster, strategy = strategy_from_args(args)
    cfg = config_of_source(model)
    device = _device(args.device)
    shrink = args.shrink == "yes" or (args.shrink == "auto" and (
        model.parameter_count() > AUTO_SHRINK_PARAMETERS or args.shrink_layers or args.shrink_hidden))
    spec = spec_for(cfg, strategy, args.seq_len, shrink=bool(shrink), shrink_layers=args.shrink_layers,
                    shrink_hidden=args.shrink_hidden, max_procs=args.max_procs, check=not args.no_check,
                    timing_steps=args.steps, diagnose=args.diagnose)
    try:
        result = run_and_compare([spec], device, gpu=cluster.gpu.name)[0]
    except LaunchError as e:
        print(f"parplan validate: the run failed: {e}", file=sys.stderr)
        return 1
    result["notes"] = spec.extra.get("notes", [])
    result["shrunk_from"] = spec.extra["original_model"] if spec.extra.get("shrunk") else None
    if args.json:
        print(json.dumps(result, indent=2, default=str))
    else:
        print(format_comparison(result))
    return 0 if result["correct"] in (True, None) else 1


def _mib(n: float) -> str:
    return f"{n / MIB:8.2f}"


def format_comparison(result: dict[str, Any]) -> str:
    """A readable table of one comparison (MiB, measured / predicted per category)."""
    c = result["config"]
    m = c["model"]
    lines = [
        f"model     {m['name']}  (layers {m['layers']}, hidden {m['hidden']}, heads {m['heads']}, ffn {m['ffn']}, "
        f"vocab {m['vocab']}, seq {c['seq_len']})"
        + (f"  shrunk from {result['shrunk_from']}" if result.get("shrunk_from") else ""),
        f"strategy  tp{c['tp']} pp{c['pp']} dp{c['dp']} zero{c['zero']}{' sp' if c['sequence_parallel'] else ''} "
        f"recompute={c['recompute']} mb{c['micro_batch']}x{c['num_microbatches']} {c['schedule']}  "
        + (f"optimizer offload {c['optimizer_offload']:g}  " if c.get("optimizer_offload") else "")
        + f"fp32, attention {c['attention_kernel']} (predicted with flash_attention={c['flash_attention']})",
    ]
    for note in result.get("notes") or []:
        lines.append(f"note      {note}")
    lines += ["", "per rank, MiB measured / predicted (category peaks; 'other' is not in the cost model)",
              f"{'rank':>4s} {'stage':>5s}  {'params':>17s}  {'grads':>17s}  {'optimizer':>17s}  "
              f"{'activations':>17s}  {'temporary':>17s}  {'other':>8s}  {'peak':>17s}  {'error':>7s}"]
    for r in result["ranks"]:
        mb, pb = r["measured"]["breakdown"], r["predicted"]["breakdown"]
        cells = [f"{_mib(mb[k])}/{_mib(pb[k]).strip():>8s}" for k in
                 ("parameters", "gradients", "optimizer_states", "activations", "temporary")]
        lines.append(f"{r['rank']:>4d} {r['stage']:>5d}  " + "  ".join(cells) + f"  {_mib(mb['other'])}  "
                     f"{_mib(r['measured']['peak_bytes'])}/{_mib(r['predicted']['peak_bytes']).strip():>8s}  "
                     f"{r['relative_error']['peak_bytes']:+7.1%}")
    for r in result["ranks"]:
        if "host" in r["measured"]:  # the offloaded optimizer's host memory, not in the device's peak
            lines.append(f"{r['rank']:>4d} host  {_mib(r['measured']['host']['peak_bytes'])}/"
                         f"{_mib(r['predicted']['host_bytes']).strip():>8s} MiB for the offloaded optimizer  "
                         f"{r['relative_error']['host_bytes']:+7.1%}")
    ml = result["most_loaded"]
    lines += ["", f"most loaded rank: measured {_mib(ml['measured_peak_bytes']).strip()} MiB, predicted "
                  f"{_mib(ml['predicted_peak_bytes']).strip()} MiB ({(ml['relative_error'] or 0):+.1%}); "
                  f"max per-rank error {result['max_relative_error']:.1%}"]
    checks = [r["check"] for r in result["ranks"] if "check" in r]
    if checks:
        worst = max(x["max_abs_grad_error"] for x in checks)
        loss = next((x for x in checks if "loss" in x), None)
        verdict = "match" if result["correct"] else "MISMATCH"
        extra = (f"; loss {loss['loss']:.6f} vs {loss['reference_loss']:.6f}, after one Adam step "
                 f"{loss['loss_after_step']:.6f} vs {loss['reference_loss_after_step']:.6f}") if loss else ""
        lines.append(f"correctness vs single process: {verdict} (max |grad diff| {worst:.2e}, "
                     f"rtol {checks[0]['rtol']}, atol {checks[0]['atol']}{extra})")
        for x in checks:
            for bad in x["mismatches"][:5]:
                lines.append(f"  {bad}")
    st = result["step_seconds"]
    lines.append(f"step time: measured {st['measured']:.3f} s (median, slowest rank)"
                 + ("" if st.get("comparable", True) else ", ranks sharing GPUs through gloo: no measure")
                 + f"; predicted {st['predicted']:.4f} s for the planned GPUs")
    return "\n".join(lines)


def cmd_agent(args: argparse.Namespace) -> int:
    import torch

    from parplan.agent.client import Agent, ServiceClient
    from parplan.agent.microbench import profile
    from parplan.agent.validate import hardware

    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    device = _device(args.device)
    hw = hardware(device)
    max_procs = args.max_procs or (torch.cuda.device_count() if device == "cuda" else 8)

    def measure(validation: dict[str, Any]) -> dict[str, Any]:
        return measure_validation(validation, device, max_procs, hw["key"])

    def run(validation: dict[str, Any]) -> dict[str, Any]:
        # The launcher installs its own SIGTERM/SIGINT handlers when it runs on the main thread (and
        # never restores ours); on a worker thread it leaves them alone, so a signal during a run
        # still means "finish this validation, post it, exit".
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="parplan-run") as pool:
            return pool.submit(measure, validation).result()

    def profiler() -> dict[str, Any]:
        return profile(hw, torch.device("cuda", 0) if device == "cuda" else torch.device("cpu"), max_procs)

    client = ServiceClient(args.server, args.token)
    agent = Agent(client, args.name or socket.gethostname(), hw, run, None if args.no_profile else profiler,
                  wait_seconds=args.wait_seconds, heartbeat_s=args.heartbeat_seconds,
                  max_validations=1 if args.once else None)

    def _stop(signum: int, _frame: Any) -> None:
        logging.getLogger("parplan.agent").info("signal %d: finishing the current validation, then exiting", signum)
        agent.stop()

    previous = {s: signal.signal(s, _stop) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        agent.run()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        client.close()
    return 0
