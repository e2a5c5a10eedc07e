"""Megatron-LM's split of the decoder layers over pipeline stages as ``parplan memory --from megatron-args``
reads it: ``--account-for-embedding-in-pipeline-split`` / ``--account-for-loss-in-pipeline-split`` against the
layer count of ``get_num_layers_to_build`` (megatron/core/transformer/transformer_block.py), and priced as the
same uneven first and last stages as ``--decoder-first/last-pipeline-num-layers``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parplan.cli import main
from parplan.imports.common import ImportProblemError
from parplan.imports.megatron import read_megatron_args

#: a small GPT (LayerNorm, GELU, learned positions, biases), 4 pipeline stages on 8 GPUs
GPT = ("--hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256 "
       "--vocab-size 1024 --micro-batch-size 1 --global-batch-size 8 --bf16 --pipeline-model-parallel-size 4 ")
EMBEDDING, LOSS = "--account-for-embedding-in-pipeline-split ", "--account-for-loss-in-pipeline-split "


def megatron_layers_to_build(layers: int, pp: int, v: int, embedding: bool, loss: bool, rank: int, chunk: int) -> int:
    """get_num_layers_to_build for pipeline rank ``rank``'s virtual stage ``chunk``: num_layers plus one for
    the embedding and one for the loss, // pp, // vp_size; one fewer on the first virtual stage
    (is_pipeline_first_stage(ignore_virtual=False)) with the embedding, on the last with the loss."""
    per_rank = (layers + embedding + loss) // pp
    built = per_rank // v
    built -= embedding and rank == 0 and chunk == 0
    built -= loss and rank == pp - 1 and chunk == v - 1
    return built


@pytest.mark.parametrize(("layers", "extra", "v", "embedding", "loss", "expected"), [
    (30, EMBEDDING + LOSS, 1, True, True, (7, 8, 8, 7)),
    (31, EMBEDDING, 1, True, False, (7, 8, 8, 8)),
    (31, LOSS, 1, False, True, (8, 8, 8, 7)),
    (14, EMBEDDING + LOSS + "--num-virtual-stages-per-pipeline-rank 2 ", 2, True, True, (1, 2, 2, 2, 2, 2, 2, 1)),
    # arguments.py: the virtual size from the counted layers, (14 + 2) // 4 // 2
    (14, EMBEDDING + LOSS + "--num-layers-per-virtual-pipeline-stage 2 ", 2, True, True, (1, 2, 2, 2, 2, 2, 2, 1)),
])
def test_the_embedding_and_loss_count_as_layers_of_the_split(layers: int, extra: str, v: int, embedding: bool,
                                                              loss: bool, expected: tuple[int, ...]) -> None:
    s = read_megatron_args(GPT + f"--num-layers {layers} " + extra, gpus=8).strategy
    # virtual stage i + k * pp is rank i's chunk k
    megatron = tuple(megatron_layers_to_build(layers, 4, v, embedding, loss, i, k) for k in range(v) for i in range(4))
    assert s.partition == megatron == expected
    assert s.virtual_stages == v


def test_accounted_stages_price_as_the_same_first_and_last_stage_layer_counts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    peaks = []
    for extra in (EMBEDDING + LOSS, "--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7 "):
        (tmp_path / "args.txt").write_text(GPT + "--num-layers 30 " + extra)
        assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "8", "--json"]) == 0
        peaks.append(json.loads(capsys.readouterr().out)["memory"]["peak_bytes"])
    assert peaks[0] == peaks[1]


def test_interleaved_accounted_stages_are_priced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "args.txt").write_text(GPT + "--num-layers 14 " + EMBEDDING + LOSS
                                       + "--num-virtual-stages-per-pipeline-rank 2")
    assert main(["memory", "--from", "megatron-args", str(tmp_path / "args.txt"), "--gpus", "8", "--json"]) == 0
    assert "interleaved(v=2)" in json.loads(capsys.readouterr().out)["strategy"]["summary"]


@pytest.mark.parametrize(("extra", "why"), [
    # Megatron-LM's CI (gpt3_mcore_te_tp1_pp4_vp2_account_for_embedding_loss_in_pipeline_split): its first and
    # last virtual stages hold the embedding and the loss alone
    ("--num-layers 6 " + EMBEDDING + LOSS + "--num-virtual-stages-per-pipeline-rank 2",
     "stages [0, 1, 1, 1, 1, 1, 1, 0] decoder layers: a stage without one is not modelled"),
    ("--num-layers 31 " + EMBEDDING + LOSS, "33 layers, the embedding and loss counted, do not split evenly"),
    ("--num-layers 30 " + EMBEDDING + "--decoder-first-pipeline-num-layers 7", "not given together"),
    ("--num-layers 16 --num-layers-per-virtual-pipeline-stage 2 --num-virtual-stages-per-pipeline-rank 2",
     "at most one is given"),
])
def test_splits_megatron_lm_refuses_or_parplan_does_not_build_are_refused(extra: str, why: str) -> None:
    with pytest.raises(ImportProblemError) as err:
        read_megatron_args(GPT + extra, gpus=8)
    assert any(why in p for p in err.value.problems), err.value.problems
