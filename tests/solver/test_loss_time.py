"""The cross entropy's time is the HBM traffic of the kernels each runtime's loss runs, in fp32.

The oracle is each loss's kernels written out from its code, one line a kernel (bytes moved per
logit element), priced at the HBM peak times the fraction its kind reaches: Megatron-LM's
``VocabParallelCrossEntropy`` (elementwise and row-reduction kernels) and PyTorch's
``cross_entropy`` on logits cast to fp32 (``log_softmax`` and its backward are softmax kernels):
52 bytes a logit (Megatron-LM) and 36 (PyTorch), not the 6 of one 16-bit read forward and two backward."""

from __future__ import annotations

import pytest

from parplan.solver.cluster import GPU_PRESETS
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.breakdown import single_gpu_breakdown
from parplan.solver.cost.runtime import Runtime
from parplan.solver.frontends.presets import get_preset

CFG = get_preset("llama-2-70b").with_(name="llama-vocab", layers=2, hidden=1024, heads=8, kv_heads=8, ffn=2816,
                                      vocab=128256, seq_len=2048)
MB = 2
LOGITS = MB * CFG.seq_len * CFG.vocab


def _megatron(act: int) -> tuple[list[int], list[int]]:
    """Bytes per logit of each kernel (forward, backward) of Megatron-LM's vocabulary-parallel loss."""
    cast = [act + 4] if act != 4 else []  # vocab_parallel_logits.float()
    forward = [*cast,
               4,  # torch.max over the vocabulary (a read)
               8,  # vocab_parallel_logits -= logits_max (in place)
               8,  # torch.exp(..., out=) in place
               4,  # exp_logits.sum(dim=-1)
               8]  # exp_logits.div_(sum_exp_logits)
    backward = [8] + ([4 + act] if act != 4 else [])  # grad_input.mul_(grad_output); the cast's backward
    return forward, backward


def _torch(act: int) -> tuple[list[int], list[int], list[int], list[int]]:
    """Bytes per logit of each kernel of PyTorch's cross_entropy on fp32 logits: (forward elementwise,
    forward softmax kernels, backward elementwise, backward softmax kernels)."""
    cast = [act + 4] if act != 4 else []
    return (cast, [8],  # log_softmax: read the logits, write the log-probabilities
            [4] + ([4 + act] if act != 4 else []),  # nll_loss's zeroed gradient; the cast's backward
            [12])  # log_softmax_backward: read the gradient and the output, write the logits' gradient


@pytest.mark.parametrize(("precision", "act"), [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize("gpu", ["H100-80GB", "A100-80GB"])
def test_megatron_loss_moves_its_kernels_bytes(precision: str, act: int, gpu: str) -> None:
    hbm = GPU_PRESETS[gpu].hbm_bandwidth_bytes_per_s * 0.8  # the default calibration's fraction
    fwd, bwd = _megatron(act)
    b = single_gpu_breakdown(CFG, MB, CFG.seq_len, Recompute.NONE, gpu, Runtime.MEGATRON, precision)
    assert b.phases["forward"]["loss"] == pytest.approx(LOGITS * sum(fwd) / hbm, rel=1e-9)
    assert b.phases["backward"]["loss"] == pytest.approx(LOGITS * sum(bwd) / hbm, rel=1e-9)


@pytest.mark.parametrize(("precision", "act"), [("bf16", 2), ("fp32", 4)])
@pytest.mark.parametrize(("gpu", "softmax"), [("H100-80GB", 0.36), ("A100-80GB", 0.8)])
@pytest.mark.parametrize("runtime", [Runtime.TORCH, Runtime.TORCHTITAN, Runtime.DEEPSPEED])
def test_pytorch_loss_moves_its_kernels_bytes(precision: str, act: int, gpu: str, softmax: float,
                                              runtime: Runtime) -> None:
    """PyTorch's softmax kernels move their bytes at the fraction measured for them on an H100 (0.36;
    the A100 has no measured figure: the calibration's 0.8)."""
    peak = GPU_PRESETS[gpu].hbm_bandwidth_bytes_per_s
    fwd, fwd_softmax, bwd, bwd_softmax = _torch(act)
    b = single_gpu_breakdown(CFG, MB, CFG.seq_len, Recompute.NONE, gpu, runtime, precision)
    assert b.phases["forward"]["loss"] == pytest.approx(
        LOGITS * (sum(fwd) / (0.8 * peak) + sum(fwd_softmax) / (softmax * peak)), rel=1e-9)
    assert b.phases["backward"]["loss"] == pytest.approx(
        LOGITS * (sum(bwd) / (0.8 * peak) + sum(bwd_softmax) / (softmax * peak)), rel=1e-9)
