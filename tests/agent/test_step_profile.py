"""A profiled step, sorted by phase and kernel category (parplan/agent/step_profile.py), as the
GPU checks' ``breakdown`` part records it and bench/step_breakdown.py compares it with the model.

The kernel names are those PyTorch's CUDA builds and cuBLAS/cuDNN launch (as profiler traces of
H100 and A100 training steps print them); the profiled steps run here on the CPU, where the timed
things are ATen operators."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from parplan.agent.model import build_model
from parplan.agent.step_profile import MixedPrecisionStep, busy_seconds, kernel_category, profile_run
from parplan.solver.cost.breakdown import CATEGORIES, PHASES
from parplan.solver.frontends.presets import get_preset

BENCH = os.path.join(os.path.dirname(__file__), "..", "..", "bench")

KERNELS = {
    "nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_"
    "kernel__5x_cublas": "gemm",
    "ampere_bf16_s16816gemm_bf16_128x256_ldg8_f2f_stages_64x3_tn": "gemm",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)": "gemm",
    "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false>(...)": "gemm",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
    "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true>(...)": "attention",
    "void pytorch_flash::flash_bwd_dot_do_o_kernel<true, Flash_bwd_kernel_traits<128, 64, 128, 8> >(...)": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0": "attention",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(...)": "norm",
    "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel_32x32<c10::BFloat16, float>(...)": "norm",
    "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<c10::BFloat16>(...)": "norm",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, c10::BFloat16, float, float, "
    "at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(...)": "loss",
    "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, long>(...)": "loss",
    "void at::native::(anonymous namespace)::indexSelectLargeIndex<c10::BFloat16, long, unsigned int, 2, 2, -2, "
    "true>(...)": "embedding",
    "void at::native::(anonymous namespace)::krn_partials_per_segment<long>(long*, long const*, long, long)":
        "embedding",
    "void at::native::(anonymous namespace)::compute_grad_weight<c10::BFloat16, float, long>(...)": "embedding",
    "void at_cuda_detail::cub::DeviceRadixSortOnesweepKernel<...>(...)": "embedding",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
    "TensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4> >(...)": "optimizer",
    "Memcpy DtoD (Device -> Device)": "copy",
    "Memset (Device)": "copy",
    "void at::native::vectorized_elementwise_kernel<4, at::native::bfloat16_copy_kernel_cuda(...)>(...)": "copy",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, ...>(...)": "copy",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy_aligned16_contig<...>(...)": "copy",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(...)::{lambda}>(...)":
        "elementwise",
    "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int>(...)":
        "elementwise",
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, ...>(...)":
        "elementwise",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
    "at::native::sum_functor<float, float, float>::operator()> >(...)": "other",
    # the same on the CPU, where the profiled things are ATen operators
    "aten::mm": "gemm", "aten::addmm": "gemm", "aten::bmm": "gemm",
    "aten::_scaled_dot_product_flash_attention_for_cpu_backward": "attention",
    "aten::native_layer_norm": "norm", "aten::_fused_rms_norm": "norm", "aten::_log_softmax": "loss",
    "aten::nll_loss_forward": "loss", "aten::embedding_dense_backward": "embedding", "aten::index_select": "embedding",
    "aten::copy_": "copy", "aten::native_dropout": "elementwise", "aten::gelu_backward": "elementwise",
    "aten::add_": "elementwise", "aten::sum": "other",
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel_category(name: str) -> None:
    assert kernel_category(name) == KERNELS[name]


def test_busy_seconds_is_the_union_of_the_spans() -> None:
    assert busy_seconds([]) == 0
    assert busy_seconds([(3.0, 4.0), (0.0, 1.0), (0.5, 2.0)]) == pytest.approx(3.0)
    assert busy_seconds([(0.0, 10.0), (1.0, 2.0), (2.0, 3.0)]) == pytest.approx(10.0)  # nested
    assert busy_seconds([(0.0, 1.0), (1.0, 2.0)]) == pytest.approx(2.0)  # touching


def _tiny(family: str):  # type: ignore[no-untyped-def]
    if family == "gpt":
        return get_preset("gpt-1.7b").with_(name="gpt-tiny", layers=3, hidden=64, heads=4, ffn=256, vocab=256,
                                            seq_len=64)
    return get_preset("llama-2-70b").with_(name="llama-tiny", layers=3, hidden=64, heads=4, kv_heads=2, ffn=128,
                                           vocab=256, seq_len=64)


def _count(run: dict, phase: str, name: str) -> int:  # type: ignore[type-arg]
    return sum(k["count"] for k in run["top_kernels"] if k["phase"] == phase and k["name"] == name)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_profiled_step_on_the_cpu_sorts_each_phase(recompute: str) -> None:
    """Llama (no dropout, so the CPU runs SDPA's fused kernel): every phase is timed, its operators
    lie inside it, and a fully recomputed step reruns each block's attention core once in backward
    (none does not), which places each operator in its phase."""
    cfg = _tiny("llama")
    run = profile_run(cfg, 2, recompute, device="cpu", dtype=torch.float32, warmup=1, timed_steps=2,
                      profiled_steps=1)
    assert run["step_seconds"]["median"] > 0
    assert run["attention_kernel"] == "_scaled_dot_product_flash_attention_for_cpu"
    for phase in PHASES:
        got = run["phases"][phase]
        assert set(got["categories"]) == set(CATEGORIES)
        assert 0 < got["busy_seconds"] <= got["window_seconds"]
        assert sum(got["categories"].values()) == pytest.approx(got["busy_seconds"])
    fwd, bwd, opt = (run["phases"][p]["categories"] for p in PHASES)
    for cats in (fwd, bwd):
        assert cats["gemm"] > 0 and cats["attention"] > 0 and cats["optimizer"] == 0
    assert fwd["norm"] > 0 and fwd["loss"] > 0 and fwd["embedding"] > 0
    assert opt["optimizer"] > 0 and sum(v for k, v in opt.items() if k != "optimizer") == 0
    core = "aten::_scaled_dot_product_flash_attention_for_cpu"
    assert _count(run, "forward", core) == cfg.layers
    assert _count(run, "backward", core) == (cfg.layers if recompute == "full" else 0)


def test_bf16_step_keeps_fp32_masters_and_the_bench_table_reads_it(tmp_path: Path) -> None:
    """A bf16 step (GPT, with dropout) runs with fp32 master weights; bench/step_breakdown.py sets
    the part's file beside the model's prediction, a row per phase and category."""
    cfg = _tiny("gpt")
    model = build_model(cfg).to(dtype=torch.bfloat16)
    tokens = torch.randint(0, cfg.vocab, (2, cfg.seq_len))
    step = MixedPrecisionStep(model, tokens, tokens)
    assert {m.dtype for m in step.masters} == {torch.float32} and {p.dtype for p in step.params} == {torch.bfloat16}
    before = [m.detach().clone() for m in step.masters]
    for fn in step.phases().values():
        fn()
    assert all(not torch.equal(m, b) for m, b in zip(step.masters, before, strict=True))  # Adam moved every master
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(step.params, step.masters, strict=True))
    run = profile_run(cfg, 2, "none", device="cpu", dtype=torch.bfloat16, warmup=1, timed_steps=1, profiled_steps=1)
    assert run["dtype"] == "bfloat16"
    doc = {"part": "breakdown", "result": [{"label": "gpt-tiny/mb2/none", "ok": True, "gpu": "H100-80GB",
                                            "model": asdict(cfg), **run},
                                           {"label": "broken", "ok": False, "error": "OutOfMemoryError"}]}
    path = tmp_path / "breakdown.json"
    path.write_text(json.dumps(doc, default=str))
    sys.path.insert(0, BENCH)
    try:
        import step_breakdown as bench
    finally:
        sys.path.remove(BENCH)
    lines = bench.table(json.loads(path.read_text())["result"][0], "H100-80GB")
    assert "predicted on H100-80GB" in lines[0]
    for phase in PHASES:
        assert any(line.startswith(f"| {phase} | **kernels running** |") for line in lines)
        assert any(line.startswith(f"| {phase} | idle between kernels |") for line in lines)
    assert any(line.startswith("| forward | gemm |") for line in lines)
    bench.main([str(path)])


def _event(name: str, device: str, start: float, end: float, id: int = 0, linked: int = 0):  # type: ignore[no-untyped-def]
    from types import SimpleNamespace

    from torch.profiler import DeviceType

    return SimpleNamespace(name=name, device_type=DeviceType.CUDA if device == "cuda" else DeviceType.CPU,
                           time_range=SimpleNamespace(start=start, end=end), id=id, linked_correlation_id=linked,
                           is_user_annotation=False, self_cpu_time_total=end - start)


def test_device_kernels_go_to_the_phase_they_start_in() -> None:
    """The CUDA path on a hand-made timeline (µs), shaped as torch.profiler reports one: the phases'
    host ranges and their mirrors on the device's timeline (which are no kernels), kernels linked to
    the operators that launched them, two overlapping kernels (counted once in the busy time), and a
    kernel that ends a little after its phase's host range (the clocks of host and device differ)."""
    from parplan.agent.step_profile import PHASE_LABEL, summarize

    events = [
        _event(PHASE_LABEL + "forward", "cpu", 0, 100), _event(PHASE_LABEL + "forward", "cuda", 5, 99),
        _event(PHASE_LABEL + "backward", "cpu", 100, 300), _event(PHASE_LABEL + "optimizer", "cpu", 300, 350),
        _event("Optimizer.step#Adam.step", "cpu", 301, 349), _event("Optimizer.step#Adam.step", "cuda", 302, 348),
        _event("aten::mm", "cpu", 1, 4, id=7), _event("aten::native_layer_norm", "cpu", 30, 32, id=8),
        _event("nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT", "cuda", 10, 40, linked=7),
        _event("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "cuda", 40, 60,
               linked=8),
        _event("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>", "cuda", 110, 200),
        _event("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>", "cuda", 150,
               250),
        _event("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", "cuda", 290, 302),
        _event("multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor>", "cuda", 305, 345),
    ]
    out = summarize(events, "cuda", steps=1)
    fwd, bwd, opt = (out["phases"][p] for p in PHASES)
    assert fwd["window_seconds"] == pytest.approx(100e-6) and fwd["busy_seconds"] == pytest.approx(50e-6)
    assert fwd["categories"]["gemm"] == pytest.approx(30e-6) and fwd["categories"]["norm"] == pytest.approx(20e-6)
    assert bwd["busy_seconds"] == pytest.approx(152e-6)  # 110-250 and 290-302, the overlap once
    assert bwd["categories"]["attention"] == pytest.approx(90e-6)
    assert bwd["categories"]["elementwise"] == pytest.approx(100e-6)
    assert bwd["categories"]["gemm"] == pytest.approx(12e-6)
    assert opt["kernels"] == 1 and opt["categories"]["optimizer"] == pytest.approx(40e-6)
    assert sum(opt["categories"].values()) == pytest.approx(40e-6)  # the mirrored annotation is no kernel
    launched = {k["name"]: k["launched_by"] for k in out["top_kernels"]}
    assert launched["nvjet_tst_128x256_64x4_2x1_v_bz_coopB_TNT"] == "aten::mm"
    assert out["top_kernels"][0]["category"] == "elementwise"  # the longest first
