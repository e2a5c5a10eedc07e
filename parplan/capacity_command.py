"""``parplan capacity`` and ``parplan replan``: capacity sweeps and replans, answered by a planning
service (``--url`` or ``PARPLAN_URL``; the token from ``PARPLAN_TOKEN``). ``--json`` prints the
service's result document. Registered by :mod:`parplan.cli`; the client is imported only when a
command runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cap = sub.add_parser("capacity", help="how many GPUs of which type: one plan per pool and GPU count",
                         description="Plan the training job on every allocation of each pool (powers of two below "
                                     "a node, then every whole number of nodes up to the pool's maximum) on a "
                                     "planning service; print each cell's throughput, time to train and cost.")
    cap.add_argument("--model", required=True, help="a preset name, an HF config.json or a graph JSON file")
    cap.add_argument("--pool", action="append", required=True, metavar="GPU:PER_NODE:MAX:PRICE",
                     help="a pool: GPU preset, GPUs per node, most GPUs, price per GPU-hour (repeat for more)")
    cap.add_argument("--tokens", type=float, required=True, help="tokens to train")
    cap.add_argument("--global-batch", type=int, required=True, help="samples per step (every allocation)")
    cap.add_argument("--seq-len", type=int, default=None, help="tokens per sample (default: the model's)")
    cap.add_argument("--precision", default=None, help="training precision (default bf16)")
    cap.add_argument("--target", default="any", help="the trainer the plans are for (default any)")
    goal = cap.add_mutually_exclusive_group()
    goal.add_argument("--deadline-hours", type=float, default=None, help="pick the cheapest that trains by then")
    goal.add_argument("--budget", type=float, default=None, help="pick the fastest within this cost")
    _service_args(cap)
    cap.set_defaults(handler=cmd_capacity)

    rep = sub.add_parser("replan", help="the best plan after the allocation changes, and the switch's cost",
                         description="Replan a plan the service made on a new allocation, kept to what the "
                                     "plan's trainer can resume its checkpoint into.")
    rep.add_argument("plan_id", help="the plan the job runs now (its id on the service)")
    alloc = rep.add_mutually_exclusive_group(required=True)
    alloc.add_argument("--gpus", type=int, default=None, help="the new GPU count")
    alloc.add_argument("--nodes-lost", type=int, default=None, help="whole nodes lost (a failure)")
    rep.add_argument("--storage-gb-per-second", type=float, default=None, help="checkpoint bandwidth (default 10)")
    rep.add_argument("--checkpoint-interval-steps", type=int, default=None, help="steps between saves (default 1000)")
    rep.add_argument("--dp-reshardable-optimizer", action="store_true",
                     help="Megatron-LM: the optimizer state was saved in the default dp_reshardable format")
    _service_args(rep)
    rep.set_defaults(handler=cmd_replan)


def _service_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=None, help="the service, e.g. http://127.0.0.1:8000 (default: PARPLAN_URL)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds for each HTTP call (default 30)")
    p.add_argument("--wait-timeout", type=float, default=None, help="give up waiting after this many seconds")
    p.add_argument("--json", action="store_true", help="print the service's result document")


def _model(text: str) -> dict[str, Any]:
    from parplan.cli_args import UsageError

    path = Path(text)
    if not path.is_file():
        return {"preset": text}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UsageError(f"--model: cannot read {text}: {e}") from None
    return {"graph": doc} if isinstance(doc, dict) and "nodes" in doc else {"hf_config": doc}


def _pool(text: str) -> dict[str, Any]:
    from parplan.cli_args import UsageError

    parts = text.split(":")
    try:
        gpu, per_node, most, price = parts
        return {"gpu": gpu, "gpus_per_node": int(per_node), "max_gpus": int(most), "price_per_gpu_hour": float(price)}
    except ValueError:
        raise UsageError(f"--pool: {text!r} is not GPU:PER_NODE:MAX:PRICE (e.g. H100-80GB:8:64:2.5)") from None


def capacity_body(args: argparse.Namespace) -> dict[str, Any]:
    training: dict[str, Any] = {"global_batch": args.global_batch, "tokens": args.tokens}
    if args.seq_len is not None:
        training["seq_len"] = args.seq_len
    if args.precision is not None:
        training["precision"] = args.precision
    body: dict[str, Any] = {"model": _model(args.model), "training": training, "target": args.target,
                            "pools": [_pool(p) for p in args.pool]}
    if args.deadline_hours is not None or args.budget is not None:
        body["goal"] = {k: v for k, v in (("deadline_hours", args.deadline_hours), ("budget", args.budget))
                        if v is not None}
    return body


def _run(args: argparse.Namespace, kind: str, body: dict[str, Any]) -> dict[str, Any]:
    from parplan.cli_args import UsageError
    from parplan.client import ApiError, Client, ParplanError

    if not (args.url or os.environ.get("PARPLAN_URL")):
        raise UsageError("give --url or set PARPLAN_URL (e.g. http://127.0.0.1:8000)")
    try:
        with Client(args.url, timeout=args.timeout) as client:
            return client.sweep_and_wait(kind, body, timeout=args.wait_timeout)
    except ApiError as e:
        fields = "; ".join(f"{x.get('field')}: {x.get('message')}" for x in e.errors[:10]
                           if str(x.get("message")) not in e.detail)
        raise UsageError(f"the service answered {e.status}: {e.detail}" + (f" ({fields})" if fields else "")) \
            from None
    except ParplanError as e:  # unreachable, or the job failed or was cancelled
        print(f"parplan {kind}: error: {e}", file=sys.stderr)
        raise SystemExit(1) from None


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def capacity_table(doc: dict[str, Any]) -> str:
    lines = [f"{'gpu':<12s} {'gpus':>5s} {'fits':>5s} {'tokens/s':>12s} {'scaling':>8s} {'hours':>10s} "
             f"{'cost':>12s}"]
    frontier = {(c["gpu"], c["gpus"]) for c in doc["frontier"]}
    for c in doc["cells"]:
        fits = "-" if c["fits"] is None else ("yes" if c["fits"] else "no")
        mark = " *" if (c["gpu"], c["gpus"]) in frontier else ""
        lines.append(f"{c['gpu']:<12s} {c['gpus']:>5d} {fits:>5s} {_num(c['tokens_per_second'], ',.0f'):>12s} "
                     f"{_num(c['scaling_efficiency'], '.2f'):>8s} {_num(c['time_to_train_hours'], ',.1f'):>10s} "
                     f"{_num(c['cost'], ',.0f'):>12s}{mark}")
    lines.append("* on the time/cost frontier")
    for gpu, n in doc["fewest_gpus_that_fit"].items():
        lines.append(f"fewest {gpu} that fit: {n if n is not None else 'none up to the pool maximum'}")
    for key in ("cheapest_meeting_deadline", "fastest_within_budget"):
        c = doc.get(key)
        if c is not None:
            lines.append(f"{key.replace('_', ' ')}: {c['gpus']} x {c['gpu']}, {c['time_to_train_hours']:,.1f} h, "
                         f"cost {c['cost']:,.0f}")
    if doc.get("note"):
        lines.append(doc["note"])
    return "\n".join(lines)


def cmd_capacity(args: argparse.Namespace) -> int:
    doc = _run(args, "capacity", capacity_body(args))
    print(json.dumps(doc, indent=2) if args.json else capacity_table(doc))
    return 0 if doc.get("goal_met") is not False else 3


def cmd_replan(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"plan_id": args.plan_id}
    for key in ("gpus", "nodes_lost", "storage_gb_per_second", "checkpoint_interval_steps"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    if args.dp_reshardable_optimizer:
        body["reshardable_optimizer"] = False
    doc = _run(args, "replan", body)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"{doc['gpus_before']} -> {doc['gpus']} {doc['gpu']}: plan {doc['plan_id'] or 'none'}; "
              f"resumable: {doc['resumable']}", file=sys.stdout)
        for reason in doc["reasons"]:
            print(f"  {reason}")
        cost = doc.get("switch_cost")
        if cost:
            print(f"switch: load {cost['load_seconds']:.0f} s, save {cost['save_seconds']:.0f} s, "
                  f"{cost['lost_steps']:.0f} steps lost ({cost['lost_seconds']:.0f} s); "
                  f"total {cost['total_seconds']:.0f} s")
    return 0 if doc["resumable"] is not False else 3
