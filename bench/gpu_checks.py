"""The checks to run whenever an NVIDIA GPU is at hand (issue 12, point 5), in one command.

Parts (``--parts``, comma-separated; each writes ``OUT/<part>.json`` and a failure in one does not
stop the others):

- ``env``: the GPU, driver, torch and CUDA versions;
- ``profile``: the agent's micro-benchmarks (:func:`parplan.agent.microbench.profile`), i.e. the
  hardware profile and :class:`~parplan.solver.calibration.Calibration` it would post;
- ``kernels``: achieved throughput per GEMM shape and dtype (fp32, tf32, bf16), scaled-dot-product
  attention forward and forward+backward (bf16, causal), and bytes per second of memory-bound
  operators — the raw data for a shape-aware time model;
- ``single``: measured vs predicted per-category memory and step time of GPT and Llama models
  (hundreds of millions of parameters, fp32 as the agent runs) on one GPU: recomputation none /
  selective / full, gradient accumulation;
- ``large``: the same for models of about a billion parameters (GPT 1.3 B; a Llama-3.2-1B shape with
  a 128,256-word vocabulary);
- ``probe``: which collectives gloo runs on CUDA tensors (what ``shared`` relies on);
- ``workspace``: what the CUDA allocator holds for cuBLAS after a first matmul and a first backward;
- ``breakdown``: bf16 training steps of GPT and Llama models on one GPU (shapes of the published
  H100 runs' layers: MPT-1b/GPT-1.3B, Llama-3.2-1B, slices of MPT-7b and Llama-3-8B), each kernel
  timed by ``torch.profiler`` and sorted by phase and category
  (:mod:`parplan.agent.step_profile`), for ``bench/step_breakdown.py`` to set beside the time
  model's prediction of each category;
- ``sustained``: a large bf16 GEMM run back to back for 30 s, its throughput second by second
  with the SM clock, power and throttle reasons ``nvidia-smi`` reports meanwhile (the ``kernels``
  part times bursts of 10: a whole training step may run at a lower clock);
- ``shared``: the validation matrix's multi-rank strategies (TP, FSDP / ZeRO, SP; no pipelines, as
  gloo cannot send CUDA tensors) on GPT and Llama models of about 100 M parameters, with all
  ranks on the machine's GPUs (more ranks than GPUs: they share them and talk through gloo):
  per-rank memory only, the step times of shared GPUs are no measurement.

    python bench/gpu_checks.py --out DIR [--parts env,profile,kernels,single,breakdown,sustained,shared]

Measures only; the tables in bench/RESULTS.md are written from these files.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

PARTS = ("env", "profile", "kernels", "single", "large", "breakdown", "sustained", "probe", "workspace", "shared")


def _events_seconds(fn: Callable[[], Any], repeats: int = 10, warmup: int = 3) -> float:
    """Median seconds of ``fn`` on the current CUDA stream (CUDA events)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def part_env() -> dict[str, Any]:
    props = torch.cuda.get_device_properties(0)
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                          "clocks.max.mem,power.limit", "--format=csv"], capture_output=True, text=True)
    return {"device_name": props.name, "device_count": torch.cuda.device_count(),
            "total_memory_bytes": props.total_memory, "multiprocessors": props.multi_processor_count,
            "capability": f"{props.major}.{props.minor}", "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(), "nvidia_smi": smi.stdout,
            "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def part_profile() -> dict[str, Any]:
    from parplan.agent.microbench import profile
    from parplan.agent.validate import hardware

    hw = hardware("cuda")
    return {"hardware": hw, "profile": profile(hw, torch.device("cuda", 0), torch.cuda.device_count())}


_GEMM_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "tf32": torch.float32}


def _queued_seconds(fn: Callable[[], Any], calls: int = 10, warmup: int = 3) -> float:
    """Seconds of one of ``calls`` back-to-back calls of ``fn`` (CUDA events around them all): the
    kernels queue up as in a training step, so the CPU's dispatch of each call is hidden, which
    :func:`_events_seconds` (one synchronised call) includes."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / calls


def _gemm_shapes(dtype: str) -> list[tuple[int, int, int]]:
    """(M, K, N): squares, and a transformer layer's matmuls (tokens x hidden -> 3h, h, 4h; 4h -> h)."""
    squares = [(n, n, n) for n in (256, 512, 1024, 2048, 4096, 8192)] + ([(16384,) * 3] if dtype == "bf16" else [])
    tokens = (2048, 8192, 32768) if dtype == "bf16" else (2048, 8192)
    layer = [(t, k, n) for t in tokens for h in (1024, 2048, 4096, 8192)
             for k, n in ((h, 3 * h), (h, h), (h, 4 * h), (4 * h, h))]
    return squares + layer


def part_kernels() -> dict[str, Any]:
    import torch.nn.functional as nnf

    dev = torch.device("cuda", 0)
    out: dict[str, Any] = {"gemm": [], "attention": [], "memory_bound": []}
    for name, dtype in _GEMM_DTYPES.items():
        torch.backends.cuda.matmul.allow_tf32 = name == "tf32"
        for m, k, n in _gemm_shapes(name):
            a = torch.randn(m, k, device=dev, dtype=dtype)
            b = torch.randn(k, n, device=dev, dtype=dtype)
            s = _events_seconds(lambda a=a, b=b: torch.matmul(a, b), repeats=5 if name == "fp32" else 10)
            queued = _queued_seconds(lambda a=a, b=b: torch.matmul(a, b), calls=5 if name == "fp32" else 10)
            out["gemm"].append({"dtype": name, "m": m, "k": k, "n": n, "seconds": s,
                                "flops_per_s": 2 * m * k * n / s, "seconds_queued": queued})
            del a, b
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.cuda.empty_cache()
    for d in (64, 128):
        for seq in (1024, 2048, 4096, 8192):
            heads = 2048 // d * 2  # hidden 4096
            batch = max(1, 16384 // seq)
            q, k, v = (torch.randn(batch, heads, seq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            fwd_flops = 4 * batch * heads * seq * seq * d / 2  # causal: half the score matrix
            fwd = _events_seconds(lambda q=q, k=k, v=v: nnf.scaled_dot_product_attention(q, k, v, is_causal=True))
            grad = torch.randn(batch, heads, seq, d, device=dev, dtype=torch.bfloat16)

            def both(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v, g: torch.Tensor = grad) -> None:
                nnf.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g)

            fb = _events_seconds(both)
            out["attention"].append({"dtype": "bf16", "batch": batch, "heads": heads, "seq": seq, "head_dim": d,
                                     "causal": True, "forward_seconds": fwd, "forward_backward_seconds": fb,
                                     "forward_flops_per_s": fwd_flops / fwd,
                                     "forward_backward_flops_per_s": 3.5 * fwd_flops / fb})
            del q, k, v, grad
    torch.cuda.empty_cache()
    for mib in (1, 16, 256, 2048):
        x = torch.randn(mib * 2**20 // 2, device=dev, dtype=torch.bfloat16)
        y = torch.empty_like(x)
        nb = x.numel() * 2
        h = 4096
        x2 = x.view(-1, h) if x.numel() % h == 0 and x.numel() >= h else None
        ops: dict[str, tuple[Callable[[], Any], int]] = {
            "copy": (lambda x=x, y=y: y.copy_(x), 2 * nb),
            "add": (lambda x=x, y=y: torch.add(x, y), 3 * nb),
            "gelu": (lambda x=x: nnf.gelu(x), 2 * nb),
        }
        if x2 is not None:
            w = torch.ones(h, device=dev, dtype=torch.bfloat16)
            ops["layer_norm"] = (lambda x2=x2, w=w, h=h: nnf.layer_norm(x2, (h,), w, w), 2 * nb)
            ops["softmax"] = (lambda x2=x2: torch.softmax(x2, dim=-1), 2 * nb)
        for op, (fn, moved) in ops.items():
            s = _events_seconds(fn)
            out["memory_bound"].append({"op": op, "dtype": "bf16", "tensor_bytes": nb, "bytes_moved": moved,
                                        "seconds": s, "bytes_per_s": moved / s})
        del x, y
    return out


def _single_specs() -> list[Any]:
    from parplan.agent.executor import RunSpec
    from parplan.solver.frontends.presets import get_preset

    gpt = get_preset("gpt-1.7b").with_(name="gpt-350m", layers=24, hidden=1024, heads=16, ffn=4096, seq_len=1024)
    llama = get_preset("llama-2-70b").with_(name="llama-330m", layers=16, hidden=1024, heads=16, kv_heads=8,
                                            ffn=2816, vocab=32000, seq_len=2048)
    runs = []
    for cfg, mb in ((gpt, 8), (llama, 4)):
        for rec in ("none", "selective", "full"):
            runs.append((cfg, rec, mb, 1))
        runs.append((cfg, "full", mb, 2))
    return [RunSpec(model=asdict(cfg), recompute=rec, seq_len=cfg.seq_len, micro_batch=mb, num_microbatches=m,
                    check=False, timing_steps=5, label=f"{cfg.name}/mb{mb}x{m}/{rec}")
            for cfg, rec, mb, m in runs]


def _large_specs() -> list[Any]:
    """Models of about a billion parameters: GPT (1.3 B, vocabulary 51,200) and a Llama-3.2-1B shape
    (grouped-query attention 32/8, tied embeddings, vocabulary 128,256: large loss buffers)."""
    from parplan.agent.executor import RunSpec
    from parplan.solver.frontends.presets import get_preset

    gpt = get_preset("gpt-1.7b").with_(name="gpt-1.3b", layers=24, hidden=2048, heads=16, ffn=8192, seq_len=2048)
    llama = get_preset("llama-2-70b").with_(name="llama-1b", layers=16, hidden=2048, heads=32, kv_heads=8,
                                            ffn=8192, vocab=128256, seq_len=2048, tied_embeddings=True)
    runs = [(gpt, "none"), (gpt, "full"), (llama, "none"), (llama, "selective"), (llama, "full")]
    return [RunSpec(model=asdict(cfg), recompute=rec, seq_len=cfg.seq_len, micro_batch=2, check=False,
                    timing_steps=3, label=f"{cfg.name}/mb2/{rec}") for cfg, rec in runs]


def part_large() -> list[dict[str, Any]]:
    return _run_each(_large_specs(), _gpu_preset())


def _gpu_preset() -> str:
    from parplan.agent.validate import hardware

    return str(hardware("cuda")["key"])


def _run_each(specs: list[Any], gpu: str, chunk: int = 1) -> list[dict[str, Any]]:
    """Run ``specs``, ``chunk`` of the same world size per launch (a failed launch fails its chunk
    only); each result is also appended to ``$GPU_CHECKS_LOG`` as it comes, should the part be cut."""
    from parplan.agent.validate import run_and_compare

    log = os.environ.get("GPU_CHECKS_LOG")
    results = []
    groups: list[list[Any]] = []
    for spec in specs:
        if groups and len(groups[-1]) < chunk and groups[-1][0].world == spec.world:
            groups[-1].append(spec)
        else:
            groups.append([spec])
    for group in groups:
        t0 = time.perf_counter()
        try:
            done = [{"label": sp.label, "ok": True, **res} for sp, res in
                    zip(group, run_and_compare(group, "cuda", gpu=gpu), strict=True)]
        except Exception as e:  # one failed launch is rows, not the end of the part
            done = [{"label": sp.label, "ok": False, "error": f"{type(e).__name__}: {e}"[-3000:]} for sp in group]
        for r in done:
            r.pop("prediction", None)
            r["wall_seconds"] = (time.perf_counter() - t0) / len(group)
            results.append(r)
            st = r.get("step_seconds", {})
            print(f"  {r['label']}: " + (f"peak err {r['most_loaded']['relative_error']:+.2%} step "
                                         f"{st['measured']:.3f}s vs {st['predicted']:.3f}s"
                                         if r["ok"] else r["error"][-300:]), flush=True)
            if log:
                with open(log, "a") as f:
                    f.write(json.dumps(r, default=str) + "\n")
    return results


def part_single() -> list[dict[str, Any]]:
    return _run_each(_single_specs(), _gpu_preset())


#: The multi-rank kinds of the validation matrix (no pipelines: gloo cannot send CUDA tensors).
_SHARED_KINDS: tuple[tuple[str, dict[str, Any], tuple[str, ...]], ...] = (
    ("tp2", {"tp": 2}, ("none", "full")),
    ("dp2", {"dp": 2}, ("none",)),
    ("zero1-dp2", {"dp": 2, "zero": 1}, ("none",)),
    ("zero2-dp2-m2", {"dp": 2, "zero": 2, "num_microbatches": 2}, ("none",)),
    ("zero3-dp4", {"dp": 4, "zero": 3}, ("none", "full", "selective")),
    ("tp2-dp2-sp", {"tp": 2, "dp": 2, "sequence_parallel": True}, ("none", "selective")),
    ("tp2-zero2-dp2-sp", {"tp": 2, "dp": 2, "zero": 2, "sequence_parallel": True}, ("full",)),
    ("tp2-zero3-dp2", {"tp": 2, "dp": 2, "zero": 3}, ("none",)),
)


def part_shared() -> list[dict[str, Any]]:
    from parplan.agent.executor import RunSpec
    from parplan.agent.launch import SHARE_GPUS_ENV
    from parplan.solver.frontends.presets import get_preset

    os.environ[SHARE_GPUS_ENV] = "1"  # several ranks per GPU: a debugging run, not a measurement
    gpt = get_preset("gpt-1.7b").with_(name="gpt-100m", layers=4, hidden=1024, heads=16, ffn=4096, seq_len=1024)
    llama = get_preset("llama-2-70b").with_(name="llama-80m", layers=4, hidden=1024, heads=16, kv_heads=8,
                                            ffn=2816, vocab=32000, seq_len=1024)
    specs = [RunSpec(model=asdict(cfg), seq_len=cfg.seq_len, micro_batch=2, check=False, timing_steps=1,
                     label=f"{cfg.name}/{name}/{rec}", **{**fields, "recompute": rec})
             for cfg in (gpt, llama) for name, fields, recs in _SHARED_KINDS for rec in recs]
    return _run_each(specs, _gpu_preset(), chunk=4)


def breakdown_specs() -> list[tuple[str, Any, int, str]]:
    """(label, model, micro-batch, recomputation) of the ``breakdown`` part: the layers of the
    published H100 runs' models (fewer of them where the whole model would not fit one GPU)."""
    from parplan.solver.frontends.presets import get_preset

    gpt = get_preset("gpt-1.7b").with_(name="gpt-1.3b", layers=24, hidden=2048, heads=16, ffn=8192, seq_len=2048)
    mpt7 = gpt.with_(name="gpt-7b-8layers", layers=8, hidden=4096, heads=32, ffn=16384, vocab=50432)
    llama = get_preset("llama-2-70b").with_(name="llama-1b", layers=16, hidden=2048, heads=32, kv_heads=8,
                                            ffn=8192, vocab=128256, seq_len=2048, tied_embeddings=True)
    llama8 = get_preset("llama-2-70b").with_(name="llama-8b-4layers", layers=4, hidden=4096, heads=32, kv_heads=8,
                                             ffn=14336, vocab=128256, seq_len=8192)
    return [("gpt-1.3b/mb8/none", gpt, 8, "none"), ("gpt-1.3b/mb8/full", gpt, 8, "full"),
            ("gpt-7b-8layers/mb6/none", mpt7, 6, "none"), ("llama-1b/mb4/none", llama, 4, "none"),
            ("llama-1b/mb4/selective", llama, 4, "selective"), ("llama-8b-4layers/mb1/none", llama8, 1, "none")]


def part_breakdown() -> list[dict[str, Any]]:
    from parplan.agent.step_profile import profile_run

    out = []
    for label, cfg, mb, rec in breakdown_specs():
        t0 = time.perf_counter()
        try:
            res = {"label": label, "ok": True, "gpu": _gpu_preset(), "model": asdict(cfg), **profile_run(cfg, mb, rec)}
        except Exception as e:  # one failed run is a row, not the end of the part
            res = {"label": label, "ok": False, "error": f"{type(e).__name__}: {e}"[-3000:]}
        res["wall_seconds"] = time.perf_counter() - t0
        print(f"  {label}: " + (f"step {res['step_seconds']['median']:.4f} s" if res["ok"] else res["error"][-300:]),
              flush=True)
        out.append(res)
        torch.cuda.empty_cache()
    return out


_SMI_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_throttle_reasons.active"


def part_sustained(seconds: float = 30.0, size: int = 8192) -> dict[str, Any]:
    """A ``size``-cubed bf16 GEMM back to back for ``seconds``: TFLOP/s per second of running, and
    what ``nvidia-smi`` samples every 200 ms meanwhile."""
    dev = torch.device("cuda", 0)
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    c = torch.empty(size, size, device=dev, dtype=torch.bfloat16)
    flops = 2 * size**3
    smi = subprocess.Popen(["nvidia-smi", f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader", "-lms", "200"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    windows = []
    try:
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            t0, e0, e1 = time.perf_counter(), torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            n = 0
            while time.perf_counter() - t0 < 1.0:
                for _ in range(10):
                    torch.matmul(a, b, out=c)
                n += 10
                e1.record()
                e1.synchronize()
            windows.append({"at_seconds": t0 - start, "gemms": n,
                            "flops_per_s": n * flops / (e0.elapsed_time(e1) / 1e3)})
    finally:
        smi.terminate()
        samples, _ = smi.communicate(timeout=10)
    return {"gemm": [size, size, size], "dtype": "bf16", "windows": windows, "fields": _SMI_FIELDS,
            "nvidia_smi": samples.strip().splitlines()}


def part_workspace() -> dict[str, Any]:
    """Bytes the CUDA caching allocator holds for libraries after a first matmul on this thread and
    after a first backward (PyTorch's autograd runs it on a thread of its own)."""
    dev = torch.device("cuda", 0)
    torch.cuda.synchronize()
    out: dict[str, Any] = {"env": {k: v for k, v in os.environ.items() if "CUBLAS" in k}}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(1024, 1024, device=dev, dtype=dtype, requires_grad=True)
        b = torch.randn(1024, 1024, device=dev, dtype=dtype)
        torch.cuda.synchronize()
        m0 = torch.cuda.memory_allocated(dev)
        c = a @ b
        torch.cuda.synchronize()
        m1 = torch.cuda.memory_allocated(dev) - c.numel() * c.element_size()
        c.sum().backward()
        torch.cuda.synchronize()
        m2 = torch.cuda.memory_allocated(dev) - c.numel() * c.element_size() - a.numel() * a.element_size()
        out[str(dtype)] = {"after_forward_matmul": m1 - m0, "after_backward": m2 - m0}
        del a, b, c
    return out


def probe_worker() -> dict[str, str]:
    """One rank of the ``probe`` part: which collectives gloo runs on CUDA tensors."""
    import torch.distributed as dist

    dev = torch.device("cuda", torch.cuda.current_device())
    world = dist.get_world_size()
    x = torch.ones(world * 4, device=dev)
    ops: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: dist.all_reduce(x),
        "broadcast": lambda: dist.broadcast(x, 0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(torch.empty(world * x.numel(), device=dev), x),
        "all_gather": lambda: dist.all_gather([torch.empty_like(x) for _ in range(world)], x),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(torch.empty(4, device=dev), x),
        "all_to_all_single": lambda: dist.all_to_all_single(torch.empty_like(x), x),
    }
    # (send/recv of a CUDA tensor through gloo aborts the process: "writev ... Bad address", seen on
    # an H100 with torch 2.11, so it is not tried)
    out = {}
    for name, fn in ops.items():
        try:
            fn()
            torch.cuda.synchronize()
            out[name] = "ok"
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"[:300]
        dist.barrier()
    return out


def part_probe() -> Any:
    from parplan.agent.launch import SHARE_GPUS_ENV, launch_function

    os.environ[SHARE_GPUS_ENV] = "1"
    return launch_function(probe_worker, (), max(2, torch.cuda.device_count() + 1), "cuda")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--parts", default=",".join(PARTS))
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_checks: no CUDA device", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    funcs: dict[str, Callable[[], Any]] = {
        "env": part_env, "profile": part_profile, "kernels": part_kernels, "single": part_single,
        "large": part_large, "breakdown": part_breakdown, "sustained": part_sustained, "probe": part_probe,
        "workspace": part_workspace, "shared": part_shared}
    status = 0
    for part in args.parts.split(","):
        t0 = time.perf_counter()
        print(f"== {part}", flush=True)
        try:
            doc: Any = {"part": part, "result": funcs[part]()}
        except Exception:
            doc = {"part": part, "error": traceback.format_exc()[-4000:]}
            status = 1
            print(doc["error"], flush=True)
        doc["seconds"] = time.perf_counter() - t0
        doc["commit"] = os.environ.get("PARPLAN_COMMIT", "")
        (args.out / f"{part}.json").write_text(json.dumps(doc, indent=1, default=str))
        print(f"== {part} done in {doc['seconds']:.1f} s", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
