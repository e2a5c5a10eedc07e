"""The predicted memory of every configuration of the agent's matrix (bench/model_accuracy.py's
every run, both attention kernels), as JSON: to show that a change left every memory prediction as
it was, without running the matrix (the measurements do not depend on the cost model).

Run: python bench/matrix_predictions.py OUT.json [--compare OTHER.json]
With --compare, prints how many predictions differ from OTHER.json's (exit status 1 if any).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from parplan.agent.matrix import all_specs
from parplan.agent.validate import predict


def predictions() -> dict[str, Any]:
    """Label|flash-attention -> the ``memory`` document of the prediction (bytes, per stage)."""
    return {f"{spec.label}|{flash}": predict(spec, flash)["memory"]
            for spec in all_specs(full=True) for flash in (True, False)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--compare", default=None)
    args = ap.parse_args(argv)
    mine = predictions()
    with open(args.out, "w") as f:
        json.dump(mine, f, sort_keys=True)
    print(f"{len(mine)} predictions written to {args.out}")
    if args.compare:
        with open(args.compare) as f:
            other = json.load(f)
        differ = sorted(k for k in set(mine) | set(other) if mine.get(k) != other.get(k))
        print(f"{len(differ)} of {len(mine)} differ from {args.compare}")
        for k in differ[:20]:
            print(f"- {k}")
        return 1 if differ else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
