"""scripts/demo (the README's first command) runs end to end; a small model keeps it quick."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_script_plans_and_cleans_up(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARPLAN_")}
    env.update(DEMO_MODEL="bert-large", DEMO_GPUS="2", TMPDIR=str(tmp_path))
    out = subprocess.run([str(ROOT / "scripts" / "demo")], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    for needle in ("POST /v1/plans", "job succeeded", "strategy", "peak memory", "step time", "baseline",
                   "megatron", "served from the plan cache"):
        assert needle in text, (needle, text)
    assert "authentication" not in text  # the server's log stays out of the demo's output
    assert list(tmp_path.iterdir()) == []  # its temporary data directory is gone
