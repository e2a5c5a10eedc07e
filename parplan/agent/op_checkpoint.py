"""torchtitan's per-operator selective checkpointing policy, for the agent's blocks.

``torchtitan/distributed/activation_checkpoint.py`` (``_apply_op_sac``) wraps each transformer block in
``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts``: the outputs of the operators
on its save list are kept for backward, everything else is recomputed, except that of the matrix
multiplications only the odd ones (1st, 3rd, ... of the block's forward, counted afresh for each
checkpointed call, and apart in its recomputation) are kept. The list holds the matmuls, the CUDA
SDPA kernels, ``aten.max`` (float8's scales) and the reduce-scatter; the CPU flash kernel
(``_scaled_dot_product_flash_attention_for_cpu``) is not on it, so on CPU attention is recomputed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.linear.default})
_SAVED = _MATMULS | {
    torch.ops.aten._scaled_dot_product_efficient_attention.default,
    torch.ops.aten._scaled_dot_product_flash_attention.default,
    torch.ops.aten._scaled_dot_product_cudnn_attention.default,
    torch.ops.aten._scaled_dot_product_attention_math.default,
    torch.ops.aten.max.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
}


def op_checkpoint_context() -> Any:
    """The (forward, recompute) context pair of one checkpointed call of a block
    (``torch.utils.checkpoint.checkpoint(..., context_fn=op_checkpoint_context)``)."""
    counts = {False: 0, True: 0}  # matmuls seen, in forward and in recomputation

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in _MATMULS:
            counts[ctx.is_recompute] += 1
            if counts[ctx.is_recompute] % 2 == 0:
                return CheckpointPolicy.PREFER_RECOMPUTE
        return CheckpointPolicy.MUST_SAVE if func in _SAVED else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)  # type: ignore[no-untyped-call]
