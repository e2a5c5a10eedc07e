"""The Ultra-Scale Playbook's nanotron runs priced as they ran: each row written as the nanotron
config nanotron's ``scripts/scaling_benchmarks.py`` generates for it, read back by parplan's
nanotron import (``parplan memory --from nanotron-config``) and priced with the runtime ``nanotron``.

    python bench/nanotron_published.py [--rows 40] [--all] [--out bench/out/nanotron_published.txt]

The playbook prints one figure per run, world rank 0's (``create_table_log`` writes rank 0's CSV):
the first pipeline stage. Each row is compared with stage 0's predicted allocated peak, and with the
same strategy under the runtime ``megatron`` (Megatron-LM's buffers, its even split of the layers),
for comparison. The counter (allocated or reserved) is not stated (docs/nanotron.md says which this
benchmark believes and why). :func:`price_playbook_row` prices one row; rows parplan cannot price as
they ran come back with ``apart`` saying why, never dropped.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import header
from parplan.imports.common import ImportProblemError
from parplan.imports.nanotron import imported_of
from parplan.solver.cost.nanotron import nanotron_partition
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.cost.runtime import Runtime
from parplan.solver.errors import SolverError

DATA = Path(__file__).resolve().parent / "data" / "published_memory_runs.json"
GIB = 2**30
SOURCE_GROUP = "ultrascale_playbook"


@dataclass(frozen=True)
class RowPrice:
    """One playbook row priced: GiB per device; ``apart``: why it is not priced (None when it is)."""

    id: str
    measured_gib: float
    stage0_gib: float | None = None  # stage 0's predicted allocated peak (world rank 0, what the row prints)
    peak_gib: float | None = None  # the most loaded stage's (None: stage 0 priced alone)
    megatron_stage0_gib: float | None = None  # stage 0 under the runtime megatron (even split)
    apart: str | None = None

    @property
    def ratio(self) -> float | None:
        """measured / predicted (stage 0)."""
        return self.measured_gib / self.stage0_gib if self.stage0_gib else None


def playbook_config(row: Mapping[str, Any]) -> dict[str, Any]:
    """The nanotron config of a playbook row as ``scripts/scaling_benchmarks.py`` ``create_config``
    writes it over ``examples/config_tiny_llama_bench.yaml`` (bf16, AdamW fused, ``pp_engine`` 1f1b,
    ``ddp_bucket_cap_mb`` 25, fp32 accumulation; ``tp_linear_async_communication`` with REDUCE_SCATTER)."""
    m = row["model"]
    return {
        "general": {"project": "bench", "run": row["id"]},
        "parallelism": {"dp": row["dp"], "tp": row["tp"], "pp": row["pp"], "pp_engine": "1f1b",
                        "tp_mode": "REDUCE_SCATTER", "tp_linear_async_communication": True},
        "model": {"dtype": "bfloat16", "ddp_bucket_cap_mb": 25, "make_vocab_size_divisible_by": 1,
                  "init_method": {"std": 0.025},
                  "model_config": {"hidden_size": m["hidden"], "intermediate_size": m["ffn"],
                                   "num_attention_heads": m["heads"], "num_key_value_heads": m["kv_heads"],
                                   "num_hidden_layers": m["layers"], "vocab_size": m["vocab"],
                                   "tie_word_embeddings": m["tied_embeddings"],
                                   "max_position_embeddings": row["seq_len"]}},
        "tokens": {"sequence_length": row["seq_len"], "micro_batch_size": row["micro_batch"],
                   "batch_accumulation_per_replica": row["grad_accum"], "train_steps": 10},
        "optimizer": {"zero_stage": int(row["zero_fsdp"].split("-")[1]), "accumulate_grad_in_fp32": True,
                      "clip_grad": 1.0, "weight_decay": 0.01,
                      "optimizer_factory": {"name": "adamW", "adam_beta1": 0.9, "adam_beta2": 0.95,
                                            "adam_eps": 1e-8, "torch_adam_is_fused": True},
                      "learning_rate_scheduler": {"learning_rate": 3e-4}},
    }


def stage0_partition(part: tuple[int, ...]) -> tuple[int, ...] | None:
    """A split with the same layers on stage 0 and at least one on every later stage, taken from the
    later stages nearest the empty ones (None when they hold too few): stage 0's memory depends on its
    own layers and the in-flight count only, so it prices world rank 0 of a split that leaves a rank
    without a decoder layer, which parplan does not model as a whole."""
    rest = list(part[1:])
    for i in range(len(rest)):
        while rest[i] == 0:
            donors = [j for j in range(len(rest)) if rest[j] > 1]
            if not donors:
                return None
            j = max(donors)
            rest[j] -= 1
            rest[i] += 1
    return (part[0], *rest)


def price_playbook_row(row: Mapping[str, Any]) -> RowPrice:
    """Stage 0's predicted peak of a playbook row, read through parplan's nanotron import. Where
    nanotron leaves a rank without a decoder layer, stage 0 alone is priced (:func:`stage0_partition`;
    ``peak_gib`` None)."""
    measured = float(row["memory_gib"])
    cfg = playbook_config(row)
    whole = True
    try:
        imported = imported_of(cfg, row["gpus"])
        strategy = imported.strategy
    except ImportProblemError as e:
        m = row["model"]
        own = nanotron_partition(m["layers"], m["hidden"], m["heads"], m["ffn"], m["vocab"], row["pp"])
        shifted = stage0_partition(own) if len(e.problems) == 1 and 0 in own else None
        if shifted is None:
            return RowPrice(row["id"], measured, apart="; ".join(e.problems))
        flat = {**cfg, "parallelism": {**cfg["parallelism"], "pp": 1}}
        imported = imported_of(flat, row["gpus"] // row["pp"])
        strategy = replace(imported.strategy, pp=row["pp"], partition=shifted)
        whole = False
    assert imported.model is not None
    graph = imported.model.build(strategy.micro_batch, imported.seq_len)
    try:
        mem = plan_memory(graph, strategy)
        megatron = plan_memory(graph, replace(strategy, runtime=Runtime.MEGATRON, partition=None))
    except SolverError as e:
        return RowPrice(row["id"], measured, apart=str(e))
    return RowPrice(row["id"], measured, mem.stages[0].peak_bytes / GIB, mem.peak_bytes / GIB if whole else None,
                    megatron.stages[0].peak_bytes / GIB)


def playbook_rows(path: Path = DATA) -> list[dict[str, Any]]:
    return [r for r in json.loads(path.read_text())["runs"]
            if r["source_group"] == SOURCE_GROUP and r["memory_gib"] is not None]


def sample(rows: list[dict[str, Any]], n: int, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows spread over the model sizes and the layouts (pipelining or not, TP or not, ZeRO):
    round-robin over those strata, each shuffled with ``seed``."""
    strata: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        strata.setdefault((r["model"]["layers"], r["pp"] > 1, r["tp"] > 1, r["zero_fsdp"]), []).append(r)
    rng = random.Random(seed)
    for group in strata.values():
        rng.shuffle(group)
    out: list[dict[str, Any]] = []
    keys = sorted(strata)
    while len(out) < n and any(strata.values()):
        for k in keys:
            if strata[k] and len(out) < n:
                out.append(strata[k].pop())
    return out


def _quantiles(values: list[float]) -> str:
    if not values:
        return "none"
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return (f"min {min(values):.2f}, p10 {q[0]:.2f}, median {statistics.median(values):.2f}, p90 {q[8]:.2f}, "
            f"max {max(values):.2f} ({len(values)} rows)")


def report(rows: Iterable[Mapping[str, Any]], prices: list[RowPrice]) -> str:
    lines = ["id                       model  nodes  dp tp pp zero mbs acc | measured  nanotron  ratio | "
             "megatron ratio"]
    by_id = {r["id"]: r for r in rows}
    for p in prices:
        r = by_id[p.id]
        cfg = (f"{p.id:24} {r['model']['layers']:>5}L {r['nodes']:>5} {r['dp']:>3} {r['tp']:>2} {r['pp']:>2} "
               f"{r['zero_fsdp'][-1]:>4} {r['micro_batch']:>3} {r['grad_accum']:>3} | {p.measured_gib:8.1f}")
        if p.apart is not None:
            lines.append(f"{cfg}  apart: {p.apart}")
            continue
        assert p.stage0_gib is not None and p.megatron_stage0_gib is not None and p.ratio is not None
        lines.append(f"{cfg}  {p.stage0_gib:8.1f}  {p.ratio:5.2f} | {p.megatron_stage0_gib:8.1f} "
                     f"{p.measured_gib / p.megatron_stage0_gib:5.2f}")
    priced = [p for p in prices if p.apart is None]
    megatron = [p.measured_gib / p.megatron_stage0_gib for p in priced if p.megatron_stage0_gib]
    lines += ["", "measured / predicted, stage 0 (world rank 0, the rank the playbook prints):",
              f"  runtime nanotron: {_quantiles([p.ratio for p in priced if p.ratio is not None])}",
              f"  runtime megatron: {_quantiles(megatron)}",
              f"  measured - predicted (nanotron), GiB: "
              f"{_quantiles([p.measured_gib - (p.stage0_gib or 0.0) for p in priced])}",
              f"  shown apart: {len(prices) - len(priced)} of {len(prices)}"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=40, help="rows sampled across sizes and layouts")
    ap.add_argument("--all", action="store_true", help="every playbook row (slow)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    rows = playbook_rows()
    chosen = rows if args.all else sample(rows, args.rows, args.seed)
    prices = [price_playbook_row(r) for r in chosen]
    scope = "every row" if args.all else f"{len(chosen)} rows sampled"
    text = header(f"The Ultra-Scale Playbook's nanotron runs, priced with the runtime nanotron ({scope})") + \
        "\n" + report(chosen, prices) + "\n"
    print(text, end="")
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
