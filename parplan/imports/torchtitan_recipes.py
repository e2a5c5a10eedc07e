"""torchtitan 0.3.0's own settings, as data: the fields of its trainer's config that change memory or
time, with their defaults, and the llama3 module's recipes (the ``--config`` functions of
``torchtitan/models/llama3/config_registry.py``) with the fields each one sets.

A field is named ``section.field`` as on torchtitan's command line; values are text as a command
line gives them. Each entry carries the one line of torchtitan's code it was read from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

#: torchtitan's trainer config fields parplan prices, with 0.3.0's defaults (``TrainingConfig``,
#: ``ParallelismConfig`` in ``torchtitan/config/configs.py``; ``--loss.num_chunks`` of
#: ``ChunkedLossWrapper.Config`` in ``torchtitan/components/loss.py``).
TRAINER_DEFAULTS: Mapping[str, str] = MappingProxyType({
    "training.local_batch_size": "8",  # configs.py: TrainingConfig.local_batch_size: int = 8
    "training.global_batch_size": "-1",  # configs.py: global_batch_size: int = -1 (local x dp)
    "training.seq_len": "2048",  # configs.py: seq_len: int = 2048
    "training.dtype": "float32",  # configs.py: dtype = "float32"
    "training.mixed_precision_param": "bfloat16",  # configs.py: mixed_precision_param = "bfloat16"
    "training.mixed_precision_reduce": "float32",  # configs.py: mixed_precision_reduce = "float32"
    "training.enable_cpu_offload": "false",  # configs.py: enable_cpu_offload: bool = False
    "training.disable_cuda_graphs": "false",  # configs.py: disable_cuda_graphs: bool = False
    "parallelism.data_parallel_replicate_degree": "1",  # configs.py: ParallelismConfig, = 1
    "parallelism.data_parallel_shard_degree": "-1",  # configs.py: = -1 (the ranks left over)
    "parallelism.fsdp_reshard_after_forward": "default",  # configs.py: = "default"
    "parallelism.enable_fsdp_symm_mem": "false",  # configs.py: enable_fsdp_symm_mem: bool = False
    "parallelism.tensor_parallel_degree": "1",  # configs.py: tensor_parallel_degree: int = 1
    "parallelism.enable_sequence_parallel": "true",  # configs.py: enable_sequence_parallel: bool = True
    "parallelism.spmd_backend": "spmd_types",  # configs.py: spmd_backend = "spmd_types"
    "parallelism.pipeline_parallel_degree": "1",  # configs.py: pipeline_parallel_degree: int = 1
    "parallelism.pipeline_parallel_first_stage_less_layers": "1",  # configs.py: = 1
    "parallelism.pipeline_parallel_last_stage_less_layers": "1",  # configs.py: = 1
    "parallelism.pipeline_parallel_layers_per_stage": "",  # configs.py: int | None = None
    "parallelism.pipeline_parallel_schedule": "1F1B",  # configs.py: pipeline_parallel_schedule = "1F1B"
    "parallelism.pipeline_parallel_schedule_csv": "",  # configs.py: pipeline_parallel_schedule_csv = ""
    "parallelism.pipeline_parallel_microbatch_size": "1",  # configs.py: = 1
    "parallelism.context_parallel_degree": "1",  # configs.py: context_parallel_degree: int = 1
    "parallelism.expert_parallel_degree": "1",  # configs.py: expert_parallel_degree: int = 1
    "compile.enable": "false",  # configs.py: CompileConfig.enable: bool = False
    "compile.enable_async_tensor_parallel": "false",  # configs.py: = False
    "loss.num_chunks": "8",  # components/loss.py: ChunkedLossWrapper.Config.num_chunks: int = 8
})

#: Boolean fields (a flag ``--s.f`` / ``--s.no_f`` on tyro's command line).
SWITCHES = frozenset(k for k, v in TRAINER_DEFAULTS.items() if v in ("true", "false"))

#: torchtitan's own activation checkpointing when a config sets none: ``trainer.py``,
#: ``Trainer.Config.activation_checkpoint = field(default_factory=SelectiveAC.Config)``.
DEFAULT_AC = "selective"


@dataclass(frozen=True)
class Recipe:
    """One ``--config`` function of torchtitan 0.3.0's llama3 module: the flavor it trains, the
    fields it sets (``section.field`` -> text), its activation checkpointing (``selective``, torchtitan's
    per-operator policy; ``full``; ``none``), and, where parplan cannot price what it builds, why."""

    config: str
    flavor: str
    fields: Mapping[str, str]
    ac: str
    source: str
    refused: str | None = None
    module: str = "llama3"
    #: the parplan precision of its Float8 linear layers (torchao, ``Float8LinearConverter``), None without
    float8: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fields", MappingProxyType(dict(self.fields)))


_REGISTRY = "torchtitan/models/llama3/config_registry.py"
_DEBUG = {"training.local_batch_size": "8", "training.seq_len": "2048",
          "parallelism.pipeline_parallel_schedule": "Interleaved1F1B"}
_8B = {"training.local_batch_size": "1", "training.seq_len": "8192"}
_70B = {"training.local_batch_size": "8", "training.seq_len": "8192", "parallelism.tensor_parallel_degree": "8"}

#: The llama3 recipes of torchtitan 0.3.0 (and the one parplan's export writes, ``llama3_405b_bf16``).
RECIPES: tuple[Recipe, ...] = (
    Recipe("llama3_debugmodel", "debugmodel", _DEBUG, "selective",
           f"{_REGISTRY}: llama3_debugmodel(): TrainingConfig(local_batch_size=8, seq_len=2048), "
           "ParallelismConfig(pipeline_parallel_schedule='Interleaved1F1B'), SelectiveAC.Config()"),
    Recipe("llama3_debugmodel_varlen_attn", "debugmodel", _DEBUG, "selective",
           f"{_REGISTRY}: llama3_debugmodel_varlen_attn(): attn_backend='varlen'",
           refused="its varlen attention backend is not modelled (parplan prices torchtitan's FlexAttention)"),
    Recipe("llama3_debugmodel_dist_gemm", "debugmodel", _DEBUG, "selective",
           f"{_REGISTRY}: llama3_debugmodel_dist_gemm(): tp_gemm_backend='dist_gemm'",
           refused="its async tensor parallelism (tp_gemm_backend dist_gemm, collectives folded into the GEMMs) "
                   "is not modelled"),
    Recipe("llama3_debugmodel_float8", "debugmodel", _DEBUG, "selective",
           f"{_REGISTRY}: llama3_debugmodel_float8(): Float8LinearConverter (recipe_name 'rowwise', its default)",
           float8="fp8-torchao-rowwise"),
    Recipe("llama3_debugmodel_nvfp4", "debugmodel", _DEBUG, "selective",
           f"{_REGISTRY}: llama3_debugmodel_nvfp4(): NVFP4LinearConverter",
           refused="its NVFP4 linear layers are not modelled"),
    Recipe("llama3_debugmodel_first_85_pct_layers_nvfp4", "debugmodel", _DEBUG, "selective",
           f"{_REGISTRY}: llama3_debugmodel_first_85_pct_layers_nvfp4(): NVFP4LinearConverter",
           refused="its NVFP4 linear layers are not modelled"),
    Recipe("llama3_debugmodel_float8_emulate_lora", "debugmodel", _DEBUG, "selective",
           f"{_REGISTRY}: llama3_debugmodel_float8_emulate_lora(): Float8LinearConverter, LoRAConverter",
           refused="its Float8 linear layers and LoRA adapters are not modelled"),
    Recipe("llama3_debugmodel_ce_loss", "debugmodel", _DEBUG, "selective",
           f"{_REGISTRY}: llama3_debugmodel_ce_loss(): loss = CrossEntropyLoss.Config(...)",
           refused="its unchunked cross-entropy loss is not modelled (parplan prices torchtitan's "
                   "ChunkedLossWrapper)"),
    Recipe("llama3_8b", "8B", _8B, "selective",
           f"{_REGISTRY}: llama3_8b(): TrainingConfig(local_batch_size=1, seq_len=8192), SelectiveAC.Config()"),
    Recipe("llama3_8b_first_85_pct_layers_nvfp4", "8B", _8B, "selective",
           f"{_REGISTRY}: llama3_8b_first_85_pct_layers_nvfp4(): NVFP4LinearConverter, CompileConfig(enable=True)",
           refused="its NVFP4 linear layers and torch.compile are not modelled"),
    Recipe("llama3_8b_mxfp8", "8B", _8B, "selective",
           f"{_REGISTRY}: llama3_8b_mxfp8(): MXFP8LinearConverter, CompileConfig(enable=True)",
           refused="its MXFP8 linear layers and torch.compile are not modelled"),
    Recipe("llama3_70b", "70B", _70B, "full",
           f"{_REGISTRY}: llama3_70b(): TrainingConfig(local_batch_size=8, seq_len=8192), "
           "ParallelismConfig(tensor_parallel_degree=8), FullAC.Config()"),
    Recipe("llama3_405b", "405B", {**_70B, "training.local_batch_size": "2"}, "full",
           f"{_REGISTRY}: llama3_405b(): Float8LinearConverter(filter_fqns=['lm_head']), "
           "CompileConfig(enable=True, enable_async_tensor_parallel=True)",
           refused="its torch.compile and async tensor parallelism are not modelled; `parplan export --target "
                   "torchtitan` writes llama3_405b_bf16, the same job in bf16 and eager, or "
                   "llama3_405b_bf16_float8_rowwise with the Float8 linear layers (precision fp8-torchao-rowwise)"),
    Recipe("sft_debugmodel", "debugmodel", {"training.local_batch_size": "8", "training.seq_len": "2048"},
           "selective", f"{_REGISTRY}: sft_debugmodel(): TrainingConfig(local_batch_size=8, seq_len=2048), "
           "attn_backend='flex', SelectiveAC.Config()"),
    Recipe("llama3_405b_bf16", "405B", _70B, "full",
           "parplan/exports/torchtitan.py: llama3_405b_bf16(): llama3_70b() with model_registry('405B')",
           module="parplan_torchtitan_config"),
    # parplan/exports/torchtitan_float8.py: <recipe>_float8_rowwise(): model_registry(..., converters=[
    # Float8LinearConverter.Config(recipe_name="rowwise", filter_fqns=["lm_head"])]) on a recipe above
    *(Recipe(f"{config}_float8_rowwise", flavor, fields, ac, "parplan/exports/torchtitan_float8.py: "
             f"{config}_float8_rowwise(): {config}() with Float8LinearConverter(recipe_name='rowwise')",
             module="parplan_torchtitan_config", float8="fp8-torchao-rowwise")
      for config, flavor, fields, ac in (("llama3_debugmodel", "debugmodel", _DEBUG, "selective"),
                                         ("llama3_8b", "8B", _8B, "selective"), ("llama3_70b", "70B", _70B, "full"),
                                         ("llama3_405b_bf16", "405B", _70B, "full"))),
)


def recipe_of(module: str, config: str) -> Recipe | None:
    """The recipe ``--module module --config config`` runs, None when parplan does not know it."""
    return next((r for r in RECIPES if r.config == config and r.module == module), None)


def default_stage_layers(stages: int, layers: int, first_less: int, last_less: int) -> tuple[int, ...]:
    """Blocks of each pipeline stage when the job names no modules per stage: torchtitan counts the
    embedding as ``first_less`` blocks and the norm and output layer as ``last_less``, cuts the
    total into ``stages`` parts as evenly as it can, the first parts one larger
    (``torchtitan/distributed/pipeline_parallel.py``, ``_generate_llm_fqn_per_model_part``).
    ValueError where torchtitan raises one."""
    if stages == 1:
        return (layers,)
    effective = layers + first_less + last_less
    base, extra = divmod(effective, stages)
    if base == 0 or first_less > base or last_less > base:
        raise ValueError(f"{stages} pipeline stages for {layers} layers with the first stage {first_less} and the "
                         f"last {last_less} layer(s) less: torchtitan refuses it")
    sizes = [base + (1 if i < extra else 0) for i in range(stages)]
    sizes[0] -= first_less
    sizes[-1] -= last_less
    return tuple(sizes)


def stages_per_rank(schedule_is_looped: bool, pp: int, layers: int, first_less: int, last_less: int,
                    layers_per_stage: int | None) -> int:
    """Pipeline stages on each rank: with ``pipeline_parallel_layers_per_stage``, the stages that many
    layers make (rounded up), else 1 for a single-stage schedule and 2 for a looped one
    (``pipeline_parallel.py``, ``_get_pipeline_metadata``). ValueError where torchtitan raises one."""
    if layers_per_stage is None:
        return 2 if schedule_is_looped else 1
    stages = -(-(layers + first_less + last_less) // layers_per_stage)
    if stages % pp:
        raise ValueError(f"pipeline_parallel_layers_per_stage {layers_per_stage} makes {stages} stages, not a "
                         f"multiple of the pipeline degree {pp}: torchtitan refuses it")
    per = stages // pp
    if (per != 1) if not schedule_is_looped else (per < 2):
        raise ValueError(f"pipeline_parallel_layers_per_stage {layers_per_stage} makes {per} stage(s) per rank; "
                         "torchtitan's schedule needs " + ("2 or more" if schedule_is_looped else "exactly 1"))
    return per
