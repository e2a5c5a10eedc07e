"""Real configurations, as their trainers' authors wrote them, priced with ``parplan memory --from``.

The corpus (``tests/data/real_configs/{megatron,deepspeed}``, each file's source and commit in its
folder's ``sources.json``): NVIDIA's Megatron-LM example scripts and DeepSpeedExamples' configs.
Each is priced as its trainer runs it, the figures checked by hand from the trainer's code in the
comments below, or refused in one line naming what is not modelled.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from parplan.cli import main
from parplan.imports import Imported, ImportProblemError, read_config
from parplan.imports.shell import read_script
from parplan.solver.frontends.presets import get_preset
from parplan.solver.models import ModelSource

DATA = Path(__file__).resolve().parents[1] / "data" / "real_configs"
MEGATRON, DEEPSPEED = DATA / "megatron", DATA / "deepspeed"
GIB = 2**30
#: llama-3-8b's parameter count (32 layers, hidden 4096, 8 key/value groups, ffn 14336, vocabulary
#: 128,256 untied): what the Llama 3 8B script's size flags describe
LLAMA3_8B = 8_030_261_248


def run(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["memory", *args, "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def refusal(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["memory", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_the_corpus_names_its_sources() -> None:
    files = 0
    for folder in (MEGATRON, DEEPSPEED):
        sources = json.loads((folder / "sources.json").read_text())
        assert sorted(sources) == sorted(p.name for p in folder.iterdir() if p.name != "sources.json")
        for src in sources.values():
            assert src["commit"] in src["url"] and src["url"].startswith("https://github.com/")
        files += len(sources)
    assert files >= 12


def test_nvidias_llama3_8b_script_prices_bf16_gradients_and_turns_sequence_parallelism_off(
        capsys: pytest.CaptureFixture[str]) -> None:
    """``examples/llama/train_llama3_8b_h100_fp8.sh`` as shipped (DTYPE=fp8, mock data): 8 GPUs of one
    node (GPUS_PER_NODE=8, NUM_NODES=1 in the script), TP 1, distributed optimizer, --bf16
    --grad-reduce-in-bf16 and --fp8-format hybrid. By hand, P = 8,030,261,248:

    - ``--grad-reduce-in-bf16`` sets ``accumulate_allreduce_grads_in_fp32 = False``
      (``megatron/training/arguments.py``), so the DDP's gradient buffer is bf16: 2P bytes;
    - the distributed optimizer shards fp32 master weights and Adam's two moments over dp 8: 12P / 8;
    - FP8 (delayed scaling, the default recipe) with ``--fp8-param-gather``: the linear layers'
      weights are Transformer Engine Float8Tensors only (``fp8_model_init``), one byte of data and
      one of the transpose Hopper's backward GEMM reads; the embedding and output layer's weights and
      the norms stay bf16, two bytes: 2P bytes, no bf16 copy beside the FP8 one;
    - ``--sequence-parallel`` with TP 1 is turned off, as Megatron-LM does with a warning;
    - activations of the one micro-batch in flight (PP 1, no recomputation, s = 8192 tokens, h 4096,
      key/value width 1024, f 14336), bytes per token and layer: the first RMSNorm's input (the
      block's input, 2h), Q/K/V's input in FP8 (TE's LayerNormLinear saves its FP8 output: 1h), q, k,
      v (2h + 2 x 2 x 1024), the attention output in bf16 (2h) and in FP8 for the output projection
      (1h), the second RMSNorm's input (2h), fc1's input in FP8 (1h), fc1's output, gate and up, that
      the fused SwiGLU keeps in bf16 (2 x 2f: ``bias_swiglu_impl``) and fc2's input in FP8 (1f):
      11h + 4 x 1024 + 5f = 120,832 bytes; x 32 layers, plus the final norm's input and the output
      layer's (bf16) input (2 x 2h), the loss's fp32 softmax (4 x 128,256) and the token ids (8):
      8192 x (32 x 120,832 + 16,384 + 513,024 + 8) = 36,012,359,680 bytes, 33.5 GiB. The whole peak,
      76.6 GiB, fits the 78.1 GiB usable: NVIDIA runs this script on H100s.
    """
    doc = run(capsys, "--from", "megatron-args", str(MEGATRON / "train_llama3_8b_h100_fp8.sh"), "--gpu", "H100-80GB")
    assert doc["model"]["parameters"] == LLAMA3_8B
    assert doc["strategy"]["summary"].startswith("tp1 pp1 dp8 zero1 recompute=none mb1x16")
    assert doc["strategy"]["precision"] == "fp8-pg-grad16" and not doc["strategy"]["sequence_parallel"]
    held = doc["memory"]["breakdown"]
    assert held["gradients"] == pytest.approx(2 * LLAMA3_8B, rel=1e-9)
    assert held["optimizer_states"] == pytest.approx(12 * LLAMA3_8B / 8, rel=1e-9)
    assert held["parameters"] == pytest.approx(2 * LLAMA3_8B, rel=1e-9)
    assert held["activations"] == 8192 * (32 * 120_832 + 16_384 + 513_024 + 8)
    assert doc["memory"]["fits"] and doc["memory"]["reserved_peak_bytes"] < doc["memory"]["usable_bytes"]
    adjusted = " | ".join(doc["import"]["adjusted"])
    assert "--grad-reduce-in-bf16" in adjusted and "--fp8-param-gather" in adjusted
    assert "Disabling sequence parallelism" in adjusted
    assert doc["import"]["unknown"] == []


def test_nvidias_mixtral_script_prices_with_its_vocabulary_and_node_count_given(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``examples/mixtral/train_mixtral_8x7b_distributed.sh`` reads its vocabulary from the tokenizer
    model (``$2``): refused until ``--vocab-size`` is given (Mixtral's tokenizer: 32,000). Its
    NNODES comes from SLURM (1 when unset): EP 8 with PP 4 needs 4 nodes, so ``--gpus 32``, which
    overrides the launch line's 8 processes. TP 1 with ``--sequence-parallel``: turned off, said.

    By hand, stage 0 (the embedding and layers 0-7) with one expert of 8 per rank (EP 8): per layer
    q and o 2 x 4096^2, k and v 2 x 4096 x 1024, two norms 2 x 4096, the router 4096 x 8, one expert
    3 x 4096 x 14336 = 218,144,768; x 8 + the embedding 32,000 x 4096 = 1,876,230,144 parameters.
    --bf16 keeps fp32 gradients (4 bytes). The distributed optimizer shards the dense parameters
    (466,944,000) over dp 8 and the experts over the expert data-parallel group (dp x tp / ep = 1):
    12 x (466,944,000 / 8 + 8 x 176,160,768) bytes.
    """
    script = MEGATRON / "train_mixtral_8x7b_distributed.sh"
    assert "missing --vocab-size" in refusal(capsys, "--from", "megatron-args", str(script))
    edited = tmp_path / "mixtral.sh"
    edited.write_text(script.read_text().replace("    --ffn-hidden-size 14336\n",
                                                 "    --ffn-hidden-size 14336\n    --vocab-size 32000\n"))
    assert "expert parallel degree 8 must divide dp 2" in refusal(capsys, "--from", "megatron-args", str(edited))
    doc = run(capsys, "--from", "megatron-args", str(edited), "--gpus", "32", "--gpu", "H100-80GB")
    assert doc["strategy"]["summary"].startswith("tp1 pp4 dp8 zero1 ep8")
    held = doc["memory"]["breakdown"]
    # parplan splits the router (4096 x 8) over the 8 expert ranks where Megatron-LM replicates it:
    # 7 x 4096 parameters a layer fewer than by hand, 1.2e-4 of the stage's
    assert held["gradients"] == pytest.approx(4 * 1_876_230_144, rel=1.3e-4)
    assert held["optimizer_states"] == pytest.approx(12 * (466_944_000 / 8 + 8 * 176_160_768), rel=1.3e-4)
    adjusted = " | ".join(doc["import"]["adjusted"])
    assert "--gpus 32 overrides the launch line's 8 processes" in adjusted
    assert "Disabling sequence parallelism" in adjusted and "SLURM_NNODES=1" in adjusted
    assert any("--moe-grouped-gemm" in u for u in doc["import"]["unpriced"])


@pytest.mark.parametrize(("name", "why"), [
    # Megatron-LM reads the GPT-2 vocabulary from --vocab-file ($3)
    ("train_gpt3_175b_distributed.sh", "missing --vocab-size"),
    # USE_MEGATRON_FSDP defaults to 1 in the script
    ("train_llama3_8b_fsdp_h100_fp8.sh", "--use-megatron-fsdp (Megatron-FSDP's sharded data parallelism)"),
    ("train_bert_340m_distributed.sh", "the training script pretrain_bert.py"),
    # its option loop may reassign TOKENIZER_ARG, on which the data flags depend
    ("gptoss_02_train.sh", "$DATA_ARGS_LIST: assigned under `if [[ \"$TOKENIZER_ARG\" == \"MOCK\" ]]"),
])
def test_megatron_scripts_parplan_cannot_price_are_refused_naming_why(
        name: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert why in refusal(capsys, "--from", "megatron-args", str(MEGATRON / name))


def test_deepspeeds_bf16_master_weights_config_uses_less_memory_than_its_baseline(
        capsys: pytest.CaptureFixture[str]) -> None:
    """DeepSpeedExamples' ``training/bf16_master_weight`` configs, ZeRO-3 on 4 GPUs as its README runs
    them (its script's model is not a preset; gpt-7.5b, P = 7,467,786,240, has its width, 4096).
    Baseline: bf16 weights (2P / 4), fp32 gradient partitions (4P / 4), fp32 master weights and
    moments (12P / 4). With ``bf16_master_weights_and_grads`` and ``bf16_optimizer_states``
    DeepSpeed makes the master partition and the gradient handed to the optimizer in bf16
    (``stage3.py``: ``master_weights_and_grads_dtype``) and Adam's moments like it: 2P / 4 of
    gradients, (2 + 4)P / 4 of optimizer states."""
    p = 7_467_786_240
    args = ("--model", "gpt-7.5b", "--gpus", "4", "--gpu", "H100-80GB")
    base = run(capsys, "--from", "ds-config", str(DEEPSPEED / "bf16_master_weight_baseline.json"), *args)
    full = run(capsys, "--from", "ds-config", str(DEEPSPEED / "bf16_master_weight_bf16_full.json"), *args)
    assert (base["strategy"]["precision"], full["strategy"]["precision"]) == ("bf16", "bf16-states16")
    b, f = base["memory"]["breakdown"], full["memory"]["breakdown"]
    assert b["parameters"] == f["parameters"] == pytest.approx(2 * p / 4, rel=1e-9)
    assert (b["gradients"], f["gradients"]) == pytest.approx((4 * p / 4, 2 * p / 4), rel=1e-9)
    assert (b["optimizer_states"], f["optimizer_states"]) == pytest.approx((12 * p / 4, 6 * p / 4), rel=1e-9)
    assert full["memory"]["peak_bytes"] < base["memory"]["peak_bytes"] - 10 * GIB
    assert "torch_autocast" in base["import"]["ignored"]
    assert any(u.startswith("torch_autocast") for u in full["import"]["unpriced"])
    assert any("bf16-states16" in a for a in full["import"]["adjusted"])


def test_deepspeed_examples_fp16_config_is_priced_as_written(capsys: pytest.CaptureFixture[str]) -> None:
    """BingBertSquad's ``deepspeed_bsz24_config.json`` on 8 GPUs: 24 = micro-batch 3 x 1 step x 8
    GPUs, no ZeRO, fp16 with Adam. parplan's fp16 for bert-large (P = 336,224,058): 2P of weights,
    4P of gradients, 12P of fp32 master weights and moments, none sharded."""
    p = 336_224_058
    doc = run(capsys, "--from", "ds-config", str(DEEPSPEED / "bingbertsquad_deepspeed_bsz24_config.json"),
              "--model", "bert-large", "--gpus", "8")
    assert doc["strategy"]["summary"].startswith("tp1 pp1 dp8 recompute=selective mb3x1")
    held = doc["memory"]["breakdown"]
    assert (held["parameters"], held["gradients"], held["optimizer_states"]) == (2 * p, 4 * p, 12 * p)
    assert doc["import"]["unknown"] == [] and "optimizer.params" in doc["import"]["ignored"]


@pytest.mark.parametrize(("name", "why"), [
    ("autotuning_ds_config_z2.json", 'train_micro_batch_size_per_gpu "auto": the Hugging Face Trainer fills it'),
    ("autotuning_ds_config_fp16_z3.json", 'train_micro_batch_size_per_gpu "auto"'),
    ("bing_bert_progressive_layer_drop_seq128.json", "progressive_layer_drop (layers skipped at random)"),
    ("bing_bert_onebitlamb_seq128_nccl.json", "optimizer.type 'OneBitLamb'"),
    ("zenflow_zf_config.json", "zero_optimization.zenflow"),
])
def test_deepspeed_configs_parplan_cannot_price_are_refused_naming_why(
        name: str, why: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert why in refusal(capsys, "--from", "ds-config", str(DEEPSPEED / name), "--model", "gpt-1.7b", "--gpus", "8")


def test_deepspeed_auto_batch_sizes_are_resolved_as_deepspeed_derives_them() -> None:
    """``_set_batch_related_parameters``: train_batch_size and gradient_accumulation_steps give the
    micro-batch, 64 / (2 x 8) = 4."""
    cfg = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": 2}
    got = read_config("ds-config", json.dumps(cfg), model=ModelSource("gpt-1.7b", config=get_preset("gpt-1.7b")),
                      gpus=8)
    assert isinstance(got, Imported)
    assert got.strategy.micro_batch == 4 and got.strategy.num_microbatches == 2
    assert got.report()["adjusted"][-1] == ('train_micro_batch_size_per_gpu "auto": 4, as DeepSpeed derives '
                                            'it from the other batch sizes')


def test_launch_lines_as_people_write_them() -> None:
    """torchrun without --nnodes (its default, 1), ``--nproc_per_node=$GPUS`` from the script's own
    assignment, an assignment naming the training script, and a variable the script does not set."""
    flags = ("--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 1024 "
             "--micro-batch-size 1 --bf16 --tensor-model-parallel-size $TP")
    script = f'GPUS=4\nTP=2\nSCRIPT="pretrain_gpt.py"\ntorchrun --nproc_per_node=$GPUS "$SCRIPT" {flags}\n'
    got = read_config("megatron-args", script)
    assert isinstance(got, Imported)
    assert got.gpus == 4 and got.strategy.tp == 2 and got.strategy.dp == 2
    assert any("torchrun without --nnodes: its default 1" in a for a in got.report()["adjusted"])
    overridden = read_config("megatron-args", script, gpus=8)
    assert overridden.gpus == 8 and any("--gpus 8 overrides the launch line's 4" in a
                                        for a in overridden.report()["adjusted"])
    with pytest.raises(ImportProblemError, match=r"--tensor-model-parallel-size \$TP: the variable is not set"):
        read_config("megatron-args", script.replace("TP=2\n", ""))


def test_bf16_states16_is_a_precision_of_parplan_memory(capsys: pytest.CaptureFixture[str]) -> None:
    """The precision the DeepSpeed import prices is one of ``--precision``'s: 10 bytes per parameter
    (ZeRO-1 over 8: 2P + 2P + (2 + 4)P / 8)."""
    doc = run(capsys, "--model", "gpt-1.7b", "--gpus", "8", "--tp", "1", "--pp", "1", "--zero", "1",
              "--precision", "bf16-states16")
    p = doc["model"]["parameters"]
    held = doc["memory"]["breakdown"]
    assert (held["parameters"], held["gradients"]) == (2 * p, 2 * p)
    assert held["optimizer_states"] == pytest.approx(6 * p / 8, rel=1e-12)


@pytest.mark.parametrize("precision", ["fp16", "bf16-grad16", "fp16-grad16", "fp8", "fp8-cs-grad16", "fp8-pg-grad16",
                                       "fp8-cs-pg"])
def test_megatron_export_writes_the_gradient_type_its_import_reads(
        precision: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Megatron-LM keeps fp16 gradients unless ``--accumulate-allreduce-grads-in-fp32`` and bf16's in
    fp32 unless ``--grad-reduce-in-bf16``; Transformer Engine's FP8 is ``--fp8-format`` (``--fp8-recipe
    tensorwise`` for current scaling, ``--fp8-param-gather`` for FP8 weights only): the export writes the
    flags of the precision planned, and the import reads them back to the same precision and memory."""
    priced = run(capsys, "--model", "gpt-1.7b", "--gpus", "8", "--tp", "2", "--pp", "1", "--zero", "1",
                 "--sequence-parallel", "--global-batch", "16", "--precision", precision, "--gpu", "H100-80GB")
    (tmp_path / "priced.json").write_text(json.dumps(priced))
    assert main(["export", str(tmp_path / "priced.json"), "--target", "megatron", "--out", str(tmp_path / "out")]) == 0
    capsys.readouterr()
    back = run(capsys, "--from", "megatron-args", str(tmp_path / "out" / "megatron_args.txt"), "--gpus", "8",
               "--gpu", "H100-80GB")
    assert back["strategy"]["precision"] == precision
    assert back["memory"]["peak_bytes"] == priced["memory"]["peak_bytes"]


def test_a_script_is_read_as_bash_would_run_it_without_arguments_or_environment() -> None:
    """if/elif/else on string tests (an unset variable is empty), an environment prefix before the
    launcher, and a variable a loop assigns refused where it is used."""
    script = read_script('GPUS=4\nfor i in 1 2; do X=$i; done\nif [ "$MODE" = "a" ]; then\n  TP=2\n'
                         'elif [[ "$GPUS" == "4" ]]; then\n  TP=4\nelse\n  TP=8\nfi\n'
                         'CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc_per_node $GPUS pretrain_gpt.py '
                         '--tp $TP --x $X\n')
    assert script.commands == [["torchrun", "--nproc_per_node", "4", "pretrain_gpt.py", "--tp", "4", "--x", "$X"]]
    assert script.unresolved == {"X": "assigned inside the one-line `for` block"} and script.defaults == {"MODE": ""}


def test_hugging_face_auto_buckets_are_filled_as_the_trainer_fills_them() -> None:
    """``transformers.integrations.deepspeed``: ``reduce_bucket_size = hidden^2`` and
    ``stage3_prefetch_bucket_size = 0.9 x hidden^2``; gpt-1.7b's hidden is 2304."""
    cfg = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}}
    got = read_config("ds-config", json.dumps(cfg), model=ModelSource("gpt-1.7b", config=get_preset("gpt-1.7b")),
                      gpus=8)
    adjusted = " | ".join(got.report()["adjusted"])
    assert "reduce_bucket_size \"auto\": 5,308,416 elements" in adjusted
    assert "stage3_prefetch_bucket_size \"auto\": 4,777,574 elements" in adjusted
    assert 'train_batch_size "auto": 16' in adjusted
