"""``parplan memory``'s step time line names the share beyond the micro-batches for what it is:
no bubble without a pipeline (there it is the optimizer step and the data-parallel traffic not hidden)."""

from __future__ import annotations

import json
import re

import pytest

from parplan.cli import main


def _memory(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[str, dict[str, object]]:
    args = ["memory", "--model", "gpt-1.7b", "--gpus", "8", "--global-batch", "16", "--seq-len", "512", *flags]
    assert main(args) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("step time"))
    assert main([*args, "--json"]) == 0
    return line, json.loads(capsys.readouterr().out)["time"]


def test_without_a_pipeline_there_is_no_bubble(capsys: pytest.CaptureFixture[str]) -> None:
    line, t = _memory(capsys, "--tp", "2", "--pp", "1")
    assert "bubble" not in line and f"optimizer + exposed DP {t['bubble_fraction']:.1%}" in line


def test_with_a_pipeline_the_bubble_and_the_once_per_step_work_are_apart(capsys: pytest.CaptureFixture[str]) -> None:
    line, t = _memory(capsys, "--tp", "2", "--pp", "2")
    m = re.search(r"bubble (\d+\.\d)%, optimizer \+ exposed DP (\d+\.\d)%", line)
    assert m is not None, line
    bubble, once = float(m[1]), float(m[2])
    # 1F1B over 2 even stages and 8 micro-batches: the fill and drain is one stage's micro-batch of the
    # 8 x 1 + 1 the step holds beside the once-per-step work, about 1/9 of what is left of the step
    assert bubble > 0 and once > 0 and bubble + once == pytest.approx(100 * t["bubble_fraction"], abs=0.11)
    assert bubble == pytest.approx((100 - once) / 9, rel=0.15)
