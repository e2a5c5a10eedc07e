"""torchtitan jobs written by torchtitan's authors (tests/data/real_configs/torchtitan/, each file's
source in its first line), read by ``parplan memory --from torchtitan-config`` as torchtitan runs them.

The oracle of a priced file is the strategy written out by hand from torchtitan's code (the comment
of each case says which lines), priced through ``parplan memory``'s own flags: the import must give
the same strategy and the same figures, and the weights and optimizer states per GPU must be the
closed form of FSDP2 over fp32 master weights (4 and 8 bytes a parameter over tp x dp). A refused file
is one line naming what is not modelled.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from parplan.cli import main
from parplan.imports import ImportProblemError, LayerImport, read_config
from parplan.imports.torchtitan_recipes import RECIPES, TRAINER_DEFAULTS
from parplan.solver.cost.activations import Recompute

CORPUS = Path(__file__).parents[1] / "data" / "real_configs" / "torchtitan"
GIB = 2**30

#: file -> (the extra flags of `parplan memory`, the strategy torchtitan runs, written by hand, as
#: `parplan memory` flags). torchtitan 0.3.0: torchtitan/models/llama3/config_registry.py (recipes),
#: torchtitan/config/configs.py (defaults: local batch 8, seq 2048, shard degree -1 = the ranks left,
#: global batch -1 = local x dp, sequence parallelism on with TP), torchtitan/distributed/fsdp.py
#: (reshard_after_forward "default" = not pp_enabled: ZeRO-3 without pipelining).
PRICED: dict[str, tuple[list[str], list[str]]] = {
    # README.md: MODULE=llama3 CONFIG=llama3_8b ./run_train.sh; run_train.sh: NGPU 8 on one node.
    # llama3_8b(): local_batch_size=1, seq_len=8192, SelectiveAC (the per-operator policy: op);
    # FSDP over 8: tp1 dp8 zero3, mb1x1.
    "readme_llama3_8b.sh": (["--gpus-per-node", "8"],
                            ["--model", "llama-3-8b", "--gpus", "8", "--tp", "1", "--pp", "1", "--zero", "3",
                             "--recompute", "op", "--micro-batch", "1", "--global-batch", "8",
                             "--seq-len", "8192"]),
    # docs/debugging.md: NGPU=128 ... CONFIG=llama3_70b ./run_train.sh. llama3_70b(): local 8, seq 8192,
    # tensor_parallel_degree=8, FullAC; shard -1 = 128 / 8 = 16; global 8 x 16 = 128.
    "debugging_llama3_70b_128gpus.sh": (["--gpus-per-node", "8"],
                                        ["--model", "llama-3-70b", "--gpus", "128", "--tp", "8", "--pp", "1",
                                         "--zero", "3", "--sequence-parallel", "--recompute", "full",
                                         "--micro-batch", "8", "--global-batch", "128", "--seq-len", "8192"]),
    # v0.2.2 llama3_70b.toml, on the 64 GPUs its NOTE names: tp 8, shard -1 = 8, local 8, seq 8192, mode full.
    "v0.2.2_llama3_70b.toml": (["--gpus", "64", "--gpus-per-node", "8"],
                               ["--model", "llama-3-70b", "--gpus", "64", "--tp", "8", "--pp", "1", "--zero", "3",
                                "--sequence-parallel", "--recompute", "full", "--micro-batch", "8",
                                "--global-batch", "64", "--seq-len", "8192"]),
    # v0.2.2 and v0.1.0 llama3_8b.toml: local 1, seq 8192, shard -1 = 64, selective 'op' (per-operator).
    "v0.2.2_llama3_8b.toml": (["--gpus", "64", "--gpus-per-node", "8"],
                              ["--model", "llama-3-8b", "--gpus", "64", "--tp", "1", "--pp", "1", "--zero", "3",
                               "--recompute", "op", "--micro-batch", "1", "--global-batch", "64",
                               "--seq-len", "8192"]),
    "v0.1.0_llama3_8b.toml": (["--gpus", "64", "--gpus-per-node", "8"],
                              ["--model", "llama-3-8b", "--gpus", "64", "--tp", "1", "--pp", "1", "--zero", "3",
                               "--recompute", "op", "--micro-batch", "1", "--global-batch", "64",
                               "--seq-len", "8192"]),
}

#: file -> (flags, what the one-line refusal names)
REFUSED: dict[str, tuple[list[str], list[str]]] = {
    # llama3_8b_first_85_pct_layers_nvfp4(): NVFP4LinearConverter and CompileConfig(enable=True)
    "nvfp4_llama3_8b.sh": ([], ["llama3_8b_first_85_pct_layers_nvfp4", "NVFP4"]),
    # srun torchrun ... --module ${MODULE} --config ${CONFIG}: MODULE=${MODULE:-"llama3"} is not a plain value
    "multinode_trainer.slurm": ([], ["${MODULE}", "shell variable"]),
    # [compile] enable=true, enable_async_tensor_parallel = true (its Float8 converter is priced: fp8-torchao-fsdp8)
    "v0.2.2_llama3_405b.toml": (["--gpus", "128"], ["compile.enable", "compile.enable_async_tensor_parallel"]),
    # v0.1.0: [training] compile = true, enable_async_tensor_parallel = true
    "v0.1.0_llama3_405b.toml": (["--gpus", "128"], ["compile.enable"]),
}


def memory_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["memory", *args, "--gpu", "H100-80GB", "--json"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_every_file_of_the_corpus_has_an_expected_outcome_and_its_source() -> None:
    files = sorted(p.name for p in CORPUS.iterdir())
    assert sorted([*PRICED, *REFUSED, "debugging_seed_checkpoint.sh", "v0.2.2_debug_model.toml"]) == files
    for name in files:
        first = (CORPUS / name).read_text().splitlines()[0]
        assert first.startswith("# Source: https://github.com/pytorch/torchtitan/blob/"), name


@pytest.mark.parametrize("name", sorted(PRICED))
def test_priced_as_torchtitan_runs_it(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    flags, by_hand = PRICED[name]
    doc = memory_json(capsys, "--from", "torchtitan-config", str(CORPUS / name), *flags)
    expected = memory_json(capsys, *by_hand, "--runtime", "torchtitan", *flags[-2:])
    assert doc["strategy"]["summary"] == expected["strategy"]["summary"]
    assert doc["memory"] == expected["memory"] and doc["time"] == expected["time"]
    # closed form: fp32 master weights and Adam's two states, sharded over tp x dp (norms, replicated
    # over TP, are under 0.01 % of the parameters)
    s, params = doc["strategy"], doc["model"]["parameters"]
    devices = s["tp"] * s["dp"]
    breakdown = doc["memory"]["breakdown"]
    assert breakdown["parameters"] == pytest.approx(4 * params / devices, rel=1e-3)
    assert breakdown["optimizer_states"] == pytest.approx(8 * params / devices, rel=1e-3)
    assert "None" not in json.dumps(doc["import"])


def test_the_70b_recipe_fits_its_64_h100s_with_the_recipes_tp_and_full_checkpointing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # issue 49's line: the recipe's tensor_parallel_degree=8 and FullAC stand where the line says nothing
    line = ("torchrun --nnodes=8 --nproc_per_node=8 -m torchtitan.train --module llama3 --config llama3_70b "
            "--training.seq_len 8192 --training.local_batch_size 8\n")
    (tmp_path / "run.sh").write_text(line)
    doc = memory_json(capsys, "--from", "torchtitan-config", str(tmp_path / "run.sh"))
    assert doc["strategy"]["summary"].startswith("tp8 pp1 dp8 zero3 sp recompute=full mb8x1")
    assert doc["memory"]["fits"] and doc["memory"]["peak_bytes"] < 35 * GIB
    # 80 checkpointed block inputs of 8 x 8192 x 8192 bf16, sequence-parallel over 8: 10 GiB at least
    assert doc["memory"]["breakdown"]["activations"] >= 80 * 8 * 8192 * 8192 * 2 / 8
    assert any("tensor_parallel_degree 8" in a and "activation_checkpoint full" in a for a in doc["import"]["adjusted"])


def test_the_recipes_seq_len_stands_and_its_selective_checkpointing_is_per_operator() -> None:
    imported = read_config("torchtitan-config", "--module llama3 --config llama3_8b", gpus=8)
    assert not isinstance(imported, LayerImport)
    assert imported.seq_len == 8192 and imported.strategy.micro_batch == 1  # llama3_8b(): TrainingConfig
    assert imported.strategy.recompute is Recompute.OP and not [a for a in imported.adjusted if "approximated" in a]
    full = read_config("torchtitan-config", "--module llama3 --config llama3_8b activation_checkpoint:full", gpus=8)
    assert not isinstance(full, LayerImport)
    assert full.strategy.recompute is Recompute.FULL and not [a for a in full.adjusted if "approximated" in a]


def test_a_layer_interval_checkpoints_every_nth_block_and_prices_between_none_and_full(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # v0.2.2 debug_model.toml: selective_ac_option '2'; torchtitan's _apply_layer_sac wraps block k
    # (counted from 1) when k % 2 == 0: layers.1, layers.3, layers.5 of the 6
    text = (CORPUS / "v0.2.2_debug_model.toml").read_text()
    imported = read_config("torchtitan-config", text, gpus=8)
    assert isinstance(imported, LayerImport)
    assert [s.recompute is Recompute.FULL for s in imported.plan.layers.values()] == [False, True] * 3
    peaks = {}
    for option in ("2", "op", "1"):
        path = tmp_path / f"{option}.toml"
        path.write_text(text.replace("selective_ac_option = '2'", f"selective_ac_option = '{option}'"))
        peaks[option] = memory_json(capsys, "--from", "torchtitan-config", str(path), "--gpus", "8")["memory"]
    acts = {k: v["breakdown"]["activations"] for k, v in peaks.items()}
    assert acts["1"] < acts["op"] < acts["2"]  # all blocks whole < per-operator < every 2nd (half kept whole)


def test_the_seed_checkpoint_line_prices_the_debug_model_on_one_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    # docs/debugging.md: NGPU=1 ... CONFIG=llama3_debugmodel ./run_train.sh with every degree 1: one GPU,
    # llama3_debugmodel(): local 8, seq 2048 (its Interleaved1F1B schedule unused without pipelining)
    doc = memory_json(capsys, "--from", "torchtitan-config", str(CORPUS / "debugging_seed_checkpoint.sh"))
    assert doc["strategy"]["summary"].startswith("tp1 pp1 dp1 recompute=op mb8x1")
    assert doc["model"]["seq_len"] == 2048 and doc["import"]["ignored"][:2] == ["--checkpoint.enable",
                                                                                 "--checkpoint.create_seed_checkpoint"]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_refused_in_one_line_naming_what_is_not_modelled(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    flags, named = REFUSED[name]
    assert main(["memory", "--from", "torchtitan-config", str(CORPUS / name), *flags]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "None" not in err, err
    for what in named:
        assert what in err, (what, err)


def test_pipeline_stages_follow_torchtitans_split() -> None:
    # pipeline_parallel.py, _generate_llm_fqn_per_model_part: 32 layers + 1 (embedding) + 1 (output) = 34
    # effective layers over 4 stages = 9, 9, 8, 8; the first and last one layer less: 8, 9, 8, 7
    line = ("--module llama3 --config llama3_8b --parallelism.pipeline_parallel_degree 4 "
            "--training.disable_cuda_graphs --training.local_batch_size 4")
    imported = read_config("torchtitan-config", line, gpus=8)
    assert not isinstance(imported, LayerImport)
    assert imported.strategy.partition == (8, 9, 8, 7) and imported.strategy.num_microbatches == 4
    assert imported.strategy.zero == 2  # reshard_after_forward default: not pp_enabled
    # a looped schedule gets two stages a rank (_get_pipeline_metadata): 8 stages of 34 = 5, 5, 4 ... less 1
    looped = read_config("torchtitan-config", line.replace("degree 4", "degree 2") +
                         " --parallelism.pipeline_parallel_schedule Interleaved1F1B", gpus=8)
    assert not isinstance(looped, LayerImport)
    assert looped.strategy.virtual_stages == 2 and looped.strategy.partition == (8, 9, 8, 7)


@pytest.mark.parametrize(("text", "named"), [
    ("--module llama3 --config llama3_8b --parallelism.pipeline_parallel_degree 2",
     "set --training.disable_cuda_graphs"),  # trainer.py: _validate_cuda_graphs
    ("--job.config_file train_configs/llama3_8b.toml", "needs --module and --config"),
    ("--module llama3 --config llama3_405b", "torch.compile"),
    ("--module llama3 --config llama3_8b --compile.enable", "compile.enable"),
    ("--module llama3 --config llama3_8b --loss.num_chunks 4", "loss.num_chunks 4"),
    ("--module llama3 --config llama3_8b activation_checkpoint:memory-budget", "memory-budget"),
])
def test_lines_torchtitan_would_not_run_as_priced_are_refused(text: str, named: str) -> None:
    with pytest.raises(ImportProblemError) as e:
        read_config("torchtitan-config", text, gpus=8)
    assert named in str(e.value) and "None" not in str(e.value)


def test_a_toml_file_needs_the_gpu_count() -> None:
    with pytest.raises(ImportProblemError, match="give --gpus"):
        read_config("torchtitan-config", (CORPUS / "v0.2.2_llama3_8b.toml").read_text())


def _torchtitan_source(relative: str) -> ast.Module:
    """A module of the installed torchtitan, parsed (not imported: it needs triton), or a skip."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torchtitan is not installed")
    root = Path(next(iter(spec.submodule_search_locations)))
    version = next(root.parent.glob("torchtitan-*.dist-info"), None)
    if version is None or not version.name.startswith("torchtitan-0.3.0"):
        pytest.skip("the recipes are torchtitan 0.3.0's")
    return ast.parse((root / relative).read_text())


def _keywords(call: ast.Call) -> dict[str, str]:
    return {k.arg: str(ast.literal_eval(k.value)) for k in call.keywords
            if k.arg is not None and isinstance(k.value, ast.Constant)}


def test_the_recipes_are_torchtitans_own() -> None:
    """Every llama3 recipe of the installed torchtitan 0.3.0 is known, with the batch, sequence length,
    degrees and checkpointing its function sets (read from its source), and the trainer's defaults are
    its dataclasses' (an oracle independent of the data module: torchtitan's code itself)."""
    tree = _torchtitan_source("models/llama3/config_registry.py")
    known = {r.config: r for r in RECIPES if r.module == "llama3"}
    functions = [f for f in tree.body if isinstance(f, ast.FunctionDef)]
    assert sorted(f.name for f in functions) == sorted(known)
    for f in functions:
        calls = [n for n in ast.walk(f) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))]
        names = {ast.unparse(c.func): c for c in calls}
        base = next((known[n] for n in names if n in known), None)  # `config = llama3_8b()` and changes
        fields = dict(base.fields) if base else {}
        ac = base.ac if base else None
        for section, call in (("training", "TrainingConfig"), ("parallelism", "ParallelismConfig")):
            if call in names:
                fields.update({f"{section}.{k}": v for k, v in _keywords(names[call]).items()})
        ac = {"SelectiveAC.Config": "selective", "FullAC.Config": "full"}.get(
            next((n for n in names if n in ("SelectiveAC.Config", "FullAC.Config")), ""), ac)
        fields.pop("training.steps", None)
        assert (dict(known[f.name].fields), known[f.name].ac) == (fields, ac), f.name
    configs = _torchtitan_source("config/configs.py")
    defaults = {f"{cls.name.removesuffix('Config').lower()}.{a.target.id}": a.value
                for cls in configs.body if isinstance(cls, ast.ClassDef)
                for a in cls.body if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name)}
    for key, value in TRAINER_DEFAULTS.items():
        if key in defaults:
            given = ast.literal_eval(defaults[key])
            text = "" if given is None else str(given).lower() if isinstance(given, bool) else str(given)
            assert text == value, key
    assert len([k for k in TRAINER_DEFAULTS if k in defaults]) == len(TRAINER_DEFAULTS) - 1  # but loss.num_chunks
