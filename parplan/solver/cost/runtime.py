"""The training framework a plan runs on, where frameworks keep different buffers.

The cost model follows Megatron-LM by default. PyTorch's own distributed engine (DTensor tensor
and sequence parallelism, FSDP2), which the validation agent runs, keeps some buffers that
Megatron-LM frees or never makes; each rule below was found by the agent's measurements
(``tests/agent/test_agent_matrix.py``) and is applied only for that runtime:

- sequence parallelism: a column-parallel linear saves the all-gathered (full-sequence) input it
  receives, where Megatron-LM saves the sharded one and gathers it again in backward;
- a vocabulary-parallel embedding's backward makes the gradient of the whole table before keeping
  its own rows;
- the loss: PyTorch's ``cross_entropy`` is ``log_softmax`` then ``nll_loss``, whose backward makes
  the log-probabilities' gradient (as large as the logits, fp32) and then the logits' gradient while
  the saved log-probabilities are still alive: three logits-sized buffers at once, where Megatron-
  LM's fused vocabulary-parallel cross entropy reuses its saved softmax as the gradient (the tiny
  models of the matrix, vocabulary 1,024, hid it; a 51,200-word vocabulary measured it), and
  DTensor's loss parallelism one more;
- on GPUs, cuBLAS's workspaces (two, one per thread that runs matmuls: 64 MiB on an H100) are
  held through PyTorch's allocator for the whole run (temporary); Megatron-LM holds them too, and
  Transformer Engine's own beside them (:attr:`Runtime.library_workspace_bytes`);
- grouped-query attention on GPUs: K and V are repeated to every query head before
  ``scaled_dot_product_attention`` (torchtitan and Hugging Face do so; PyTorch's memory-efficient
  kernel, the one fp32 runs, has no grouped-query support, and the math fallback keeps the scores),
  so the kernel keeps the repeated copies;
- on CPU, RMSNorm is a composite of eager operators that also saves the normalised input ``x·rstd``
  (the CUDA kernel saves ``x`` and ``rstd`` only);
- plain data parallelism of tensor-parallel modules: DDP rejects DTensor parameters, so PyTorch
  replicates them with ``replicate`` (FSDP2's machinery over a shard group of one), which keeps an
  unsharded copy of every parameter from its forward until its backward;
- ZeRO-2 is FSDP2 without resharding after forward: parameters are sharded between steps (Megatron
  and DeepSpeed keep them whole), and each unit's gathered weights stay from its forward until its
  backward ends;
- DDP (plain data parallelism, and under ZeroRedundancyOptimizer) rebuilds its gradient buckets
  once, in the second step: for a moment, before any activation, the gradients are held twice
  (not under ``torch.distributed.pipelining``, which drives DDP's synchronisation itself);
- gradient accumulation under FSDP2 (and ``replicate``) skips gradient synchronisation until the
  last micro-batch, so every gathering unit's unsharded gradient lives from the first
  micro-batch's backward to the last's; under ``torch.distributed.pipelining`` its
  ``backward_maybe_with_nosync`` also turns resharding after backward off for every backward of a
  stage but its last, and torchtitan does not reshard after forward with pipelining
  (``reshard_after_forward = not pp_enabled``), so a stage's weights stay gathered from its first
  forward to its last backward: under the interleaved schedules each chunk of a device is such a
  stage, and all of them hold theirs while any one runs (:func:`~.timeline.kept_between_microbatches`);
- pipelining: ``torch.distributed.pipelining`` keeps the output a stage sent for each micro-batch
  until that micro-batch's backward (Megatron-LM frees the output's data once it is sent), and
  allocates, before the step, a receive buffer for every micro-batch's input activation and output
  gradient (communication buffers: temporary); a received activation that the stage saves for
  backward stays in its buffer instead of counting again as an activation. Under its 1F1B
  schedule the handle of the first warm-up send lives until the steady phase ends and keeps that
  micro-batch's output alive after its backward: one more output on every stage but the last.

torchtitan's trainer (runtimes ``torchtitan``, ``torchtitan-cpu``) is PyTorch-native with three
differences of its own, measured by running its code on an export (``parplan validate --torchtitan``,
docs/notes/torchtitan-run.md):

- its weights are fp32 and are the optimizer's master copy: FSDP2's mixed precision casts them to
  bf16 only when it gathers them (16 bytes a parameter with Adam, not 18);
- it zeroes gradients with ``set_to_none`` before every step, so a gradient exists only from its
  backward to the optimizer step: none while the first micro-batch's forward runs;
- data parallelism without sharding is FSDP2's ``replicate`` (never DDP), and its attention
  (FlexAttention) does not repeat K and V for grouped-query attention;
- gradient accumulation without pipelining reduces every micro-batch's gradients (its trainer
  never turns FSDP2's gradient synchronisation off), so no unsharded gradient outlives its unit's
  backward (pipelining's schedule does turn it off until the last micro-batch);
- its recipes' loss is ``ChunkedLossWrapper``: the output layer and the cross entropy run inside
  forward on :data:`TORCHTITAN_LOSS_CHUNKS` sequence chunks, each chunk's backward at once, so no
  logits are kept for backward; the loop's own buffers are priced by :mod:`.loss_loop`. Runtime
  ``torchtitan-unchunked-loss`` is its trainer with the loss its ``train.py`` ran unwrapped (PyTorch's
  ``cross_entropy`` on the fp32 logits of the whole sequence, priced as the runtime ``torch`` prices it).

nanotron's trainer (runtime ``nanotron``) keeps Megatron-LM's activations and loss (but for its
unfused SwiGLU, :attr:`Runtime.fuses_gated_activation`) with its own gradient buffers: an fp32
accumulation buffer never sharded, DDP's buckets beside it, and compute-type gradients made anew by
every micro-batch; its rules and their sources are listed in
:mod:`parplan.solver.cost.nanotron`. Runtime ``nanotron-cpu`` is the same with PyTorch's CPU kernels
(the validation agent's ``nanotron`` runs on gloo, ``parplan/agent/nanotron_exec.py``): nanotron
cannot run on a CPU, so the agent keeps its buffers around its own Llama, whose RMSNorm is PyTorch's
CPU composite, and no CUDA library holds a workspace.

On a CPU, PyTorch's RMSNorm is a composite that computes in fp32: with bf16 inputs it keeps an fp32
copy of its input and the fp32 normalised input for backward (measured on torchtitan's debug model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum

from parplan.solver.cost.precision import Precision


@dataclass(frozen=True)
class DataParallelBuffers:
    """What a unit's data parallelism holds during a step besides the resident model states.

    ``gathers``: the unit computes with an unsharded copy of its weights (FSDP, ``replicate``), and
    its gradients are made unsharded and reduced when its backward ends, into ``reduce_buffers``
    gradient-sized buffers that stay until the next unit's backward ends. ``kept_from_forward``:
    that copy lives from the unit's forward until its backward ends (else it is gathered again
    for backward, the next unit's prefetched alongside). ``gather_buffer``: the all-gather's own
    output buffer of the last unit gathered in forward stays until the forward ends (FSDP2 frees
    each forward all-gather's output only at the next one, or at the end of the root's forward).
    Without ``gathers`` gradients accumulate in place in a resident buffer (DDP's buckets,
    Megatron-LM's main gradients)."""

    shards_parameters: bool = False  # parameters sharded over the data-parallel ranks between steps
    gathers: bool = False
    kept_from_forward: bool = False
    reduce_buffers: int = 0
    gather_buffer: bool = False
    #: DDP rebuilds its gradient buckets once, in the second step's forward: the new buckets are made
    #: while the old ones (the gradients) still live, a second copy of the gradients for a moment
    rebuilds_buckets: bool = False
    #: DDP without ``gradient_as_bucket_view`` beside a separate gradient buffer (nanotron): its buckets, a
    #: copy of every gradient in the compute type, are resident besides the gradients the optimizer reads
    #: (:meth:`Runtime.states_precision`)
    bucket_copy: bool = False


#: Sequence chunks of torchtitan's ``ChunkedLossWrapper`` (its default ``num_chunks`` in 0.3.0, which
#: parplan's exports leave as it is).
TORCHTITAN_LOSS_CHUNKS = 8

#: cuBLAS's workspace per handle with PyTorch's default configuration on Hopper GPUs (4096 KiB x 8;
#: 4096 KiB x 2 + 16 KiB x 8 on earlier ones, which this bounds), bytes.
CUBLAS_WORKSPACE_BYTES = 32 * 2**20

#: Transformer Engine's own cuBLAS workspace, one for its GEMMs, on Hopper and later GPUs
#: (``transformer_engine/pytorch/module/base.py``: ``get_workspace``, ``get_cublas_workspace_size_bytes``;
#: 4 MiB on earlier ones, which this bounds), bytes.
TE_WORKSPACE_BYTES = 32 * 2**20

IN_PLACE = DataParallelBuffers()
DDP = DataParallelBuffers(rebuilds_buckets=True)
#: nanotron's data parallelism: PyTorch's DDP (default bucket views) whose communication hook adds
#: each bucket into the fp32 accumulation buffer (``nanotron/optim/gradient_accumulator.py``,
#: ``get_fp32_accum_hook``). Its bucket rebuild in the second step holds less than the end of any
#: backward (where every compute-type gradient is alive, :attr:`Runtime.grads_each_microbatch`), so it is
#: not a moment of its own.
NANOTRON_DDP = DataParallelBuffers(bucket_copy=True)
FSDP = DataParallelBuffers(shards_parameters=True, gathers=True, reduce_buffers=1, gather_buffer=True)


#: Elements of each DeepSpeed bucket parplan's DeepSpeed exports set (``reduce_bucket_size``,
#: ``allgather_bucket_size``, ``stage3_prefetch_bucket_size``, ``stage3_max_live_parameters``,
#: ``stage3_max_reuse_distance``): DeepSpeed's own prefetch default, a tenth of its reduce default.
DEEPSPEED_BUCKET_ELEMENTS = 50_000_000
#: Bytes the ``deepspeed`` runtime holds for those buckets for the whole step, an upper bound (not a
#: measurement): one reduce bucket and one gather bucket of that many fp32 elements.
DEEPSPEED_BUCKET_BYTES = 2 * DEEPSPEED_BUCKET_ELEMENTS * 4


class Runtime(StrEnum):
    """Which framework's buffers the memory model counts."""

    MEGATRON = "megatron"
    TORCH = "torch"  # PyTorch-native (DTensor TP/SP, FSDP2), CUDA kernels
    TORCH_CPU = "torch-cpu"  # the same with CPU kernels (the agent's gloo runs)
    #: the agent's per-operator plan interpreter (``parplan/agent/plan_interpreter.py``) on CPU kernels:
    #: torch-cpu's rules, but its RMSNorm keeps ``x`` and ``rstd``, as fused GPU kernels do, and a
    #: vocabulary-split embedding makes the gradient of its own rows only
    INTERPRETER_CPU = "interpreter-cpu"
    #: DeepSpeed's engine (data parallelism, ZeRO 0-3) on the user's PyTorch model: Megatron-LM's
    #: data-parallel buffers (whole parameters under ZeRO 1-2, gathered per block under ZeRO-3,
    #: gradients reduced every micro-batch), PyTorch's loss, cuBLAS's workspaces, and its
    #: communication buckets bounded by :data:`DEEPSPEED_BUCKET_BYTES`. No measurement yet.
    DEEPSPEED = "deepspeed"
    #: torchtitan's trainer on GPUs: the torch runtime's buffers with torchtitan's own step (module
    #: docstring)
    TORCHTITAN = "torchtitan"
    TORCHTITAN_CPU = "torchtitan-cpu"  # the same with CPU kernels (parplan validate --torchtitan on gloo)
    #: torchtitan's trainer whose loss is not chunked: its train.py's ``loss_fn``,
    #: ``cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))`` on the whole sequence, the
    #: step's backward starting from it (PyTorch's loss buffers, :meth:`loss_gradient_buffers`)
    TORCHTITAN_UNCHUNKED_LOSS = "torchtitan-unchunked-loss"
    #: Hugging Face's nanotron trainer on GPUs: Megatron-LM's activations (but an unfused SwiGLU) and loss
    #: (its code follows Megatron-LM's), with its own gradient buffers (:mod:`parplan.solver.cost.nanotron`)
    NANOTRON = "nanotron"
    #: the same with CPU kernels (the validation agent's runs of nanotron's buffers on gloo)
    NANOTRON_CPU = "nanotron-cpu"

    @property
    def _pytorch_native(self) -> bool:
        return self in (Runtime.TORCH, Runtime.TORCH_CPU, Runtime.INTERPRETER_CPU) or self.torchtitan

    @property
    def torchtitan(self) -> bool:
        """Whether the buffers are torchtitan's trainer's (any of its runtimes)."""
        return self in (Runtime.TORCHTITAN, Runtime.TORCHTITAN_CPU, Runtime.TORCHTITAN_UNCHUNKED_LOSS)

    @property
    def nanotron(self) -> bool:
        """Whether the buffers are nanotron's trainer's (:mod:`parplan.solver.cost.nanotron`)."""
        return self in (Runtime.NANOTRON, Runtime.NANOTRON_CPU)

    @property
    def cpu_kernels(self) -> bool:
        """Whether the ranks run PyTorch's CPU kernels."""
        return self in (Runtime.TORCH_CPU, Runtime.INTERPRETER_CPU, Runtime.TORCHTITAN_CPU, Runtime.NANOTRON_CPU)

    @property
    def master_is_parameter(self) -> bool:
        """Whether the resident weights are fp32 and serve as the optimizer's master copy (torchtitan:
        FSDP2 mixed precision casts them to the compute type only when gathering)."""
        return self.torchtitan

    @property
    def keeps_gradients(self) -> bool:
        """Whether gradients stay allocated between steps (zeroed in place: Megatron-LM's buffers,
        DDP's buckets, the agent's executor); torchtitan sets them to None before each step."""
        return not self.torchtitan

    def states_precision(self, prec: Precision, buffers: DataParallelBuffers | None = None) -> Precision:
        """Bytes per parameter of the resident model states under this runtime: with
        :attr:`master_is_parameter`, the master copy is the weight itself; with ``buffers``'
        :attr:`~DataParallelBuffers.bucket_copy`, the gradients add DDP's buckets (compute type)."""
        if buffers is not None and buffers.bucket_copy:
            prec = dataclasses.replace(prec, grad_bytes=prec.grad_bytes + prec.param_bytes)
        if not self.master_is_parameter or not prec.master_bytes:
            return prec
        return dataclasses.replace(prec, param_bytes=prec.master_bytes, master_bytes=0)

    @property
    def grads_each_microbatch(self) -> bool:
        """Whether every micro-batch's backward makes the weights' gradients anew in the compute type
        (autograd's ``param.grad``) and frees them after it, besides the resident accumulation buffer:
        nanotron's ``FP32GradientAccumulator.backward`` adds them into its fp32 buffer and sets them to
        None once ``loss.backward()`` returns, so at the end of each backward all of them are alive."""
        return self.nanotron

    @property
    def saves_gathered_sp_inputs(self) -> bool:
        return self._pytorch_native

    @property
    def materialises_conversions(self) -> bool:
        """Whether converting an operator's input to the layout it reads it in (and its gradient
        back) makes new buffers (:func:`~parplan.solver.cost.resharding.conversion_buffer_bytes`),
        which the ILP's moments count, forward and backward: the agent's per-operator plan
        interpreter converts with DTensor's functional collectives. The other runtimes run uniform
        layouts whose conversions the evaluator prices as they run them (a sequence-parallel gather,
        in-place reductions), and the ILP prices a uniform strategy as the evaluator does."""
        return self is Runtime.INTERPRETER_CPU

    @property
    def full_embedding_gradient(self) -> bool:
        """Whether a vocabulary-split embedding's backward makes the whole table's gradient before
        keeping its own rows (DTensor's embedding does; the plan interpreter's looks up its own rows
        only, so its backward makes their gradient alone)."""
        return self._pytorch_native and self is not Runtime.INTERPRETER_CPU

    @property
    def library_workspace_bytes(self) -> float:
        """Bytes CUDA libraries hold through PyTorch's allocator from their first use to the end:
        cuBLAS's workspace once per handle, i.e. per thread, and a training step uses two (forward
        on the main thread, backward on the autograd engine's device thread). Measured on an H100:
        32 MiB at the first matmul, 32 MiB more at the first backward. None on the CPU. Megatron-LM
        holds them as well (its output layer's matmuls are PyTorch's, forward and backward), and
        Transformer Engine's own for the other GEMMs (:data:`TE_WORKSPACE_BYTES`): Megatron-LM's CI
        golden values (``mem-max-allocated-bytes``) of small models sit about that much above the rest."""
        gpu_torch = (Runtime.TORCH, Runtime.DEEPSPEED, Runtime.TORCHTITAN, Runtime.TORCHTITAN_UNCHUNKED_LOSS,
                     Runtime.NANOTRON)
        if self is Runtime.MEGATRON:
            return 2 * CUBLAS_WORKSPACE_BYTES + TE_WORKSPACE_BYTES
        return 2 * CUBLAS_WORKSPACE_BYTES if self in gpu_torch else 0.0

    @property
    def held_through_step_bytes(self) -> float:
        """Bytes held from the step's start to its end besides the model states (temporaries): the
        libraries' workspaces, and DeepSpeed's communication buckets (:data:`DEEPSPEED_BUCKET_BYTES`)."""
        buckets = DEEPSPEED_BUCKET_BYTES if self is Runtime.DEEPSPEED else 0.0
        return self.library_workspace_bytes + buckets

    @property
    def recomputes_flash_core(self) -> bool:
        """Whether selective recomputation runs a flash attention core's forward again in backward.
        Megatron-Core checkpoints the core attention under ``--recompute-granularity selective``
        whatever kernel runs it (``checkpoint_core_attention``: Transformer Engine's flash and cuDNN
        attention too), and the agent's model checkpoints its attention core the same way
        (``parplan/agent/model.py``). torchtitan's export turns selective into no checkpointing,
        DeepSpeed's engine leaves checkpointing to the user's model, and the agent's per-operator
        interpreter checkpoints no core: with a flash kernel, which keeps no scores, they run none."""
        return self in (Runtime.MEGATRON, Runtime.TORCH, Runtime.TORCH_CPU)

    @property
    def runs_recompute_modules(self) -> bool:
        """Whether the trainer runs Megatron-LM's per-module recomputation (``--recompute-modules``,
        :mod:`~.recompute_modules`): Megatron-LM, and the validation agent's model, which checkpoints
        the same modules the same way (``parplan/agent/module_checkpoint.py``)."""
        return self in (Runtime.MEGATRON, Runtime.TORCH, Runtime.TORCH_CPU)

    @property
    def fuses_norms(self) -> bool:
        """Whether a dense layer's norms are fused into the linear after them, as Megatron-LM's
        Transformer Engine layer spec builds them (``gpt_layer_specs.py``: ``TELayerNormColumnParallelLinear``
        for ``linear_qkv`` and ``linear_fc1``, ``IdentityOp`` norms, which ``TransformerLayer`` does not
        recompute). The agent's model keeps its norms as modules of their own (``nn.LayerNorm``,
        ``nn.RMSNorm``), as Megatron-LM's local spec (``get_gpt_layer_local_spec``) does."""
        return self is Runtime.MEGATRON

    @property
    def selective_recomputation(self) -> bool:
        """Whether the trainer has a recomputation lighter than whole blocks: nanotron has only
        ``recompute_layer`` (a whole decoder layer, parplan's full recomputation)."""
        return not self.nanotron

    @property
    def per_operator_checkpointing(self) -> bool:
        """Whether the trainer checkpoints blocks with PyTorch's per-operator policy
        (``torch.utils.checkpoint.create_selective_checkpoint_contexts``, torchtitan's
        ``selective_ac_option = "op"``): the PyTorch-native runtimes; Megatron-LM, DeepSpeed and nanotron
        have no such option."""
        return self in (Runtime.TORCH, Runtime.TORCH_CPU) or self.torchtitan

    @property
    def fuses_projections(self) -> bool:
        """Whether the runtime's model code runs the projections of one input as one GEMM (a node's
        ``gemm_group``): Megatron-LM's ``linear_qkv`` (q, k and v) and a gated MLP's ``linear_fc1``
        (gate and up). torchtitan's Llama, Hugging Face's models (DeepSpeed's) and the agent's model
        keep them apart (``wq``/``wk``/``wv``, ``w1``/``w3``; ``q_proj``..., ``gate_proj``/``up_proj``)."""
        return self is Runtime.MEGATRON or self.nanotron

    @property
    def fuses_gated_activation(self) -> bool:
        """Whether a SwiGLU MLP runs its activation as one autograd function that keeps only its input,
        ``linear_fc1``'s output (gate and up), and computes ``silu(gate)`` again in backward: Megatron-LM's
        ``bias_swiglu_impl`` (``megatron/core/fusions/fused_bias_swiglu.py``, ``SwiGLUFunction``), which
        ``MLP.forward`` and the experts' ``TEGroupedMLP`` call (``weighted_bias_swiglu_impl``) with
        ``bias_activation_fusion``, on with ``--swiglu`` unless ``--no-bias-swiglu-fusion``. nanotron's
        ``GLUActivation``, torchtitan's and Hugging Face's MLPs run ``silu`` and the product as two
        operators, and the product keeps the SiLU output as well."""
        return self is Runtime.MEGATRON

    @property
    def weights_experts_in_activation(self) -> bool:
        """Whether a mixture of experts multiplies each routed token by its router probability inside
        the expert, after the activation, and gathers the experts' outputs back to their tokens by a
        plain sum: Megatron-LM's ``TEGroupedMLP`` and ``SequentialMLP`` (``megatron/core/transformer/moe/
        experts.py``: ``bias_act_func``, ``MLP.forward``'s ``per_token_scale``) and its token
        dispatchers' ``unpermute`` without probabilities (``moe/token_dispatcher.py``,
        ``moe/moe_utils.py``: ``scatter_add_``/``index_add_``, whose backward reads only the indices).
        The product keeps the activation's output for the probabilities' gradient (the fused SwiGLU,
        ``weighted_bias_swiglu_impl``, keeps only its input); the combine keeps no tokens. torchtitan
        weights the experts' outputs in the combine, which keeps them."""
        return self is Runtime.MEGATRON

    @property
    def repeats_kv_heads(self) -> bool:
        """Whether grouped-query attention repeats K and V to every query head before the kernel
        (torchtitan's Llama and Hugging Face's SDPA path do; the repeated copies are what the
        kernel keeps for backward). The agent's CPU runs use SDPA's own GQA support instead."""
        return self is Runtime.TORCH

    def loss_gradient_buffers(self, classes_sharded: bool) -> int:
        """Logits-sized fp32 buffers the loss's backward makes besides the logits' own gradient, all
        alive at once with the saved probabilities: none for Megatron-LM's fused vocabulary-parallel
        cross entropy (its saved softmax becomes the gradient in place); one for PyTorch's
        ``cross_entropy`` (``log_softmax`` + ``nll_loss``: the log-probabilities' gradient); two
        under DTensor's loss parallelism (``classes_sharded``: a zeroed one-hot and the exponentiated
        log-probabilities, then their sum)."""
        if self is Runtime.MEGATRON or self.nanotron:
            return 0
        return 2 if classes_sharded else 1

    @property
    def rmsnorm_saves_normalized(self) -> bool:
        """CPU RMSNorm (a composite computing in fp32) keeps its input and the normalised input,
        both in fp32 (not the plan interpreter's own RMSNorm: its input and ``rstd``, one value per
        row, which is not counted). nanotron's fused RMSNorm has no CPU kernel: on a CPU its buffers
        are kept around PyTorch's composite."""
        return self in (Runtime.TORCH_CPU, Runtime.TORCHTITAN_CPU, Runtime.NANOTRON_CPU)

    def accumulates_unsharded(self, pipelined: bool) -> bool:
        """Whether gradient accumulation keeps gathering units' gradients unsharded from the first
        micro-batch to the last (the agent's FSDP2, and ``torch.distributed.pipelining`` under
        ``pipelined``, skip the reduce-scatter until the last micro-batch; Megatron-LM reduces into
        sharded buffers every micro-batch, and so does torchtitan's trainer without pipelining)."""
        return self._pytorch_native and (pipelined or not self.torchtitan)

    @property
    def copies_around_collectives(self) -> bool:
        """Whether sharded data parallelism copies on the GPU around its collectives (FSDP2: each
        all-gather's output split into the unsharded weights, ``split_with_sizes_copy``; each
        reduction's unsharded gradients copied into the reduce-scatter's input in the reduce dtype,
        ``chunk_cat``). DDP as the agent runs it (``gradient_as_bucket_view``) reduces the gradients
        in their buckets, and Megatron-LM gathers into and reduces from its contiguous buffers in place;
        the plan interpreter's per-operator gathers are DTensor's (their buffers are the conversion
        buffers of :mod:`~parplan.solver.cost.resharding`); DeepSpeed's copies are not modelled."""
        return self._pytorch_native and self is not Runtime.INTERPRETER_CPU

    def reduces_every_microbatch(self, pipelined: bool) -> bool:
        """Whether gradients are reduced after every micro-batch's backward, not once a step (torchtitan
        without pipelining: its gradient accumulation keeps FSDP2's synchronisation on)."""
        return self.torchtitan and not pipelined

    @property
    def loss_chunks(self) -> int:
        """Sequence chunks the loss runs in inside forward, each chunk's backward at once (torchtitan's
        ``ChunkedLossWrapper``); 0 where the loss keeps its logits for the step's backward."""
        return TORCHTITAN_LOSS_CHUNKS if self in (Runtime.TORCHTITAN, Runtime.TORCHTITAN_CPU) else 0

    @property
    def holds_stage_outputs(self) -> bool:
        return self._pytorch_native

    def data_parallel(self, tp: int, dp: int, zero: int) -> DataParallelBuffers:
        """How data parallelism of degree ``dp`` with ZeRO stage ``zero`` holds weights and
        gradients during a step, for a unit with tensor-parallel degree ``tp``."""
        if dp == 1:
            return IN_PLACE
        if zero >= 3:
            return FSDP
        if self.nanotron:
            return NANOTRON_DDP
        if self.torchtitan and zero == 0:
            # torchtitan replicates with FSDP2 over a shard group of one (data_parallel_replicate_degree)
            return DataParallelBuffers(gathers=True, kept_from_forward=True, reduce_buffers=2)
        if self in (Runtime.MEGATRON, Runtime.DEEPSPEED):
            # ZeRO-1/2: optimizer states and main gradients sharded in place; ZeRO-0: gradients reduced
            # in place (Megatron-LM's buffers, DeepSpeed's engine with its own buckets: no DDP rebuild)
            return IN_PLACE
        if zero == 2:  # FSDP2 without resharding after forward
            return DataParallelBuffers(shards_parameters=True, gathers=True, kept_from_forward=True,
                                       reduce_buffers=1, gather_buffer=True)
        if tp > 1 and zero == 0:
            # replicate: the reduce-scatter over a shard group of one outputs the whole gradient,
            # which is then all-reduced, as long-lived as its input; its "all-gather" over a group
            # of one copies in place (no buffer)
            return DataParallelBuffers(gathers=True, kept_from_forward=True, reduce_buffers=2)
        return DDP if tp == 1 else IN_PLACE
