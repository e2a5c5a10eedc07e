"""Time loading and evaluating the largest presets, and loading + validating a 100k-node graph.

For each preset: build the operator graph (one micro-batch), validate it, serialise it to the
JSON wire format and parse it back, and evaluate one strategy's memory and step time.
Run: python bench/load_presets.py
"""

from __future__ import annotations

import json
import time

from _common import header

from parplan.solver.cluster import make_cluster
from parplan.solver.evaluate import evaluate_graph
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import get_preset
from parplan.solver.strategy import ParallelConfig
from parplan.solver.validate import validate_graph
from parplan.solver.wire import graph_from_json, graph_to_json

CASES = [  # preset, gpus, tp, pp
    ("gpt3-175b", 1024, 8, 16),
    ("llama-3-405b", 16384, 8, 16),
    ("llama-2-70b", 1024, 8, 4),
    ("mixtral-8x7b", 64, 2, 4),
    ("t5-11b", 64, 8, 1),
]


def main() -> None:
    print(header("Loading and evaluating the largest presets"))
    print("| preset | nodes | build s | validate s | JSON out+in s | evaluate s | peak GiB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, gpus, tp, pp in CASES:
        cfg = get_preset(name)
        t0 = time.perf_counter()
        g = build_graph(cfg, batch=1)
        t1 = time.perf_counter()
        validate_graph(g)
        t2 = time.perf_counter()
        again = graph_from_json(graph_to_json(g))
        t3 = time.perf_counter()
        assert len(again) == len(g)
        dp = gpus // (tp * pp)
        ev = evaluate_graph(g, name, g.parameter_count(), make_cluster(gpus, 8, "H100-80GB"),
                            ParallelConfig(tp=tp, pp=pp, dp=dp, zero=1, sequence_parallel=tp > 1,
                                           num_microbatches=4 * pp))
        t4 = time.perf_counter()
        print(f"| {name} | {len(g):,} | {t1 - t0:.3f} | {t2 - t1:.3f} | {t3 - t2:.3f} | {t4 - t3:.3f} | "
              f"{ev.memory.peak_bytes / 2**30:.1f} |")
    n = 100_000
    nodes = [{"id": "n0", "kind": "input", "dims": {"batch": 8, "hidden": 64}}]
    nodes += [{"id": f"n{i}", "kind": "elementwise", "inputs": [f"n{i - 1}"], "dims": {"batch": 8, "hidden": 64},
               "attrs": {"fn": "relu"}} for i in range(1, n)]
    text = json.dumps({"nodes": nodes})
    t0 = time.perf_counter()
    g = graph_from_json(text)
    t1 = time.perf_counter()
    validate_graph(g)
    t2 = time.perf_counter()
    print(f"\n100k-node chain graph ({len(text) / 2**20:.1f} MiB of JSON): parse {t1 - t0:.2f} s, "
          f"validate {t2 - t1:.2f} s, together {t2 - t0:.2f} s")


if __name__ == "__main__":
    main()
