"""``parplan remote plan``: ``parplan plan`` answered by a planning service (``--url`` or
``PARPLAN_URL``; the token from ``PARPLAN_TOKEN``, never a flag). Registered by :mod:`parplan.cli`;
the client is imported only when the command runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from parplan.cli_args import add_plan_args

    remote = sub.add_parser("remote", help="run a command on a planning service over HTTP",
                            description="Commands answered by a parplan service (`parplan serve`).")
    remote_sub = remote.add_subparsers(dest="remote_command", required=True, metavar="COMMAND")
    plan = remote_sub.add_parser(
        "plan", help="parplan plan, solved by the service",
        description="The same flags and output as `parplan plan`; the service solves (or answers from its "
                    "cache). The token comes from PARPLAN_TOKEN.")
    add_plan_args(plan)
    plan.add_argument("--url", default=None, help="the service, e.g. http://127.0.0.1:8000 (default: PARPLAN_URL)")
    plan.add_argument("--timeout", type=float, default=30.0, help="seconds for each HTTP call (default 30)")
    plan.add_argument("--wait-timeout", type=float, default=None,
                      help="give up waiting for the plan after this many seconds (default: no limit)")
    plan.set_defaults(handler=cmd_remote_plan)


def _progress_printer() -> Any:
    last: list[tuple[str, str | None]] = []

    def show(job: dict[str, Any]) -> None:
        key = (job["status"], job["progress"]["stage"])
        if not last or last[-1] != key:
            last.append(key)
            print(f"parplan remote: job {job['id']} {job['status']}: {job['progress']['stage']} "
                  f"{job['progress']['fraction']:.0%}", file=sys.stderr, flush=True)
    return show


def cmd_remote_plan(args: argparse.Namespace) -> int:
    from parplan.cli_args import UsageError, plan_request_from_args
    from parplan.cli_output import plan_table, write_export
    from parplan.client import ApiError, Client, JobCancelledError, JobFailedError, ParplanError

    if args.export is not None and args.target == "any":
        raise UsageError("--export needs --target (megatron, torchtitan, deepspeed, galvatron or parplan)")
    if not (args.url or os.environ.get("PARPLAN_URL")):
        raise UsageError("give --url or set PARPLAN_URL (e.g. http://127.0.0.1:8000)")
    body = plan_request_from_args(args)
    try:
        with Client(args.url, timeout=args.timeout) as client:
            doc = client.plan_and_wait(body, timeout=args.wait_timeout, on_progress=_progress_printer())
            if args.export is not None and doc.get("memory") is not None:
                written = write_export(client.export(doc["id"], args.target), Path(args.export))
                print(f"wrote {', '.join(written)} to {args.export}", file=sys.stderr)
    except ApiError as e:
        fields = "; ".join(f"{x.get('field')}: {x.get('message')}" for x in e.errors[:10]
                           if str(x.get("message")) not in e.detail)
        raise UsageError(f"the service answered {e.status}: {e.detail}" + (f" ({fields})" if fields else "")) \
            from None
    except (JobFailedError, JobCancelledError) as e:
        print(f"parplan remote plan: {e}", file=sys.stderr)
        return 3 if isinstance(e, JobFailedError) and e.code == "unsolvable" else 1
    except ParplanError as e:
        print(f"parplan remote plan: error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(doc, indent=2) if args.json else plan_table(doc, args.pareto))
    return 0 if doc.get("memory") is not None else 3
