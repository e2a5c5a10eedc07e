"""ILP plans executed with DTensor (issue 6): measured vs the ILP's own prediction, per category.

For the small GPT and Llama of the agent's matrix (fp32, one micro-step of 4 samples, sequence
128), the ILP's plan on several meshes and objectives is run operator by operator on 2 or 4 gloo processes
(:mod:`parplan.agent.ilp_exec`), checked against a single-process run, and measured with
MemTracker.
Run: python bench/ilp_plan_accuracy.py
"""

from __future__ import annotations

from _common import header

from parplan.agent.ilp_validate import CATEGORIES, ilp_plan, run_and_compare_plan
from parplan.agent.matrix import GPT_TINY, LLAMA_TINY

CASES = [(GPT_TINY, (2,), "max-throughput"), (GPT_TINY, (2,), "min-memory"), (GPT_TINY, (4,), "max-throughput"),
         (GPT_TINY, (4,), "min-memory"), (GPT_TINY, (2, 2), "max-throughput"), (GPT_TINY, (2, 2), "min-memory"),
         (LLAMA_TINY, (4,), "max-throughput"), (LLAMA_TINY, (4,), "min-memory"),
         (LLAMA_TINY, (2, 2), "max-throughput"), (LLAMA_TINY, (2, 2), "min-memory")]
SHORT = {"parameters": "params", "gradients": "grads", "optimizer_states": "optim", "activations": "activ",
         "temporary": "temp"}


def main() -> None:
    print(header("ILP plans executed with DTensor"))
    print("| model | mesh | objective | plan | correct | " + " | ".join(f"{SHORT[c]} MiB meas/pred" for c in CATEGORIES)
          + " | peak MiB meas/pred | error |")
    print("|---|---|---|---|---|" + "---:|" * (len(CATEGORIES) + 2))
    for cfg, mesh, objective in CASES:
        plan = ilp_plan(cfg, mesh, batch=4, seq_len=128, objective=objective)
        r = run_and_compare_plan(cfg, plan, 4, 128)
        rank = max(r["ranks"], key=lambda x: x["measured"]["peak_bytes"])
        meas, pred = rank["measured"]["breakdown"], rank["predicted"]["breakdown"]
        cells = " | ".join(f"{meas[c] / 2**20:.2f} / {pred[c] / 2**20:.2f}" for c in CATEGORIES)
        peak = f"{rank['measured']['peak_bytes'] / 2**20:.2f} / {rank['predicted']['peak_bytes'] / 2**20:.2f}"
        ok = "yes" if r["correct"] else "NO"
        print(f"| {cfg.name} | {'x'.join(map(str, mesh))} | {objective} | {r['plan']} | {ok} | "
              f"{cells} | {peak} | {r['most_loaded']['relative_error']:+.1%} |")


if __name__ == "__main__":
    main()
