"""``parplan memory --from KIND FILE [--suggest]``: a trainer's own configuration, priced; bad input
is one line on stderr and exit status 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parplan.cli import main

ARGS = """\
--num-layers 32 --hidden-size 4096 --ffn-hidden-size 11008 --num-attention-heads 32
--seq-length 4096 --max-position-embeddings 4096 --vocab-size 32000
--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
--untie-embeddings-and-output-weights
--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --sequence-parallel
--use-distributed-optimizer --recompute-granularity selective
--micro-batch-size 1 --global-batch-size 32 --bf16 --hidden-dropout 0.0 --attention-dropout 0.0
--lr 3e-4 --data-path /data/x --my-own-flag 7
"""


def run_error(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(list(args)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_megatron_arguments_are_priced_and_what_was_not_used_is_listed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "args.txt").write_text(ARGS)
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["strategy"]["summary"].startswith("tp2 pp2 dp4 zero1 sp recompute=selective mb1x8")
    assert doc["model"]["parameters"] == 6_738_415_616  # llama-2-7b's count, rebuilt from the flags
    assert doc["import"]["unknown"] == ["--my-own-flag 7"] and doc["import"]["ignored"] == ["--lr", "--data-path"]
    # the same configuration through `parplan memory`'s own flags prices the same
    # (without --overlap-grad-reduce Megatron-LM reduces the gradients after the backward)
    assert main(["memory", "--model", "llama-2-7b", "--gpus", "16", "--tp", "2", "--pp", "2", "--zero", "1",
                 "--sequence-parallel", "--global-batch", "32", "--seq-len", "4096", "--no-overlap-grad-reduce",
                 "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["memory"]["peak_bytes"] == doc["memory"]["peak_bytes"]
    assert same["time"]["step_seconds"] == doc["time"]["step_seconds"]
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16"]) == 0
    assert "unknown in" in capsys.readouterr().out


def test_megatron_lms_default_dropout_is_priced_when_the_arguments_leave_it_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-LM trains with dropout 0.1 unless told otherwise, a Llama too: its masks (one byte an
    element, after the attention and after the MLP) are held for the backward, so leaving the flags
    out prices more memory, never less."""
    peaks = []
    for text in (ARGS, ARGS.replace("--hidden-dropout 0.0 --attention-dropout 0.0", ""),
                 ARGS.replace("--hidden-dropout 0.0", "--hidden-dropout 0.05")):
        (tmp_path / "args.txt").write_text(text)
        assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        peaks.append((doc["model"]["architecture"]["dropout"], doc["memory"]["peak_bytes"]))
    (none, zero), (default, with_default), (larger, with_larger) = peaks
    assert none is None and default == 0.1 and larger == 0.05
    # a stage of 16 layers, 4,096 tokens split over TP 2 by sequence parallelism, 4,096 wide: at
    # least its two masks a layer of the first micro-batch in flight
    assert with_default - zero >= 16 * 2 * 4096 // 2 * 4096
    assert with_larger == with_default


def test_context_parallel_size_is_priced_as_memory_cp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "args.txt").write_text(ARGS + "--context-parallel-size 2\n--cp-comm-type p2p\n")
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["strategy"]["cp"] == 2 and doc["strategy"]["dp"] == 2
    assert main(["memory", "--model", "llama-2-7b", "--gpus", "16", "--tp", "2", "--pp", "2", "--cp", "2", "--zero",
                 "1", "--sequence-parallel", "--global-batch", "32", "--seq-len", "4096", "--no-overlap-grad-reduce",
                 "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["memory"]["peak_bytes"] == doc["memory"]["peak_bytes"]
    assert same["time"]["step_seconds"] == doc["time"]["step_seconds"]


def test_overlap_flags_are_priced_as_memory_flags_and_change_time_only(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plain.txt").write_text(ARGS)
    (tmp_path / "args.txt").write_text(ARGS + "--tp-comm-overlap --overlap-param-gather --overlap-grad-reduce\n")
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "plain.txt"), "--gpus", "16", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["strategy"]["tp_comm_overlap"] and doc["strategy"]["overlap_param_gather"]
    assert doc["memory"] == plain["memory"]
    assert doc["time"]["step_seconds"] < plain["time"]["step_seconds"]
    assert main(["memory", "--model", "llama-2-7b", "--gpus", "16", "--tp", "2", "--pp", "2", "--zero", "1",
                 "--sequence-parallel", "--global-batch", "32", "--seq-len", "4096", "--tp-comm-overlap",
                 "--overlap-param-gather", "--json"]) == 0
    same = json.loads(capsys.readouterr().out)
    assert same["time"]["step_seconds"] == doc["time"]["step_seconds"]
    (tmp_path / "bad.txt").write_text(ARGS.replace("--use-distributed-optimizer", "") + "--overlap-param-gather\n")
    assert "distributed optimizer" in run_error(capsys, "memory", "--from", "megatron-args", str(tmp_path / "bad.txt"),
                                                "--gpus", "16")


def test_without_overlap_grad_reduce_the_gradient_reduction_is_not_hidden(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-LM reduces gradients under the backward, bucket by bucket, only with
    --overlap-grad-reduce; without it, after the backward: every second of it is exposed."""
    (tmp_path / "after.txt").write_text(ARGS)
    (tmp_path / "under.txt").write_text(ARGS + "--overlap-grad-reduce\n")
    docs = []
    for name in ("after.txt", "under.txt"):
        assert main(["memory", "--from", "megatron-args", str(tmp_path / name), "--gpus", "16", "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    after, under = docs
    assert after["strategy"]["overlap_grad_reduce"] is False and under["strategy"]["overlap_grad_reduce"] is True
    assert "no-overlap-grad-reduce" in after["strategy"]["summary"]
    assert "--overlap-grad-reduce" not in under["import"]["ignored"] + under["import"]["unknown"]
    assert after["memory"] == under["memory"]
    for a, u in zip(after["time"]["stages"], under["time"]["stages"], strict=True):
        assert a["dp_comm_seconds"] == u["dp_comm_seconds"] > 0
        assert a["dp_exposed_seconds"] == pytest.approx(a["dp_comm_seconds"], rel=1e-12)
        assert u["dp_exposed_seconds"] < u["dp_comm_seconds"]
    assert after["time"]["step_seconds"] > under["time"]["step_seconds"]
    # Megatron-LM refuses --overlap-param-gather without it; so does parplan
    (tmp_path / "bad.txt").write_text(ARGS + "--overlap-param-gather\n")
    assert "overlap_grad_reduce" in run_error(capsys, "memory", "--from", "megatron-args", str(tmp_path / "bad.txt"),
                                              "--gpus", "16")
    assert "Megatron-LM setting" in run_error(capsys, "memory", "--model", "llama-2-7b", "--gpus", "16", "--tp", "1",
                                              "--pp", "1", "--zero", "3", "--runtime", "torch",
                                              "--no-overlap-grad-reduce")


def test_suggest_shows_the_best_plan_for_the_same_trainer(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "args.txt").write_text(ARGS)
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16", "--suggest",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    sug = doc["suggestion"]
    assert sug["target"]["name"] == "megatron"
    # the configuration itself is one the megatron target considers, so the suggestion is no worse
    assert sug["time"]["step_seconds"] <= doc["time"]["step_seconds"] * 1.1 * (1 + 1e-9) or \
        sug["memory"]["peak_bytes"] <= doc["memory"]["peak_bytes"]


@pytest.mark.parametrize(("change", "why"), [
    ("--tensor-model-parallel-size 3", "does not divide"),
    ("--global-batch-size 30", "not a multiple"),
    ("--num-layers-per-virtual-pipeline-stage 5", "layers are not"),
    ("--context-parallel-size 2\n--cp-comm-type a2a+p2p", "--cp-comm-type a2a+p2p"),
    ("--context-parallel-size 3", "tp x pp x cp = 12 does not divide"),
    ("--recompute-granularity full", "recompute-method uniform"),
    ("--recompute-modules core_attn attn", "--recompute-modules: unknown recompute module(s) attn"),
    ("--recompute-modules=layernorm,moe_act", "--recompute-modules moe_act without --moe-grouped-gemm"),
    ("--recompute-modules mla_up_proj", "mla_up_proj (multi-head latent attention's up-projections) is not"),
    ("--recompute-modules layernorm\n--transformer-impl local", "layernorm with --transformer-impl local"),
    ("--recompute-modules layernorm\n--fp8-format hybrid", "Delayed scaling does not support"),
    ("--no-bias-swiglu-fusion", "--no-bias-swiglu-fusion (the unfused SwiGLU"),
    ("--defer-embedding-wgrad-compute --wgrad-deferral-limit 2", "--defer-embedding-wgrad-compute (the output layer's"),
    ("--microbatch-group-size-per-virtual-pipeline-stage 5", "--microbatch-group-size-per-virtual-pipeline-stage 5 "
     "(other than the pipeline size 2"),
    ("--normalization L2Norm", "--normalization L2Norm: parplan builds LayerNorm and RMSNorm"),
    ("--position-embedding-type yarn", "--position-embedding-type yarn: parplan builds learned_absolute, rope and"),
    ("--position-embedding-type none --no-position-embedding", "--no-position-embedding without --position-embedding-"
     "type rope: Megatron-LM refuses it"),
])
def test_inconsistent_or_unmodelled_arguments_are_one_line_errors(tmp_path: Path, change: str, why: str,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "args.txt").write_text(ARGS + change + "\n")
    assert why in run_error(capsys, "memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16")


def test_a_microbatch_group_of_the_pipeline_size_is_megatron_lms_default(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """schedules.py: the group defaults to the pipeline size, so giving it changes nothing priced."""
    peaks = []
    for extra in ("", "--microbatch-group-size-per-virtual-pipeline-stage 2\n"):
        (tmp_path / "args.txt").write_text(ARGS + extra)
        assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16", "--json"]) == 0
        peaks.append(json.loads(capsys.readouterr().out)["memory"]["peak_bytes"])
    assert peaks[0] == peaks[1]


def test_recompute_modules_core_attn_is_selective_recomputation(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-LM's default module list (core_attn) is its selective recomputation, priced as such."""
    prices = []
    for extra in ("", "--recompute-modules core_attn\n"):
        (tmp_path / "args.txt").write_text(ARGS + extra)
        assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert doc["strategy"]["recompute"] == "selective"
        prices.append(doc["memory"]["peak_bytes"])
    assert prices[0] == prices[1]


def test_bad_from_usage_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 2}}))
    assert "give --model" in run_error(capsys, "memory", "--from", "ds-config", str(tmp_path / "ds.json"),
                                       "--gpus", "8")
    assert "unknown kind" in run_error(capsys, "memory", "--from", "nemo", str(tmp_path / "ds.json"))
    assert "cannot read" in run_error(capsys, "memory", "--from", "ds-config", str(tmp_path / "nope.json"))
    assert "leave out --tp" in run_error(capsys, "memory", "--from", "ds-config", str(tmp_path / "ds.json"),
                                         "--tp", "2")
    assert "required: --gpus (or --from KIND FILE)" in run_error(capsys, "memory", "--model", "gpt-1.7b")
    assert "--suggest needs --from" in run_error(capsys, "memory", "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1",
                                                 "--pp", "1", "--suggest")


@pytest.mark.parametrize("extra", [[], ["--no-overlap-grad-reduce"]])
def test_a_priced_configuration_exports_and_imports_back_to_the_same_prices(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    """`parplan memory --json` carries the model's sizes, so `parplan export` writes what was
    priced; Megatron-LM's arguments read back price the same memory and time."""
    assert main(["memory", "--model", "llama-2-7b", "--gpus", "16", "--tp", "2", "--pp", "2", "--zero", "1",
                 "--sequence-parallel", "--global-batch", "32", "--seq-len", "4096", "--json", *extra]) == 0
    (tmp_path / "priced.json").write_text(capsys.readouterr().out)
    priced = json.loads((tmp_path / "priced.json").read_text())
    assert priced["model"]["architecture"]["layers"] == 32
    assert main(["export", str(tmp_path / "priced.json"), "--target", "megatron", "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "out" / "megatron_args.txt"), "--gpus", "16",
                 "--json"]) == 0
    back = json.loads(capsys.readouterr().out)
    assert back["strategy"]["overlap_grad_reduce"] == priced["strategy"]["overlap_grad_reduce"] == (not extra)
    assert back["memory"]["peak_bytes"] == priced["memory"]["peak_bytes"]
    assert back["time"]["step_seconds"] == pytest.approx(priced["time"]["step_seconds"], rel=1e-12)


@pytest.mark.parametrize("flags", ["--attention-backend unfused", "--transformer-impl local",
                                   "--transformer-impl local --attention-backend local"])
def test_an_unfused_attention_core_keeps_its_scores_for_backward(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: str) -> None:
    """Megatron-LM's local layers run its own DotProductAttention, and --attention-backend unfused leaves
    Transformer Engine only its UnfusedDotProductAttention: both keep the softmax of the scores for the
    backward (2 bytes a score in bf16 without attention dropout: Korthikanti et al. 2022, Sec. 4), where
    the flash kernel of the default backend keeps none."""
    base = ARGS.replace("--recompute-granularity selective", "")
    docs = []
    for text in (base, base + "--attention-backend flash\n", base + flags + "\n"):
        (tmp_path / "args.txt").write_text(text)
        assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "16", "--json"]) == 0
        docs.append(json.loads(capsys.readouterr().out))
    default, flash, unfused = docs
    assert default["memory"] == flash["memory"] and default["strategy"]["flash_attention"]
    assert not unfused["strategy"]["flash_attention"]
    for kept, plain in zip(unfused["memory"]["stages"], flash["memory"]["stages"], strict=True):
        # a stage's 16 layers, each its 32 / TP 2 heads' 4,096 x 4,096 scores, per micro-batch in flight
        scores = 16 * kept["in_flight_microbatches"] * 2 * (32 // 2) * 4096 * 4096
        assert kept["peak_bytes"] - plain["peak_bytes"] == scores


#: Megatron-LM's CI tests (tests/functional_tests/test_cases/gpt/<name>/model_config.yaml at d98e8a64dd), the
#: flags that shape memory, and the last rank's mem-max-allocated-bytes in golden_values_dev_dgx_h100.json
#: (8 H100s; GPT-2's 50,257-word vocabulary padded to a multiple of 128)
CI_RUNS = [
    ("gpt3_mcore_te_tp1_pp1_dist_optimizer_fim_dataset",
     "--pipeline-model-parallel-size 1 --use-distributed-optimizer --attention-backend unfused", 4702430720),
    ("gpt3_mcore_te_tp1_pp1_resume_torch_dist_dist_optimizer",
     "--pipeline-model-parallel-size 1 --use-distributed-optimizer", 2691792384),
    ("gpt3_mcore_tp1_pp4", "--pipeline-model-parallel-size 4 --transformer-impl local", 2746575872),
]


@pytest.mark.parametrize(("name", "flags", "measured"), CI_RUNS, ids=[c[0] for c in CI_RUNS])
def test_megatron_lms_ci_runs_are_priced_within_the_allocated_target(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, flags: str, measured: int) -> None:
    """Megatron-LM's CI measures its small GPT's allocated peak on the last rank (its TensorBoard
    writer); the last stage's prediction is within the issue's -2%..+8% of it (bench/
    memory_accuracy_published.py prices every such run)."""
    (tmp_path / "args.txt").write_text(
        "--num-layers 12 --hidden-size 512 --num-attention-heads 8 --seq-length 1024 --max-position-embeddings 1024\n"
        "--vocab-size 50304 --micro-batch-size 4 --global-batch-size 32 --tensor-model-parallel-size 1 --bf16\n"
        f"{flags}\n")
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "8", "--gpu", "H100-80GB",
                 "--json"]) == 0
    last = json.loads(capsys.readouterr().out)["memory"]["stages"][-1]["peak_bytes"]
    assert -0.02 <= measured / last - 1 <= 0.08
