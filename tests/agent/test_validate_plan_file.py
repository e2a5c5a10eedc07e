"""``parplan validate --plan FILE``: the file target ``parplan`` exports (the plan itself) is what the
agent runs and measures, per-operator and uniform plans alike."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from parplan.cli import main
from parplan.exports import export_plan
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request

GPT = {"model_type": "gpt2", "n_layer": 2, "n_embd": 128, "n_head": 4, "vocab_size": 512, "n_positions": 128}
#: A tiny Llama (grouped-query attention, untied head) whose per-operator plan converts the loss's
#: gradient back to the head's layout in backward (an all-gather along the sequence and its
#: concatenation), the step's peak.
LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128,
         "intermediate_size": 352, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "vocab_size": 512, "max_position_embeddings": 256, "rms_norm_eps": 1e-05, "tie_word_embeddings": False}


def exported(tmp_path: Path, baseline: str | None = None, hf_config: dict[str, Any] = GPT, gpu: str = "A100-80GB",
             **extra: Any) -> Path:
    """The plan of the tiny GPT (or ``hf_config``) on 4 ``gpu``s, exported as target ``parplan``: the
    planner's answer, or with ``baseline`` that baseline's (uniform) strategy."""
    body = {"model": {"hf_config": hf_config}, "cluster": {"gpus": 4, "gpu": gpu},
            "training": {"global_batch": 8, "seq_len": 128}, **extra}
    doc = solve(parse_plan_request(body))
    if baseline is not None:
        doc = {**doc, "strategy": {"kind": "uniform", **doc["baselines"][baseline]["strategy"]}}
    out = export_plan(doc, "parplan")
    path = tmp_path / "parplan_plan.json"
    path.write_text(out.files["parplan_plan.json"])
    return path


@pytest.mark.slow
# uniform: the plain data-parallel baseline's strategy (the megatron target's own answer for this tiny model
# is now tp 2 with ZeRO-1, which PyTorch cannot run, and its Megatron-LM baseline a pipeline of one
# micro-batch, which 1F1B cannot: the agent refuses both in one line). per-operator: the ILP's plan on H100s
# (on A100s its plan splits fc1's contraction, whose known over-prediction the test below bounds)
@pytest.mark.parametrize("extra", [{"target": "parplan", "search": "ilp", "gpu": "H100-80GB"},
                                   {"target": "megatron", "baseline": "dp"}], ids=["per-operator", "uniform"])
def test_the_exported_plan_file_runs_under_the_agent_within_5_percent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: dict[str, Any]) -> None:
    path = exported(tmp_path, **extra)
    uniform = "baseline" in extra  # its run with --diagnose (the per-operator one's: the known gap's test)
    assert main(["validate", "--plan", str(path), "--device", "cpu", "--json"] + ["--diagnose"] * uniform) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["correct"] is True and len(m["ranks"]) == 4
    assert m["max_relative_error"] <= 0.05, [r["relative_error"] for r in m["ranks"]]
    for r in m["ranks"] if uniform else []:  # --diagnose: what each rank held at its peak
        held = r["measured"]["contents"]["total"]["by_kind"]
        assert held and sum(b for b, _, _ in held) <= r["measured"]["peak_bytes"]


@pytest.mark.slow
def test_a_plan_splitting_fc1s_contraction_is_over_predicted_not_under(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A known gap, bounded. On A100s the ILP's plan of the tiny GPT splits fc1's contraction (its input
    over ``hidden``), so DTensor converts ln2's output for it and autograd keeps only the converted
    copy; the interpreter's memory model charges both, ln2's output included (2 x 256 KiB): every
    rank's peak is about 8% below the prediction (activations 15% below). Taking the producer's copy
    back when its one saver converts it would put this plan 1.1% and the ILP's tiny Llama plan 2.3%
    under their measurements (docs/notes/ilp-plans-dtensor.md), so the safe side is kept.

    This checks the prediction stays on the safe side and within 10%, and, from ``--diagnose``, the
    mechanism: at the activations' peak the layer norms' live outputs are ln1's (replicated, 512 KiB
    a layer) and the final norm's (128 KiB), not ln2's (256 KiB a layer, split over the batch), which
    DTensor's conversion copied (``Shard._replicate_to_shard`` clones whatever dim it splits, torch
    2.13) and which nothing else saves."""
    path = exported(tmp_path, target="parplan", search="ilp")
    ops = {k: v["strategy"] for u in json.loads(path.read_text())["strategy"]["units"] for k, v in u["ops"].items()}
    assert "hidden:" in ops["layers.0.mlp.fc1.mm"], ops["layers.0.mlp.fc1.mm"]  # the plan described
    assert main(["validate", "--plan", str(path), "--device", "cpu", "--json", "--diagnose"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["correct"] is True and len(m["ranks"]) == 4
    errors = [r["relative_error"]["peak_bytes"] for r in m["ranks"]]
    assert all(-0.10 <= e <= 0.0 for e in errors), errors
    kib = 1024
    for r in m["ranks"]:
        live = r["measured"]["contents"]["activations"]["by_kind"]
        norms = sum(b for b, _, kind in live if kind.startswith("aten.native_layer_norm"))
        # ln1 x 2 + the final norm: 1,152 KiB plus their means and rstds (a few KiB); with ln2's, 512 KiB more
        assert 2 * 512 * kib + 128 * kib <= norms < 2 * 512 * kib + 128 * kib + 64 * kib, norms


@pytest.mark.slow
def test_a_llama_plan_converting_gradients_in_backward_is_not_under_predicted(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The ILP counts the buffers converting gradients back in backward (``ilp.terms.Terms.gradient_conversions``):
    without them this plan measures 1.2% above its prediction on every rank, the temporaries at the peak
    2.5 MiB (the loss's gradient, an all-gather's buffer, its concatenation) against 1.5 counted."""
    path = exported(tmp_path, hf_config=LLAMA, target="parplan", search="ilp")
    assert main(["validate", "--plan", str(path), "--device", "cpu", "--json"]) == 0
    m = json.loads(capsys.readouterr().out)
    assert m["correct"] is True and len(m["ranks"]) == 4
    errors = [r["relative_error"]["peak_bytes"] for r in m["ranks"]]
    assert all(-0.05 <= e <= 0.0 for e in errors), errors


def test_bad_plan_files_are_one_line_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def error(*args: str) -> str:
        assert main(list(args)) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        return err

    (tmp_path / "x.json").write_text("{}")
    assert "not a plan document" in error("validate", "--plan", str(tmp_path / "x.json"))
    assert "cannot read" in error("validate", "--plan", str(tmp_path / "missing.json"))
    (tmp_path / "y.json").write_text(json.dumps({"strategy": {"kind": "uniform"}, "model": {"name": "g"}}))
    assert "architecture" in error("validate", "--plan", str(tmp_path / "y.json"))
    assert "leave out --tp" in error("validate", "--plan", str(tmp_path / "y.json"), "--tp", "2")
    assert "required" in error("validate", "--model", "gpt-1.7b")
    assert "context parallelism (ring attention) is not executed by the agent" in error(
        "validate", "--model", "gpt-1.7b", "--gpus", "4", "--tp", "1", "--pp", "1", "--cp", "2", "--device", "cpu")


def test_diagnose_prints_what_the_most_loaded_rank_held_at_each_peak(capsys: pytest.CaptureFixture[str]) -> None:
    from parplan.agent.commands import _print_contents

    mib = 2**20
    ranks = [{"rank": 0, "measured": {"peak_bytes": 3 * mib, "contents": {
                 "activations": {"largest": [[2 * mib, "aten.gelu.default [fw ]"]], "by_kind": []}}}},
             {"rank": 1, "measured": {"peak_bytes": 4 * mib, "contents": {
                 "activations": {"largest": [[3 * mib, "aten.add.Tensor [fw ]"]], "by_kind": []}}}}]
    _print_contents(ranks)
    out = capsys.readouterr().out.splitlines()
    assert out == ["rank 1 at its activations peak:", "      3.000 MiB  aten.add.Tensor [fw ]"]
