"""`parplan memory` and `parplan models` per DESIGN.md's CLI contract, including bad input."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from parplan.cli import main
from parplan.solver.cost.plan_memory import plan_memory
from parplan.solver.frontends.builder import build_graph
from parplan.solver.frontends.presets import PRESETS, get_preset
from parplan.solver.strategy import ParallelConfig
from parplan.solver.wire import graph_to_json

DATA = Path(__file__).parent.parent / "data"
REFERENCE = json.loads((DATA / "megatron_memory_cases.json").read_text())


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main([*args, "--json"]) == 0
    out = capsys.readouterr().out
    doc: dict[str, Any] = json.loads(out)
    return doc


def run_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    with pytest.raises(SystemExit) as info:
        code = main(list(args))
        raise SystemExit(code)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_gpt_7_5b_memory_matches_megatron_and_korthikanti(capsys: pytest.CaptureFixture[str]) -> None:
    """GPT-7.5B on TP 4, PP 2 with SP: weights + optimizer are 6 + 12/dp bytes per parameter on the most
    loaded shard (Megatron-LM's estimate), activations are Korthikanti's for the first stage."""
    doc = run_json(capsys, "memory", "--model", "gpt-7.5b", "--gpus", "8", "--tp", "4", "--pp", "2",
                   "--sequence-parallel", "--recompute", "selective", "--zero", "1", "--micro-batch", "1",
                   "--global-batch", "64")
    case = REFERENCE["cases"][0]
    assert (case["model"], case["tp"], case["pp"]) == ("gpt-7.5b", 4, 2)
    b = doc["memory"]["breakdown"]
    assert set(b) == {"parameters", "gradients", "optimizer_states", "activations", "temporary"}
    weights = b["parameters"] + b["gradients"] + b["optimizer_states"]
    assert weights == pytest.approx(case["megatron_weight_and_optimizer_bytes"], rel=0.03)
    # Korthikanti, TP + SP + selective: sbh*34/t per layer, first stage holds p micro-batches of
    # L/p layers, plus the embedding's saved token ids and dropout mask (Megatron's terms), and the
    # ids both lookups save whole on every TP rank (the estimator divides the token ids by t and
    # leaves the position ids out).
    s, b_, h, L, t, p = 2048, 1, 4096, 36, 4, 2
    korthikanti = (s * b_ * h * 34 * L + 8 * s * b_ * p + s * b_ * h * p) / t + 8 * s * b_ * p * (2 - 1 / t)
    assert b["activations"] == pytest.approx(korthikanti, rel=1e-5)
    # the peak is a moment: at most every category at its own peak, at least states + activations
    assert weights + b["activations"] <= doc["memory"]["peak_bytes"] <= sum(b.values())
    assert doc["time"]["step_seconds"] > 0 and doc["time"]["tokens_per_second"] > 0
    assert doc["strategy"]["dp"] == 1 and doc["strategy"]["num_microbatches"] == 64


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: f"{c['model']}-tp{c['tp']}pp{c['pp']}dp{c['dp']}")
def test_contract_cases_on_the_most_loaded_device(capsys: pytest.CaptureFixture[str], case: dict[str, Any]) -> None:
    """What ../shared/checks/contract.py checks: the most loaded device against Megatron-LM."""
    args = ["memory", "--model", case["model"], "--gpus", str(case["gpus"]), "--tp", str(case["tp"]),
            "--pp", str(case["pp"]), "--zero", "1" if case["distributed_optimizer_zero1"] else "0",
            "--recompute", case["recompute"], "--micro-batch", str(case["micro_batch"]),
            "--global-batch", str(case["global_batch"]), "--seq-len", str(case["seq_len"]), "--schedule", "1f1b"]
    if case["sequence_parallel"]:
        args.append("--sequence-parallel")
    b = run_json(capsys, *args)["memory"]["breakdown"]
    tol = REFERENCE["suggested_tolerance"]
    w = b["parameters"] + b["gradients"] + b["optimizer_states"]
    assert w == pytest.approx(case["megatron_weight_and_optimizer_bytes"], rel=tol["weight_and_optimizer"])
    if not case["swiglu"]:
        assert b["activations"] == pytest.approx(case["megatron_activation_bytes"], rel=tol["activations_gpt"])


def test_table_output_shows_breakdown_in_gib(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "2", "--pp", "2"]) == 0
    out = capsys.readouterr().out
    for word in ("parameters", "gradients", "optimizer_states", "activations", "temporary", "GiB", "stage 1",
                 "tokens/s"):
        assert word in out


def test_zero3_peak_below_the_sum_of_categories_is_explained(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1", "--pp", "1", "--zero", "3"]
    doc = run_json(capsys, *args)
    total = sum(doc["memory"]["breakdown"].values())
    assert doc["memory"]["peak_bytes"] < total
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"they add up to {total / 2**30:.2f} GiB" in out
    # the note appears exactly when the peak is below the sum
    for extra in (["--pp", "4", "--global-batch", "4"], ["--recompute", "none"]):
        other = [*args[:-2], *extra]
        doc = run_json(capsys, *other)
        below = doc["memory"]["peak_bytes"] < sum(doc["memory"]["breakdown"].values()) - 8
        assert main(other) == 0
        assert ("add up to" in capsys.readouterr().out) == below


def test_models_lists_every_preset_with_parameter_counts(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "models")
    names = [m["name"] for m in doc["models"]]
    assert names == list(PRESETS)
    counts = {m["name"]: m["parameters"] for m in doc["models"]}
    assert counts["llama-2-7b"] == 6_738_415_616
    assert main(["models"]) == 0
    assert "gpt3-175b" in capsys.readouterr().out


def test_graph_json_file_as_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = get_preset("gpt-1.7b").with_(layers=4)
    path = tmp_path / "model.json"
    path.write_text(graph_to_json(build_graph(cfg, batch=1, seq_len=512)))
    doc = run_json(capsys, "memory", "--model", str(path), "--gpus", "4", "--tp", "2", "--pp", "1",
                   "--micro-batch", "2", "--seq-len", "256")
    # Resized to micro-batch 2 / seq 256 the file costs exactly what the builder's graph does.
    direct = plan_memory(build_graph(cfg, batch=2, seq_len=256), ParallelConfig(tp=2, dp=2))
    assert doc["memory"]["breakdown"]["activations"] == round(direct.peak_stage.memory.bytes.activations)
    assert doc["model"]["parameters"] == build_graph(cfg, batch=1, seq_len=8).parameter_count()


def test_hf_config_as_model(capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, "memory", "--model", str(DATA / "hf" / "llama.json"), "--gpus", "8", "--tp", "2",
                   "--pp", "1", "--seq-len", "1024")
    assert doc["model"]["parameters"] == 6_738_415_616


@pytest.mark.parametrize(("args", "needle"), [
    (["memory", "--model", "gpt-9000b", "--gpus", "8", "--tp", "1", "--pp", "1"], "unknown model"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "3", "--pp", "1"], "does not divide"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "16", "--pp", "1"], "does not divide"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1", "--pp", "1", "--global-batch", "12"],
     "not a multiple"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1", "--pp", "1", "--sequence-parallel"], "tp > 1"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "0", "--tp", "1", "--pp", "1"], "positive integer"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1", "--pp", "1", "--recompute", "some"],
     "expected none, selective, full, op or selective:MODULE+MODULE, got 'some'"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1", "--pp", "1", "--gpu", "Z80"], "unknown GPU"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "12", "--gpus-per-node", "8", "--tp", "1", "--pp", "1"],
     "multiple of gpus_per_node"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "64", "--tp", "1", "--pp", "32"], "24 blocks"),
    (["memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "8", "--pp", "1", "--seq-len", "4096"],
     "learned positions"),
    (["memory", "--model", "/nonexistent/model.json", "--gpus", "8", "--tp", "1", "--pp", "1"], "no such file"),
    (["memory", "--gpus", "8", "--tp", "1", "--pp", "1"], "--model"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_exits_2_with_a_message(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    assert needle in run_error(capsys, *args)


def test_tp_and_pp_default_to_1(capsys: pytest.CaptureFixture[str]) -> None:
    """Left out, ``--tp`` and ``--pp`` are 1: the same document as with them given, all 8 GPUs data parallel."""
    given = run_json(capsys, "memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1", "--pp", "1")
    left_out = run_json(capsys, "memory", "--model", "gpt-1.7b", "--gpus", "8")
    assert left_out == given
    assert (left_out["strategy"]["tp"], left_out["strategy"]["pp"], left_out["strategy"]["dp"]) == (1, 1, 8)
    only_pp = run_json(capsys, "memory", "--model", "gpt-1.7b", "--gpus", "8", "--pp", "2")
    assert (only_pp["strategy"]["tp"], only_pp["strategy"]["pp"], only_pp["strategy"]["dp"]) == (1, 2, 4)
    with pytest.raises(SystemExit):
        main(["memory", "--help"])
    usage = " ".join(capsys.readouterr().out.split())
    assert "tensor-parallel degree (default 1)" in usage and "pipeline-parallel degree (default 1)" in usage


@pytest.mark.parametrize(("extra", "needle"), [
    (["--mesh", "3x3"], "mesh: 3x3 = 9 devices does not factor the cluster's 8"),
    (["--time-limit", "7200"], "time_limit: must be at most 3600"),
    (["--target", "megatron", "--search", "ilp"], "search: target megatron runs one strategy"),
    (["--gpu", "Z80"], "cluster.gpu: unknown GPU 'Z80'"),
])
def test_plan_request_errors_are_one_line_naming_the_field(capsys: pytest.CaptureFixture[str], extra: list[str],
                                                          needle: str) -> None:
    """``parplan plan`` builds the request model POST /v1/plans reads: its checks, one line, exit 2."""
    err = run_error(capsys, "plan", "--model", "gpt-1.7b", "--gpus", "8", *extra)
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_bad_graph_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "g.json"
    path.write_text(json.dumps({"nodes": [{"id": "a", "kind": "einsum", "inputs": ["b"], "dims": {"x": 2}}]}))
    err = run_error(capsys, "memory", "--model", str(path), "--gpus", "1", "--tp", "1", "--pp", "1")
    assert "'a'" in err and "inputs[0]" in err
    path.write_text("{not json")
    assert "not readable JSON" in run_error(capsys, "memory", "--model", str(path), "--gpus", "1", "--tp", "1",
                                            "--pp", "1")


PARPLAN = shutil.which("parplan", path=str(Path(sys.executable).parent)) or shutil.which("parplan")


@pytest.mark.skipif(PARPLAN is None, reason="console script not installed")
def test_console_script_prints_one_json_document() -> None:
    assert PARPLAN is not None
    r = subprocess.run([PARPLAN, "memory", "--model", "bert-large", "--gpus", "2", "--tp", "2", "--pp", "1",
                        "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["memory"]["peak_bytes"] > 0
    bad = subprocess.run([PARPLAN, "memory", "--model", "nope", "--gpus", "2", "--tp", "1", "--pp", "1"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and bad.stdout == ""


def test_runtime_flag_counts_pytorch_buffers(capsys: pytest.CaptureFixture[str]) -> None:
    """``--runtime torch``: sequence parallelism keeps the gathered QKV and MLP inputs, two 2sbh
    tensors per layer in bf16, (1 - 1/t) more of each per device; JSON says which runtime."""
    args = ("memory", "--model", "gpt-1.7b", "--gpus", "4", "--tp", "2", "--pp", "1", "--sequence-parallel",
            "--micro-batch", "2", "--json")
    megatron = run_json(capsys, *args)
    torch_doc = run_json(capsys, *args, "--runtime", "torch")
    assert megatron["strategy"]["runtime"] == "megatron" and torch_doc["strategy"]["runtime"] == "torch"
    cfg = get_preset("gpt-1.7b")
    s, b, h = cfg.seq_len, 2, cfg.hidden
    extra = (2 * cfg.layers + 1) * 2 * s * b * h * (1 - 1 / 2)  # every norm output, the head's included
    got = torch_doc["memory"]["breakdown"]["activations"] - megatron["memory"]["breakdown"]["activations"]
    assert got == pytest.approx(extra, rel=1e-9)


def test_sync_every_microbatch_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``--sync-every-microbatch`` with FSDP2 (ZeRO-3, torch runtime, 4 micro-batches per device):
    no unsharded fp32 gradients are held between micro-batches, so the temporaries drop by nearly
    the whole model's unsharded-minus-sharded gradients (4 B x P x (1 - 1/dp); the unit being
    reduced at the moment of the peak still holds its own), and the step takes longer (the
    gradients are reduce-scattered four times)."""
    args = ("memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1", "--pp", "1", "--zero", "3",
            "--micro-batch", "1", "--global-batch", "32", "--runtime", "torch", "--json")
    once = run_json(capsys, *args)
    every = run_json(capsys, *args, "--sync-every-microbatch")
    assert not once["strategy"]["sync_every_microbatch"] and every["strategy"]["sync_every_microbatch"]
    params = once["model"]["parameters"]
    drop = once["memory"]["breakdown"]["temporary"] - every["memory"]["breakdown"]["temporary"]
    # the peaks are at different moments: without syncing, a later micro-batch's loss backward with
    # every unsharded gradient; the temporaries there may also hold the loss's logits-sized buffers
    # (12 bytes a logit above the saved log-probabilities' 4, tests/solver/test_loss_gradient.py)
    logits = once["model"]["architecture"]["vocab"] * once["model"]["seq_len"]  # micro-batch 1
    assert 0.95 * 4 * params * (1 - 1 / 8) < drop <= 4 * params * (1 - 1 / 8) + 12 * logits
    for cat in ("parameters", "gradients", "optimizer_states", "activations"):
        assert once["memory"]["breakdown"][cat] == every["memory"]["breakdown"][cat]
    assert every["time"]["step_seconds"] > once["time"]["step_seconds"]


@pytest.mark.skipif(PARPLAN is None, reason="console script not installed")
def test_ilp_plan_json_is_not_corrupted_by_the_solver_banner() -> None:
    """HiGHS logs a banner from C++ unless its output is off before any other call on the instance;
    ``--json`` must stay one document, and neither stream carries the banner."""
    assert PARPLAN is not None
    r = subprocess.run([PARPLAN, "plan", "--model", "bert-large", "--gpus", "2", "--gpu", "A100-80GB",
                        "--global-batch", "4", "--search", "ilp", "--objective", "min-memory", "--json"],
                       capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["strategy"]["kind"] == "intra-operator"
    assert "HiGHS" not in r.stderr, r.stderr


def test_plan_and_memory_print_the_time_models_error_on_runs_of_their_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """Under the step time: the published runs of the plan's runtime on its GPU generation (from
    ``time.accuracy.similar_runs``), or that there are none."""
    stored = json.loads((Path(__file__).parents[2] / "parplan" / "solver" / "time_accuracy.json").read_text())
    ampere = next(k for k in stored["by_kind"] if (k["generation"], k["runtime"]) == ("Ampere", "megatron"))
    assert main(["plan", "--model", "gpt-1.7b", "--gpus", "8", "--gpu", "A100-80GB", "--global-batch", "16",
                 "--target", "megatron"]) == 0
    out = capsys.readouterr().out
    assert (f"on {ampere['rows']} published runs of runtime megatron on Ampere: predicted / published "
            f"{ampere['geometric_mean_ratio']:.2f}") in out
    assert main(["plan", "--model", "gpt-1.7b", "--gpus", "8", "--gpu", "L4", "--global-batch", "16",
                 "--target", "deepspeed"]) == 0
    assert "no published run of this runtime on this GPU generation" in capsys.readouterr().out
    assert main(["memory", "--model", "gpt-1.7b", "--gpus", "8", "--gpu", "L4", "--tp", "1", "--pp", "1",
                 "--zero", "3"]) == 0
    assert "none of runtime megatron on L4 GPUs" in " ".join(capsys.readouterr().out.split())
