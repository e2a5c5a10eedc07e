"""Printing and writing what the planner answers: the plan table and an export's files (shared by
``parplan plan`` and ``parplan remote plan``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from parplan.cli_args import UsageError
from parplan.solver.cost.memory import CATEGORIES

GIB = 2**30


def gib(n: float) -> str:
    return f"{n / GIB:9.2f}"


def idle_time(t: dict[str, Any], pp: int) -> str:
    """The share of the step beyond the slowest stage's micro-batches (``time.bubble_fraction``), named
    for what it is: with a pipeline, its fill and drain (the bubble) and, where the stages' times are
    listed, the once-per-step work apart from it (the slowest stage's optimizer step and the
    data-parallel traffic compute does not hide); without one, that once-per-step work alone."""
    frac = t.get("bubble_fraction")
    if frac is None:
        return ""
    if pp <= 1:
        return f"optimizer + exposed DP {frac:.1%}"
    stages = t.get("stages")
    if stages and t["step_seconds"] > 0:
        once = max(s["dp_exposed_seconds"] + s["optimizer_seconds"] for s in stages) / t["step_seconds"]
        return f"bubble {frac - once:.1%}, optimizer + exposed DP {once:.1%}"
    return f"bubble + optimizer + exposed DP {frac:.1%}"


def plan_table(doc: dict[str, Any], pareto: bool = False) -> str:
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
            lines.append(f"  {cat:<22s} {gib(mem['breakdown'][cat])}  {gib(mem['redundant'][cat])}")
        lines.append(f"  {'peak':<22s} {gib(mem['peak_bytes'])}")
        lines.append(f"step time {doc['time']['step_seconds']:.3f} s, {doc['time']['tokens_per_second']:,.0f} tokens/s")
        lines += _accuracy_line(doc["time"].get("accuracy"))
    lines += ["", "baselines            peak GiB   step s   memory ratio  throughput ratio   strategy"]
    for name, b in doc["baselines"].items():
        if b is None:
            lines.append(f"  {name:<16s}  (none applies)")
            continue
        rel = (doc.get("relative") or {}).get(name) or {}
        ratio = f"{rel['memory']:.2f}" if rel.get("memory") is not None else "-"
        thr = f"{rel['throughput']:.2f}" if rel.get("throughput") is not None else "-"
        fit = "" if b["fits"] else " (does not fit)"
        lines.append(f"  {name:<16s} {b['memory']['peak_bytes'] / GIB:9.2f} {b['time']['step_seconds']:8.3f}   "
                     f"{ratio:>10s}   {thr:>12s}        {b['strategy']['summary']}{fit}")
    target = doc.get("target") or {}
    vs = target.get("versus_baseline")
    if target.get("name", "any") != "any":
        line = f"target    {target['name']} (buffers of the {target['runtime']} runtime)"
        if vs:
            faster = "faster" if vs["seconds_saved"] >= 0 else "slower"
            less = "less" if vs["memory_saved_bytes"] >= 0 else "more"
            line += (f": vs its baseline {target['baseline']}, uses {abs(vs['memory_saved_bytes']) / GIB:.2f} GiB "
                     f"{less} per device, {abs(vs['seconds_saved']):.3f} s per step {faster}")
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


def write_export(exported: dict[str, Any], out: Path) -> list[str]:
    """Write an export's files into ``out`` (created); their names."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name, text in exported["files"].items():
            (out / name).write_text(text)
    except OSError as e:
        raise UsageError(f"cannot write to {out}: {e.strerror or e}") from None
    return sorted(exported["files"])


def _accuracy_line(acc: dict[str, Any] | None) -> list[str]:
    """How far the time model was from published runs of the plan's kind (``time.accuracy``)."""
    if not acc:
        return []
    sim = acc.get("similar_runs")
    if sim:
        return [f"          on {sim['rows']} published runs of runtime {sim['runtime']} on {sim['generation']}: "
                f"predicted / published {sim['geometric_mean_ratio']:.2f} ({sim['min_ratio']:.2f}-"
                f"{sim['max_ratio']:.2f})"]
    if acc.get("published_runs") is None:
        return [f"          calibration {acc.get('calibration')}: never compared with published runs"]
    return ["          no published run of this runtime on this GPU generation to compare with"]
