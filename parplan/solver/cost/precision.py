"""Precision settings: bytes per element of each kind of training state."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from parplan.solver.errors import ConfigError


@dataclass(frozen=True)
class Precision:
    """Bytes per parameter (or per activation element) of each category of memory.

    ``master_bytes`` is the fp32 master copy mixed precision keeps (0 when the weights are
    already fp32); ``optimizer_bytes`` is Adam's two moments. ``matmul_dtype`` is the dtype the
    matmuls with a weight run in when it is not ``compute_dtype`` (FP8 training).
    """

    name: str
    param_bytes: int
    grad_bytes: int
    master_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    compute_dtype: str
    matmul_dtype: str | None = None
    #: FP8 with current (per-tensor, just-in-time) scaling: each cast first reads its tensor for the
    #: amax (Transformer Engine's ``Float8CurrentScaling``, Megatron-LM's ``--fp8-recipe tensorwise``)
    fp8_current_scaling: bool = False
    #: torchao's Float8 training as torchtitan runs it (its Float8 converter): priced only with the
    #: torchtitan runtimes (:func:`~parplan.solver.strategy.check_precision_runtime`)
    torchao: bool = False
    #: FSDP2 gathers the Float8 linear layers' weights in float8 (torchao's
    #: ``enable_fsdp_float8_all_gather``): one byte per element gathered, held and sent; with
    #: Transformer Engine (Megatron-LM's ``--fp8-param-gather``, priced with runtime megatron only) the
    #: weights are FP8 only and the data-parallel gather sends one byte (:data:`FP8_PARAM_BYTES` held)
    fp8_weight_gather: bool = False
    #: the optimizer is Transformer Engine's ``FusedAdam`` keeping its states in less than fp32
    #: (:func:`te_fused_adam`): the fp32 master as the bf16 weight plus its 16-bit remainder
    #: (``store_param_remainders``), and/or Adam's moments in bf16; the precision it is made from is
    #: ``adam_base``. Priced with runtimes megatron and torch only
    #: (:func:`~parplan.solver.strategy.check_precision_runtime`)
    param_remainders: bool = False
    bf16_moments: bool = False
    adam_base: str = ""

    @property
    def te_adam(self) -> bool:
        """Whether the optimizer states are Transformer Engine ``FusedAdam``'s low-precision ones."""
        return self.param_remainders or self.bf16_moments

    @property
    def update_bytes(self) -> int:
        """Bytes per element of the arithmetic of Adam's update: the master's type; Transformer Engine's
        ``FusedAdam`` kernels rebuild the fp32 master from the bf16 weight and its remainder and compute
        in fp32 whatever the stored states (``multi_tensor_adam_param_remainder``)."""
        return FP32_BYTES if self.te_adam else self.master_bytes

    @property
    def te_fp8(self) -> bool:
        """Transformer Engine's FP8 (not torchao's): its GEMMs save their inputs in FP8 under runtime
        megatron (:data:`~parplan.solver.cost.activations.TE_FP8_SAVED_INPUT_BYTES`)."""
        return self.matmul_dtype == "fp8" and not self.torchao

    @property
    def optimizer_state_bytes(self) -> int:
        """Bytes per parameter the optimizer holds (master weights + moments)."""
        return self.master_bytes + self.optimizer_bytes

    @property
    def weight_transfer_bytes(self) -> int:
        """Bytes per weight element that data-parallel gathers and weight re-layouts move: the
        weight in its own type. The FP8 copies are cast on each rank from the gathered weight
        (Megatron-LM's distributed optimizer gathers the bf16 weights); torchao keeps no copies. A
        Float8 weight FSDP2 gathers in float8 (``fp8-torchao-fsdp8``) sends :meth:`transfer_bytes`."""
        te_copies = self.matmul_dtype == "fp8" and not self.torchao and not self.fp8_weight_gather
        return self.param_bytes - (FP8_WEIGHT_COPY_BYTES if te_copies else 0)

    def gathered_bytes(self, float8_weight: bool) -> int:
        """Bytes per element a weight FSDP gathers holds unsharded: the compute-type weight (and
        Transformer Engine's FP8 copies made from it), one byte for a Float8 linear layer's weight
        (``float8_weight``, :func:`~parplan.solver.cost.rules.float8_weight`) gathered in float8 by
        torchao; Transformer Engine's gathered Float8Tensor makes its transpose too (:data:`FP8_PARAM_BYTES`)."""
        return FP8_GATHER_BYTES if self.fp8_weight_gather and self.torchao and float8_weight else self.param_bytes

    def transfer_bytes(self, float8_weight: bool) -> int:
        """Bytes per element a data-parallel gather of the weight sends (:attr:`weight_transfer_bytes`,
        one byte for a Float8 linear layer's weight gathered in float8)."""
        return FP8_GATHER_BYTES if self.fp8_weight_gather and float8_weight else self.weight_transfer_bytes

    @property
    def model_state_bytes(self) -> int:
        """Bytes per parameter of weights, gradients and optimizer states together."""
        return self.param_bytes + self.grad_bytes + self.optimizer_state_bytes


#: Bytes of an fp32 element.
FP32_BYTES = 4

#: Bytes per parameter of the fp32 master's low 16 bits Transformer Engine's ``FusedAdam`` keeps under
#: ``store_param_remainders`` with bf16 weights: ``_initialize_state`` makes the master
#: ``torch.zeros_like(param, dtype=torch.int16)``; the bf16 weight is the master's high half.
TE_REMAINDER_BYTES = 2

#: Bytes per element of each Adam moment ``FusedAdam`` keeps in bf16 (``exp_avg_dtype`` /
#: ``exp_avg_sq_dtype`` ``torch.bfloat16``).
BF16_MOMENT_BYTES = 2


#: Bytes per weight element of the FP8 copies Transformer Engine keeps beside the bf16 weight under
#: Megatron-LM's FP8 recipe (``--fp8-format hybrid``, delayed scaling, the cast weights cached across
#: micro-batches): the weight quantised row-wise for the forward GEMM and column-wise (its transpose,
#: on Hopper) for the input-gradient GEMM, one byte each (TE's "Handling transposes" in
#: features/low_precision_training/performance_considerations; TE PR 1596: "Weight with column-wise
#: usage is needed for dgrad GEMM").
FP8_WEIGHT_COPY_BYTES = 2

#: Bytes per element of a weight gathered in float8 (torchao's ``WeightWithDynamicFloat8CastTensor``:
#: ``fsdp_pre_all_gather`` casts the local shard to float8 and all-gathers its ``_data``; the one fp32
#: scale per tensor travels as metadata and is not counted), torchao/float8/fsdp_utils.py.
FP8_GATHER_BYTES = 1

#: Bytes per element of a weight under Megatron-LM's ``--fp8-param-gather``: the FP8 GEMMs' weights
#: are Transformer Engine Float8Tensors only (``fp8_model_init``, megatron/core/fp8_utils.py), one byte
#: of row-wise data in the DDP buffer (``param_and_grad_buffer.py`` makes it ``torch.uint8``) and one of
#: its column-wise transpose (Hopper's ``_create_transpose`` after each gather, TE's
#: tensor/float8_tensor.py), no bf16 copy; the other weights (embeddings, output layer, norms) stay bf16,
#: 2 bytes too. The fp32 master weights are the distributed optimizer's as in ``fp8``.
FP8_PARAM_BYTES = 2

#: ``bf16`` is Megatron-LM's default: bf16 weights and activations, fp32 gradient accumulation,
#: fp32 master weights and Adam moments (18 bytes/parameter). ``*-grad16`` keeps 16-bit gradients
#: (the ZeRO paper's 16 bytes/parameter). ``fp32`` trains in single precision (16 bytes/parameter).
#: ``fp8`` is Megatron-LM with Transformer Engine's FP8 recipe: bf16's states plus the FP8 weight
#: copies (20 bytes/parameter), the matmuls with a weight at the GPU's FP8 peak, except those over the
#: vocabulary (Megatron-LM keeps the embedding and output layer in bf16), the attention core in bf16
#: (TE's FP8 attention is off by default). An upper bound where the recipe keeps less: the copies are
#: counted for every parameter (embeddings, norms and biases have none). Under runtime megatron the
#: FP8 GEMMs save their inputs in FP8, one byte an element
#: (:data:`~parplan.solver.cost.activations.TE_FP8_SAVED_INPUT_BYTES`); other runtimes count them as
#: in bf16 (an upper bound). The per-tensor scaling state (scale,
#: inverse scale and an amax history of at most 1,024 fp32 values per GEMM operand: about 20 KB per
#: linear layer) is far below the copies' over-count and not counted. ``fp8-cs`` is the same with
#: current scaling (Megatron-LM's ``--fp8-recipe tensorwise``, the "FP8-CS" of NVIDIA's recipes): the
#: same bytes, each cast reading its tensor once more for the amax (time only). ``fp8-grad16`` and
#: ``fp8-cs-grad16`` are those with 16-bit gradients (Megatron-LM's ``--grad-reduce-in-bf16``, as
#: ``bf16-grad16``: 18 bytes/parameter). ``fp8-pg``, ``fp8-cs-pg``, ``fp8-pg-grad16`` and
#: ``fp8-cs-pg-grad16`` add Megatron-LM's ``--fp8-param-gather`` (runtime megatron only): the weights
#: held as FP8 only (:data:`FP8_PARAM_BYTES`: 18 or 16 bytes/parameter), the FP8 ones gathered in one
#: byte (:data:`FP8_GATHER_BYTES`). ``bf16-states16``
#: keeps every model state in bf16: weights, gradients, the master copy and Adam's two moments
#: (10 bytes/parameter), DeepSpeed's ``bf16.bf16_master_weights_and_grads`` with
#: ``bf16.bf16_optimizer_states``: ZeRO's master partition is made in ``master_weights_and_grads_dtype``
#: (``deepspeed/runtime/zero/stage_1_and_2.py``: ``weights_partition = ....clone().to(dtype=
#: self.master_weights_and_grads_dtype)``), the gradient partition handed to the optimizer is cast to
#: it, and the moments are made like the master partition (``zeros_like``), so in bf16. Under ZeRO-3
#: DeepSpeed reuses the bf16 weight partition as the master when the types match
#: (``stage3.py``'s ``_create_fp32_partitions``): the master's 2 bytes/parameter counted there are an
#: upper bound.
#: ``fp8-torchao`` is torchao's Float8 training as torchtitan runs it (its Float8 converter, the
#: tensorwise recipe: dynamic per-tensor scaling, torchao/float8/float8_linear.py): bf16's bytes
#: throughout, the matmuls with a weight at the GPU's FP8 peak but those over the vocabulary (the
#: output layer: torchtitan's configs filter it, ``filter_fqns = ["output"]``), at the GEMM speed of
#: ``fp8-cs`` (cuBLAS's tensorwise-scaled FP8 GEMM, the scale computed from the tensor just before the
#: cast, as Transformer Engine's current scaling); the casts are torchao's own, more than Transformer
#: Engine's (:func:`~parplan.solver.cost.rules._torchao_cast_seconds`). torchao keeps no FP8 copy of
#: a weight between micro-batches (each GEMM casts the weight anew), and
#: ``matmul_with_hp_or_float8_args.forward`` saves the high-precision input and weight for backward
#: (``ctx.save_for_backward(input_hp, weight_hp_t)``), so the saved activations are bf16's. The casts
#: each GEMM makes (input, weight, output gradient: one byte an element, freed when the layer's
#: forward or backward returns) are not counted in memory. ``fp8-torchao-fsdp8`` adds torchtitan's
#: ``enable_fsdp_float8_all_gather`` (with ``precompute_float8_dynamic_scale_for_fsdp``): FSDP2
#: casts each Float8 linear weight's shard to float8 before the all-gather, which sends and holds one
#: byte per element (:data:`FP8_GATHER_BYTES`); the gathered float8 weight is the GEMM's operand and
#: what backward keeps. ``fp8-torchao-rowwise`` is the rowwise recipe (torchtitan 0.3.0's default,
#: axiswise scales, every collective in bf16): the same bytes as ``fp8-torchao``, priced at the same
#: FP8 GEMM speed (an optimistic time: rowwise GEMMs run CUTLASS kernels slower than cuBLAS's tensorwise).
BASE_PRECISIONS: Mapping[str, Precision] = MappingProxyType({
    "bf16": Precision("bf16", 2, 4, 4, 8, 2, "bf16"),
    "bf16-grad16": Precision("bf16-grad16", 2, 2, 4, 8, 2, "bf16"),
    "fp16": Precision("fp16", 2, 4, 4, 8, 2, "fp16"),
    "fp16-grad16": Precision("fp16-grad16", 2, 2, 4, 8, 2, "fp16"),
    "bf16-states16": Precision("bf16-states16", 2, 2, 2, 4, 2, "bf16"),
    "fp32": Precision("fp32", 4, 4, 0, 8, 4, "fp32"),
    "fp8": Precision("fp8", 2 + FP8_WEIGHT_COPY_BYTES, 4, 4, 8, 2, "bf16", matmul_dtype="fp8"),
    "fp8-cs": Precision("fp8-cs", 2 + FP8_WEIGHT_COPY_BYTES, 4, 4, 8, 2, "bf16", matmul_dtype="fp8",
                        fp8_current_scaling=True),
    "fp8-grad16": Precision("fp8-grad16", 2 + FP8_WEIGHT_COPY_BYTES, 2, 4, 8, 2, "bf16", matmul_dtype="fp8"),
    "fp8-cs-grad16": Precision("fp8-cs-grad16", 2 + FP8_WEIGHT_COPY_BYTES, 2, 4, 8, 2, "bf16", matmul_dtype="fp8",
                               fp8_current_scaling=True),
    "fp8-pg": Precision("fp8-pg", FP8_PARAM_BYTES, 4, 4, 8, 2, "bf16", matmul_dtype="fp8", fp8_weight_gather=True),
    "fp8-cs-pg": Precision("fp8-cs-pg", FP8_PARAM_BYTES, 4, 4, 8, 2, "bf16", matmul_dtype="fp8",
                           fp8_current_scaling=True, fp8_weight_gather=True),
    "fp8-pg-grad16": Precision("fp8-pg-grad16", FP8_PARAM_BYTES, 2, 4, 8, 2, "bf16", matmul_dtype="fp8",
                               fp8_weight_gather=True),
    "fp8-cs-pg-grad16": Precision("fp8-cs-pg-grad16", FP8_PARAM_BYTES, 2, 4, 8, 2, "bf16", matmul_dtype="fp8",
                                  fp8_current_scaling=True, fp8_weight_gather=True),
    "fp8-torchao": Precision("fp8-torchao", 2, 4, 4, 8, 2, "bf16", matmul_dtype="fp8", fp8_current_scaling=True,
                             torchao=True),
    "fp8-torchao-fsdp8": Precision("fp8-torchao-fsdp8", 2, 4, 4, 8, 2, "bf16", matmul_dtype="fp8",
                                   fp8_current_scaling=True, torchao=True, fp8_weight_gather=True),
    "fp8-torchao-rowwise": Precision("fp8-torchao-rowwise", 2, 4, 4, 8, 2, "bf16", matmul_dtype="fp8",
                                     fp8_current_scaling=True, torchao=True),
})


#: The precisions whose optimizer can be Transformer Engine's ``FusedAdam`` with its states in less than
#: fp32 (:func:`te_fused_adam`): bf16 weights (bf16, and Transformer Engine's delayed-scaling FP8, whose
#: weights stay bf16 beside their FP8 copies) with an fp32 master, fp32 or bf16 gradients.
TE_ADAM_BASES = ("bf16", "bf16-grad16", "fp8", "fp8-grad16")


def te_fused_adam(base: Precision, remainders: bool, bf16_moments: bool) -> Precision:
    """``base`` with Transformer Engine's ``FusedAdam(master_weights=True, store_param_remainders=remainders,
    exp_avg_dtype=exp_avg_sq_dtype=bf16 if bf16_moments)`` as its optimizer
    (``transformer_engine/pytorch/optimizers/fused_adam.py``, ``_initialize_state``). With
    ``store_param_remainders`` and bf16 weights the master is the int16 of the fp32 master's low 16 bits
    (:data:`TE_REMAINDER_BYTES`; ``store_param_remainders`` applies only with an fp32 master and bf16
    weights). Moments in bf16 are :data:`BF16_MOMENT_BYTES` each; both in bf16, the kernel unscales them
    in place (``fuse_unscale``), where a single bf16 or an fp16/fp8 state is unscaled into an fp32 copy of
    the whole group at each step (not modelled, so not offered). Suffixes ``-remainders`` and
    ``-moments-bf16``."""
    if base.compute_dtype != "bf16" or base.master_bytes != FP32_BYTES or base.fp8_weight_gather or base.torchao \
            or base.te_adam:
        raise ConfigError(f"precision {base.name}: Transformer Engine FusedAdam's stored remainders and bf16 "
                          f"moments are priced on {', '.join(TE_ADAM_BASES)}")
    name = base.name + ("-remainders" if remainders else "") + ("-moments-bf16" if bf16_moments else "")
    return dataclasses.replace(base, name=name, master_bytes=TE_REMAINDER_BYTES if remainders else base.master_bytes,
                               optimizer_bytes=2 * BF16_MOMENT_BYTES if bf16_moments else base.optimizer_bytes,
                               param_remainders=remainders, bf16_moments=bf16_moments, adam_base=base.name)


#: Every precision: :data:`BASE_PRECISIONS` and their Transformer Engine FusedAdam variants
#: (:data:`TE_ADAM_BASES`, :func:`te_fused_adam`).
PRECISIONS: Mapping[str, Precision] = MappingProxyType({
    **BASE_PRECISIONS,
    **{p.name: p for p in (te_fused_adam(BASE_PRECISIONS[b], rem, mom) for b in TE_ADAM_BASES
                           for rem, mom in ((True, False), (False, True), (True, True)))},
})


def get_precision(name: str) -> Precision:
    try:
        return PRECISIONS[name.lower()]
    except KeyError:
        raise ConfigError(f"unknown precision {name!r}; known: {', '.join(PRECISIONS)}") from None
