"""Measured vs predicted for a torchtitan export: the same file run by torchtitan's code and priced
by parplan's import of it (:mod:`parplan.imports.torchtitan`) with the torchtitan runtime's rules
for the kernels the ranks ran (``torchtitan-cpu`` on a CPU)."""

from __future__ import annotations

import dataclasses
from typing import Any

from parplan.agent.launch import LaunchError
from parplan.agent.torchtitan_exec import (
    CPU_SUBSTITUTIONS,
    DATA_NOTE,
    check_runnable,
    measure,
    parse_config,
    torchtitan_args,
)
from parplan.imports import price
from parplan.imports.common import ImportProblemError
from parplan.imports.torchtitan import KIND, read_torchtitan_args
from parplan.solver.cluster import make_cluster
from parplan.solver.cost.runtime import Runtime

MIB = 1 << 20


def world_of(config: Any, gpus: int | None) -> int:
    """Ranks of the job of torchtitan's ``config``: ``gpus`` when given, else the product of its degrees
    (a data-parallel shard degree of -1, torchtitan's "the rest", needs ``gpus``)."""
    if gpus is not None:
        return gpus
    par = config.parallelism
    degrees = (par.data_parallel_replicate_degree, par.data_parallel_shard_degree, par.tensor_parallel_degree,
               par.pipeline_parallel_degree, par.context_parallel_degree)
    if min(degrees) < 1:
        raise ImportProblemError(KIND, ["data_parallel_shard_degree -1 takes the ranks left over: give --gpus"])
    world = 1
    for d in degrees:
        world *= d
    return world


def compare_torchtitan(text: str, device: str, gpus: int | None = None, max_procs: int = 8,
                       timing_steps: int = 2) -> dict[str, Any]:
    """Run the job of ``text`` (an export's ``torchtitan_args.txt``) and compare each rank's peak with
    the prediction. Keys: ``predicted`` (the memory document), ``ranks`` (measured, relative error),
    ``max_relative_error``, ``substitutions``, ``runtime``."""
    config = parse_config(torchtitan_args(text))
    check_runnable(config, device)
    world = world_of(config, gpus)
    if world > max_procs:
        raise LaunchError(f"the job needs {world} ranks; --max-procs is {max_procs}")
    imported = read_torchtitan_args(text, world)
    runtime = Runtime.TORCHTITAN_CPU if device == "cpu" else Runtime.TORCHTITAN
    imported = dataclasses.replace(imported, strategy=dataclasses.replace(imported.strategy, runtime=runtime))
    predicted = price(imported, make_cluster(world))
    reports = measure(text, world, device, timing_steps)
    peak = int(predicted["memory"]["peak_bytes"])
    ranks = []
    for r in reports:
        m = r["measured"]
        ranks.append({"rank": r["rank"], "measured": m, "losses": r["losses"], "step_seconds": r["step_seconds"],
                      "relative_error": (peak - m["peak_bytes"]) / m["peak_bytes"]})
    return {
        "file_kind": KIND, "runtime": runtime.value, "device": device, "ranks_run": world,
        "strategy": predicted.get("strategy", {}), "predicted": predicted["memory"],
        "predicted_step_seconds": (predicted.get("time") or {}).get("step_seconds"),
        "ranks": ranks, "max_relative_error": max(abs(r["relative_error"]) for r in ranks),
        "under_predicted": any(r["relative_error"] < 0 for r in ranks),
        "substitutions": list(CPU_SUBSTITUTIONS) if device == "cpu" else [], "notes": [DATA_NOTE],
        "import": predicted.get("import", {}),
    }


def format_torchtitan(result: dict[str, Any]) -> str:
    """The comparison as a table (MiB), one line per rank, then what the ranks ran differently."""
    pred = result["predicted"]
    lines = [f"torchtitan job on {result['ranks_run']} {result['device']} ranks (torchtitan's own code); "
             f"predicted with runtime {result['runtime']}",
             f"{'category':18s} {'predicted':>10s} " + " ".join(f"{'rank ' + str(r['rank']):>10s}"
                                                            for r in result["ranks"])]
    for cat in ("parameters", "gradients", "optimizer_states", "activations", "temporary", "other"):
        p = pred["breakdown"].get(cat)
        lines.append(f"{cat:18s} {'' if p is None else f'{p / MIB:10.2f}':>10s} "
                     + " ".join(f"{r['measured']['breakdown'].get(cat, 0) / MIB:10.2f}" for r in result["ranks"]))
    lines.append(f"{'peak':18s} {pred['peak_bytes'] / MIB:10.2f} "
                 + " ".join(f"{r['measured']['peak_bytes'] / MIB:10.2f}" for r in result["ranks"]))
    lines.append("(categories: each at its own peak)")
    lines.append("error (predicted - measured) / measured: "
                 + ", ".join(f"rank {r['rank']} {r['relative_error']:+.1%}" for r in result["ranks"])
                 + ("  UNDER-PREDICTED" if result["under_predicted"] else ""))
    for s in result["substitutions"] + result["notes"]:
        lines.append(f"  - {s}")
    return "\n".join(lines)


__all__ = ["compare_torchtitan", "format_torchtitan", "world_of"]
