"""Check bench/data/published_memory_runs.json: every row has the fields issue 50 asks for.

Standard library only (runs without parplan installed):

    python bench/data/check_published_memory.py [path]

Prints one line per problem and exits 1 if there is any, else prints a summary and exits 0.
"""

import collections
import json
import pathlib
import sys

REQUIRED = (
    "id", "source_group", "source", "framework", "framework_version", "gpu", "gpus", "gpus_per_node", "model",
    "seq_len", "micro_batch", "local_batch", "global_batch", "tp", "pp", "pp_schedule", "virtual_stages", "dp", "cp",
    "ep", "zero_fsdp", "activation_checkpointing", "precision", "fp8", "optimizer", "compile", "offload",
    "memory_gib", "counter", "memory_as_published", "outcome", "ambiguous",
)
SOURCE_REQUIRED = ("name", "citation", "url", "quote")
MODEL_REQUIRED = ("name", "layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "config_ref")
COUNTERS = {"max_allocated", "max_reserved", "device_total_used", "unknown"}
OUTCOMES = {"completed", "oom"}


def check(path):
    doc = json.loads(pathlib.Path(path).read_text())
    runs = doc["runs"]
    problems = []
    ids = set()
    for i, r in enumerate(runs):
        where = f"row {i} ({r.get('id')})"
        problems += [f"{where}: missing key {k!r}" for k in REQUIRED if k not in r]
        if r.get("id") in ids:
            problems.append(f"{where}: duplicate id")
        ids.add(r.get("id"))
        src = r.get("source") or {}
        problems += [f"{where}: source lacks {k!r}" for k in SOURCE_REQUIRED if not src.get(k)]
        model = r.get("model") or {}
        problems += [f"{where}: model lacks {k!r}" for k in MODEL_REQUIRED if k not in model]
        if r.get("counter") not in COUNTERS:
            problems.append(f"{where}: counter {r.get('counter')!r} not in {sorted(COUNTERS)}")
        if r.get("outcome") not in OUTCOMES:
            problems.append(f"{where}: outcome {r.get('outcome')!r} not in {sorted(OUTCOMES)}")
        if not isinstance(r.get("gpus"), int) or r["gpus"] < 8:
            problems.append(f"{where}: gpus {r.get('gpus')!r} is not an integer >= 8")
        if not isinstance(r.get("ambiguous"), list) or not all(isinstance(a, str) for a in r["ambiguous"]):
            problems.append(f"{where}: ambiguous is not a list of strings")
        mem = r.get("memory_gib")
        if mem is not None and not (isinstance(mem, (int, float)) and 0 < mem < 1024):
            problems.append(f"{where}: memory_gib {mem!r} out of range")
        if r.get("outcome") == "oom" and mem is not None:
            problems.append(f"{where}: an OOM row has memory_gib (use memory_at_oom_gib)")
        if mem is None and r.get("outcome") == "completed" and not r.get("ambiguous"):
            problems.append(f"{where}: completed without memory_gib and without a reason in ambiguous")
        if not r.get("memory_as_published"):
            problems.append(f"{where}: memory_as_published empty")
        for k in ("tp", "pp", "dp", "cp", "ep"):
            v = r.get(k)
            if v is not None and (not isinstance(v, int) or v < 1):
                problems.append(f"{where}: {k} {v!r} is not a positive integer")
        degrees_given = all(isinstance(r.get(k), int) for k in ("tp", "pp", "dp", "cp", "gpus"))
        if degrees_given and r["tp"] * r["pp"] * r["dp"] * r["cp"] != r["gpus"]:
            problems.append(f"{where}: tp*pp*dp*cp = {r['tp'] * r['pp'] * r['dp'] * r['cp']} != gpus {r['gpus']}")
    if doc.get("row_count") != len(runs):
        problems.append(f"row_count {doc.get('row_count')} != {len(runs)} rows")
    groups = collections.Counter(r.get("source_group") for r in runs)
    if len(runs) < 60:
        problems.append(f"only {len(runs)} rows (issue 50 asks for at least 60)")
    if len(groups) < 4:
        problems.append(f"only {len(groups)} source groups (issue 50 asks for at least 4)")
    return doc, runs, groups, problems


def main(argv):
    path = argv[1] if len(argv) > 1 else pathlib.Path(__file__).with_name("published_memory_runs.json")
    _doc, runs, groups, problems = check(path)
    for p in problems:
        print(p)
    if problems:
        return 1
    counters = collections.Counter(r["counter"] for r in runs)
    outcomes = collections.Counter(r["outcome"] for r in runs)
    print(f"{len(runs)} rows OK; per source group {dict(groups)}; counters {dict(counters)}; outcomes {dict(outcomes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
