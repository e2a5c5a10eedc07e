"""Issue 12: the shape-aware kernel model (parplan/solver/cost/kernels.py) against kernels measured on a GPU.

The oracle is a measurement: the GEMMs and scaled_dot_product_attention calls that bench/gpu_checks.py's
``kernels`` part timed with CUDA events on the H100 lent on 2026-11-23 (bench/out/gpu-2026-11-23/kernels.json).
For each GEMM, predicted over measured time, with the shape model and with the default calibration's
flat efficiency that every matmul got before (0.55 bf16, 0.5 tf32 and fp32); for each attention call,
each pass's efficiency measured (FLOPs counted as parplan counts them: the backward twice the forward)
against the model's curve (predicted / measured time), and the one figure that priced both passes
before 2026-11-25; for each memory-bound kernel of 256 MiB or more, the fraction of the HBM peak
measured against the model's.
A second, independent measurement: the H100 entries of OpenXLA's default matmul performance table
(bench/data/xla_h100_matmul.json, 375 batched GEMMs of 256 to 4,096 on each side, kernel time without
host dispatch). For those of 50 µs or more, predicted over measured time, and the ceiling each implies
(measured efficiency / the shape factor, the figure :data:`KERNELS` holds as the ceiling) beside the
lent H100's, each at the model's K fill and at other K fills (which K fill makes a data set's implied
ceilings most alike).
Run: python bench/kernel_model_accuracy.py [KERNELS_JSON]
"""

from __future__ import annotations

import json
import os
import statistics
import sys
from typing import Any

from _common import header

from parplan.solver.calibration import DEFAULT_CALIBRATION
from parplan.solver.cluster import gpu_preset
from parplan.solver.cost.kernels import (
    K_FILL,
    KERNELS,
    XLA_TO_SUSTAINED,
    GemmShape,
    gemm_ceiling,
    gemm_efficiency,
    memory_efficiency,
    shape_factor,
)

DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "gpu-2026-11-23", "kernels.json")
XLA_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "xla_h100_matmul.json")
XLA_B200_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "xla_b200_matmul.json")
H100, B200 = gpu_preset("H100-80GB"), gpu_preset("B200-180GB")
#: XLA's B200 rates by parplan dtype (FP8: e4m3 inputs, Transformer Engine's forward format)
B200_RATES = {"bf16": "bf16_flop_per_s", "fp8": "fp8_e4m3_e4m3_flop_per_s"}


def _measured(g: dict[str, Any]) -> float:
    """A GEMM's seconds: queued back to back (``seconds_queued``, files from 2026-11-28 on), which a
    training step's are, else one synchronised call's (it includes the CPU's dispatch of the call)."""
    return float(g.get("seconds_queued") or g["seconds"])


def gemm_ratios(gemms: list[dict[str, Any]], dtype: str, shortest: float, flat: bool) -> list[float]:
    """Predicted / measured seconds of the ``dtype`` GEMMs that ran ``shortest`` seconds or more
    (``batch`` independent products each, 1 where a GEMM has none)."""
    out = []
    for g in gemms:
        if g["dtype"] != dtype or _measured(g) < shortest:
            continue
        batch = int(g.get("batch", 1))
        flops = 2 * batch * g["m"] * g["n"] * g["k"]
        if flat:
            eff = DEFAULT_CALIBRATION.matmul_efficiency_for(dtype)  # what every matmul got before
        else:
            shape = GemmShape(batch, max(g["m"], g["n"]), min(g["m"], g["n"]), g["k"])
            eff = gemm_efficiency(shape, H100, gemm_ceiling(H100, dtype, DEFAULT_CALIBRATION), dtype)
        out.append(flops / (H100.peak(dtype) * eff) / _measured(g))
    return out


def xla_gemms(path: str = XLA_TABLE) -> list[dict[str, Any]]:
    """XLA's H100 bf16 GEMMs as the lent H100's ``kernels`` part records them (``batch``, ``m``, ``n``,
    ``k``, ``seconds``; the batch is XLA's ``b``)."""
    with open(path) as f:
        entries = json.load(f)["entries"]
    return [{"batch": e["b"], "m": e["m"], "n": e["n"], "k": e["k"], "dtype": "bf16",
             "seconds": 2 * e["b"] * e["m"] * e["n"] * e["k"] / e["bf16_flop_per_s"]} for e in entries]


def implied_ceilings(gemms: list[dict[str, Any]], shortest: float, k_fill: float) -> list[float]:
    """For each bf16 GEMM of ``shortest`` seconds or more: its measured fraction of the H100's dense peak
    over the tile model's shape factor with ``k_fill`` (the ceiling that GEMM implies)."""
    out = []
    sms = KERNELS["H100"].sms
    for g in gemms:
        s = _measured(g)
        if g["dtype"] != "bf16" or s < shortest:
            continue
        b = int(g.get("batch", 1))
        shape = GemmShape(b, max(g["m"], g["n"]), min(g["m"], g["n"]), g["k"])
        tiles = shape_factor(shape, sms, fill=False)
        eff = 2 * b * g["m"] * g["n"] * g["k"] / s / H100.peak("bf16")
        out.append(eff / (tiles * g["k"] / (g["k"] + k_fill)))
    return out


def _spread(xs: list[float]) -> float:
    """Mean absolute deviation from the median, as a fraction of it."""
    med = statistics.median(xs)
    return statistics.mean(abs(x / med - 1) for x in xs)


def xla_section(lent: list[dict[str, Any]]) -> None:
    """The model against XLA's H100 table, and the two data sets' implied ceilings."""
    xla = xla_gemms()
    print(f"\n**A second measurement: XLA's H100 matmul table** ({os.path.relpath(XLA_TABLE)}, "
          f"{len(xla)} bf16 GEMMs)\n")
    print("| GEMMs | count | median predicted / measured | range | within 10% |")
    print("|---|---:|---:|---:|---:|")
    for shortest, label in ((50e-6, "50 µs or more"), (100e-6, "100 µs or more")):
        rs = gemm_ratios(xla, "bf16", shortest, flat=False)
        print(f"| XLA, {label} | {len(rs)} | {statistics.median(rs):.3f} | {min(rs):.2f} to {max(rs):.2f} | "
              f"{sum(1 for r in rs if abs(r - 1) <= 0.10)} |")
    print(f"\n| K fill (model: {K_FILL}) | XLA >= 50 µs: median implied ceiling | mean deviation | "
          "lent H100 >= 300 µs: median implied ceiling | mean deviation |")
    print("|---:|---:|---:|---:|---:|")
    for k_fill in (64, 128, 192, 256, 384):
        a, b = implied_ceilings(xla, 50e-6, k_fill), implied_ceilings(lent, 300e-6, k_fill)
        print(f"| {k_fill} | {statistics.median(a):.3f} | {_spread(a) * 100:.1f} % | {statistics.median(b):.3f} | "
              f"{_spread(b) * 100:.1f} % |")


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    with open(path) as f:
        result = json.load(f)["result"]
    print(header("The kernel model against kernels measured on an H100 (issue 12)"))
    print(f"data: {os.path.relpath(path)}\n")
    print("| GEMMs | model | count | median predicted / measured | range | within 10% |")
    print("|---|---|---:|---:|---:|---:|")
    for dtype in ("bf16", "tf32", "fp32"):
        for shortest, label in ((300e-6, "300 µs or more"), (0.0, "all")):
            for flat in (False, True):
                rs = gemm_ratios(result["gemm"], dtype, shortest, flat)
                if not rs:
                    continue
                model = "flat" if flat else "shapes"
                print(f"| {dtype}, {label} | {model} | {len(rs)} | {statistics.median(rs):.3f} | "
                      f"{min(rs):.2f} to {max(rs):.2f} | {sum(1 for r in rs if abs(r - 1) <= 0.10)} |")
    sdpa = KERNELS["H100"].attention["sdpa"]
    print("\n| SDPA bf16 causal | forward: measured efficiency | model / measured time | backward: measured "
          "efficiency | model / measured time | both: one figure (0.37, before 2026-11-25) / measured time |")
    print("|---|---:|---:|---:|---:|---:|")
    for a in result["attention"]:
        flops = a["forward_flops_per_s"] * a["forward_seconds"]  # the forward's, causal
        bwd_s = a["forward_backward_seconds"] - a["forward_seconds"]
        fwd_eff = flops / a["forward_seconds"] / H100.peak("bf16")
        bwd_eff = 2 * flops / bwd_s / H100.peak("bf16")  # parplan's convention: backward = 2 forwards
        model_f = sdpa.efficiency(False, a["head_dim"], a["seq"])
        model_b = sdpa.efficiency(True, a["head_dim"], a["seq"])
        flat = 3 * flops / (H100.peak("bf16") * 0.37) / a["forward_backward_seconds"]
        print(f"| head dim {a['head_dim']}, {a['seq']} tokens, batch {a['batch']} | {fwd_eff:.3f} | "
              f"{fwd_eff / model_f:.3f} | {bwd_eff:.3f} | {bwd_eff / model_b:.3f} | {flat:.2f} |")
    print("\n| memory-bound, bf16 (PyTorch) | tensor MiB | measured fraction of the HBM peak | model's fraction | "
          "model / measured time |")
    print("|---|---:|---:|---:|---:|")
    kinds = {"copy": "elementwise", "add": "elementwise", "gelu": "elementwise", "layer_norm": "layernorm",
             "softmax": "softmax"}
    for x in result["memory_bound"]:
        if x["tensor_bytes"] < 256 * 2**20:
            continue  # shorter kernels measure their launch more than their bytes
        measured = x["bytes_per_s"] / H100.hbm_bandwidth_bytes_per_s
        fraction = memory_efficiency(H100, kinds[x["op"]], DEFAULT_CALIBRATION, "torch")
        print(f"| {x['op']} | {x['tensor_bytes'] // 2**20} | {measured:.3f} | {fraction:.2f} | "
              f"{measured / fraction:.2f} |")
    xla_section(result["gemm"])
    xla_b200_section()


def xla_b200_section() -> None:
    """The B200 (sm_100) entries of XLA's table: the ceilings they imply over the tile model's shape
    factor on 148 SMs, on the GEMMs that take 50 µs or more in bf16 (the same shapes for FP8), and
    parplan's B200 prediction of them (its ceilings are these times :data:`XLA_TO_SUSTAINED`)."""
    with open(XLA_B200_TABLE) as f:
        entries = json.load(f)["entries"]
    big = [e for e in entries if 2 * e["b"] * e["m"] * e["n"] * e["k"] / e["bf16_flop_per_s"] >= 50e-6]
    sms = KERNELS["B200"].sms
    print(f"\n**XLA's B200 matmul table** ({os.path.relpath(XLA_B200_TABLE)}, {len(entries)} GEMMs, "
          f"{len(big)} of 50 µs or more in bf16; H100-to-sustained ratio {XLA_TO_SUSTAINED:.3f})\n")
    print("| dtype | GEMMs | median implied ceiling | mean deviation | largest | model's ceiling | "
          "median model / XLA time | range |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for dtype, key in B200_RATES.items():
        implied, ratios = [], []
        ceiling = gemm_ceiling(B200, dtype, DEFAULT_CALIBRATION)
        for e in big:
            shape = GemmShape(e["b"], max(e["m"], e["n"]), min(e["m"], e["n"]), e["k"])
            eff = e[key] / B200.peak(dtype)
            implied.append(eff / shape_factor(shape, sms))
            ratios.append(eff / gemm_efficiency(shape, B200, ceiling, dtype))
        med = statistics.median(implied)
        largest = max(abs(x / med - 1) for x in implied)
        print(f"| {dtype} | {len(big)} | {med:.3f} | {_spread(implied) * 100:.1f} % | {largest * 100:.0f} % | "
              f"{ceiling:.2f} | {statistics.median(ratios):.3f} | {min(ratios):.2f} to {max(ratios):.2f} |")


if __name__ == "__main__":
    main()
