"""Issue 12: parplan's predicted step time against published training runs (bench/data/published_runs.json).

Every row that parplan's model can express is priced by ``parplan memory``'s path:
- the model is rebuilt from the published shape;
- the layout is the published one: TP, PP, DP, micro-batch, global batch, recomputation, ZeRO or FSDP;
- the GPU is the preset of the published GPU.

The ratio is predicted over published step time. The published time is the source's own where it
prints one (``step_seconds``). Otherwise it is the time computed from the source's published rate
(``step_seconds_derived``); the data file gives that formula. What a source does not state is assumed,
and listed in the row's ``assumed`` column: an unstated recomputation is selective where parplan's
memory model fits it on the GPU, else full (always full for Megatron-LM of 2021, which had no other);
the trainers of 2021-22 run without flash attention. FP8 rows are priced with parplan's FP8 precision (matmuls
with a weight at the fp8 peak), context-parallel rows with their ``cp``; Megatron-LM rows that state
``--tp-comm-overlap`` / ``--overlap-param-gather`` with those options; Megatron-LM rows of 2021-22 with
their gradients reduced after the backward (no ``--overlap-grad-reduce`` then; BLOOM's DeepSpeed pipeline
alike) unless the row ran PyTorch's DDP (``ddp_impl`` torch), ``--fp16`` rows with their gradients in
fp16 where the row says so (``grad_reduce_dtype``), and Megatron-LM's pipeline hand-offs of 2021-22
split over the TP ranks where the row says so (``scatter_gather_optimization``: ``pp_scatter_gather``).
The rows left out, and why, are
listed after the table: runs without a step time, or on a GPU without a preset. Runs on a GPU with no
preset that a preset stands in for (torchtitan's 500 W HBM2e H100s, priced as the SXM H100) are
priced and shown in a table of their own, not counted.

This measures the time model as it is. One figure of the model was fitted to these rows: the H100's
FP8 GEMM ceiling (parplan/solver/cost/kernels.py, to Megatron-Bridge's FP8 runs); nothing else is.
Run: python bench/time_model_accuracy.py [--write]  (--write: store the summary plans show,
parplan/solver/time_accuracy.json)
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections import defaultdict
from typing import Any

from _common import header

from parplan.solver.cluster import make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.runtime import Runtime
from parplan.solver.evaluate import evaluate
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig, Schedule
from parplan.solver.time_accuracy import ACCURACY_FILE, gpu_generation

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "published_runs.json")


def _gpu(text: str) -> tuple[str | None, str, bool]:
    """parplan's GPU preset for a published GPU name (None: no preset), a remark, and whether the
    preset only stands in for the GPU the run had (the row is then not counted)."""
    t = text.upper()
    if "A100" in t:
        return "A100-80GB", "", False
    if "H200" in t:
        return "H200-141GB", "", False
    if "H100" in t:
        if "HBM2E" in t or "500W" in t:
            return "H100-80GB", "ran on a 500 W HBM2e H100; preset is SXM", True
        return "H100-80GB", "", False
    if "GB200" in t:
        return "GB200-186GB", "", False
    if "B200" in t:
        return "B200-180GB", "", False
    return None, "", False


def _recompute(text: str | None, assumed: list[str]) -> Recompute | None:
    """The recomputation a row states; None when it does not say (see :func:`price`)."""
    t = (text or "").lower()
    if not t:
        return None
    if "selective" in t:
        return Recompute.SELECTIVE
    if t.startswith("none") or "without activation" in t or t == "no":
        return Recompute.NONE
    return Recompute.FULL


#: Sources whose trainer had no fused (flash) attention: Megatron-LM of 2021-22 and BigScience's
#: Megatron-DeepSpeed fork wrote the score matrix to HBM (their fused scale-mask-softmax kernel);
#: FlashAttention (Dao et al., May 2022) reached Megatron-LM in 2023.
_BEFORE_FLASH = ("Narayanan et al. 2021", "Korthikanti et al. 2022", "BigScience BLOOM")
#: Megatron-LM of 2021 recomputed whole layers or nothing: selective recomputation came with
#: Korthikanti et al. 2022.
_FULL_RECOMPUTE_ONLY = ("Narayanan et al. 2021",)
#: Megatron-LM before September 2023 reduced the gradients after the backward, not under it: its
#: default ``--DDP-impl local`` all-reduced them once the whole forward-backward had run
#: (``train_step`` in megatron/training.py, as at 50a4b5fa02 of April 2021), ``--overlap-grad-reduce``
#: came with commit 2d5220a424 of 2023-09-05, and Korthikanti et al. (§6.3) say so of their runs.
#: BigScience's Megatron-DeepSpeed pipelines with DeepSpeed's PipelineEngine, whose TrainSchedule
#: reduces the gradients (ReduceGrads) after the last micro-batch's backward (deepspeed/runtime/pipe/
#: schedule.py, as at v0.6.0 of 2022).
_BEFORE_GRAD_OVERLAP = ("Narayanan et al. 2021", "Korthikanti et al. 2022", "BigScience BLOOM")


def _skip_reason(r: dict[str, Any]) -> str | None:
    if not (r.get("step_seconds") or r.get("step_seconds_derived")):
        return "no step time (published or derived)"
    if not r.get("layers") or not r.get("hidden") or not r.get("heads"):
        return "model shape not stated"
    if _gpu(str(r.get("gpu") or ""))[0] is None:
        return f"no GPU preset for {r.get('gpu')}"
    return None


def price(r: dict[str, Any]) -> dict[str, Any]:
    """parplan's step time for row ``r``, what was assumed, and the ratio to the published time."""
    assumed: list[str] = []
    arch = str(r.get("architecture") or "gpt").lower()
    family = "llama" if "llama" in arch else "gpt"
    hidden, heads, layers = int(r["hidden"]), int(r["heads"]), int(r["layers"])
    ffn = r.get("ffn")
    if not ffn:
        ffn = 4 * hidden if family == "gpt" else 8 * hidden // 3
        assumed.append(f"ffn {ffn}")
    vocab = r.get("vocab")
    if not vocab:
        vocab = 51200
        assumed.append("vocab 51200")
    seq = int(r.get("seq_len") or 2048)
    dropout = None  # the family's: Megatron-LM's 0.1 for GPT, none for Llama
    if arch.startswith("mpt"):
        # llm-foundry's MPTConfig defaults resid_pdrop, emb_pdrop and attn_pdrop to 0, and its
        # benchmark yamls do not set them: no dropout kernels, no masks
        dropout = 0.0
        assumed.append("dropout 0 (MPTConfig's default)")
    cfg = TransformerConfig(family=family, name=f"{r['params']}", layers=layers, hidden=hidden, heads=heads,
                            ffn=int(ffn), vocab=int(vocab), seq_len=seq, kv_heads=r.get("kv_heads"),
                            tied_embeddings=family == "gpt", dropout=dropout)
    gpus = int(r["gpus"])
    tp, pp = int(r.get("tp") or 1), int(r.get("pp") or 1)
    mp = int(r.get("model_parallel_size") or 1)
    if (r.get("tp") is None or r.get("pp") is None) and mp > 1:
        # only the model-parallel size is printed: 8-way TP within a node, the rest pipelined
        tp = 8 if mp % 8 == 0 else mp
        pp = mp // tp
        assumed.append(f"tp {tp} x pp {pp} of model-parallel size {mp}")
    cp = int(r.get("cp") or 1)
    dp = gpus // (tp * pp * cp)
    mb = r.get("micro_batch")
    if not mb:
        mb = 1
        assumed.append("micro-batch 1")
    gb = int(r.get("global_batch") or mb * dp)
    label = str(r.get("precision") or "").lower()
    fp8 = any(w in label for w in ("fp8", "float8"))
    # NVIDIA's "FP8-CS" (current scaling, Megatron-LM's --fp8-recipe tensorwise) and torchtitan's
    # tensorwise float8 (dynamic scaling) compute each tensor's amax before casting it
    current = r.get("fp8_recipe") == "current scaling" or any(w in label for w in ("fp8-cs", "tensorwise",
                                                                                    "float8 linears"))
    precision = ("fp8-cs" if current else "fp8") if fp8 else "bf16"
    if "--fp16" in label:
        # Megatron-LM of 2021 kept fp16 runs' gradients, and all-reduced them, in fp16 unless told
        # otherwise (--accumulate-allreduce-grads-in-fp32); a row says which (grad_reduce_dtype)
        precision = "fp16-grad16" if r.get("grad_reduce_dtype") == "fp16" else "fp16"
    m = max(1, gb // (int(mb) * dp))
    overlap = str(r.get("comm_overlap") or "")
    zero_text = str(r.get("distributed_optimizer_zero") or "").lower()
    if "--overlap-param-gather" in overlap and not zero_text:
        # Megatron-LM gathers parameters during forward only with its distributed optimizer
        # (megatron-core DistributedDataParallel acts on overlap_param_gather only with
        # use_distributed_optimizer): the flag implies ZeRO-1
        zero_text = "distributed optimizer"
        assumed.append("distributed optimizer (implied by --overlap-param-gather)")
    if "shard_grad_op" in zero_text:  # FSDP's ZeRO-2
        zero = 2
    elif "zero-3" in zero_text or "full_shard" in zero_text or "fsdp" in zero_text:
        zero = 3
    else:
        zero = 1 if ("zero-1" in zero_text or "distributed" in zero_text) else 0
    runtime = Runtime.MEGATRON
    source = str(r["source"]).lower()
    if "torchtitan" in source:
        runtime = Runtime.TORCHTITAN
    elif "zero-3" in zero_text and "deepspeed" in zero_text:
        runtime = Runtime.DEEPSPEED
    elif "megatron fsdp" in zero_text:
        # Megatron-Core's own FSDP (Megatron-FSDP): Megatron-LM's kernels and buffers, its gradients
        # reduce-scattered into sharded main-gradient buffers every micro-batch (not PyTorch's FSDP2,
        # which accumulates unsharded gradients between micro-batches)
        assumed.append("Megatron-FSDP priced as Megatron-LM with ZeRO-3")
    elif "fsdp" in zero_text:
        runtime = Runtime.TORCH
    tp_overlap = "--tp-comm-overlap" in overlap and runtime is Runtime.MEGATRON
    param_overlap = "--overlap-param-gather" in overlap and runtime is Runtime.MEGATRON and zero in (1, 2)
    sp = bool(r.get("sequence_parallel"))
    if r.get("sequence_parallel") is None and "--tp-comm-overlap" in overlap and tp > 1:
        # Megatron-LM refuses --tp-comm-overlap without --sequence-parallel (its argument check:
        # Transformer Engine overlaps only all-gather / reduce-scatter with the GEMMs)
        sp = True
        assumed.append("sequence parallel (implied by --tp-comm-overlap)")
    vp = r.get("virtual_pipeline")
    v = vp if isinstance(vp, int) else 1
    if isinstance(vp, str) and "(m=3)" in vp:
        v = 3
    elif isinstance(vp, str) and pp > 1:
        assumed.append("no interleaving (degree not stated)")
    schedule = Schedule.INTERLEAVED if v > 1 and pp > 1 and m % pp == 0 else Schedule.ONE_F_ONE_B
    gpu, remark, stand_in = _gpu(str(r.get("gpu")))
    assert gpu is not None
    if "compile" in (str(r.get("techniques") or "") + str(r.get("quote") or "")).lower():
        remark = "; ".join(x for x in (remark, "torch.compile (parplan prices eager kernels)") if x)
    if tp_overlap and tp > 1:
        assumed.append("TP communication under the GEMMs (--tp-comm-overlap)")
    if param_overlap and dp > 1:
        assumed.append("weight all-gather under the next forward (--overlap-param-gather)")

    flash = not str(r["source"]).startswith(_BEFORE_FLASH)
    if not flash:
        assumed.append("no flash attention (scores written to HBM)")
    grad_overlap = not (runtime is Runtime.MEGATRON and dp > 1 and str(r["source"]).startswith(_BEFORE_GRAD_OVERLAP))
    if r.get("ddp_impl") == "torch" and dp > 1:
        # --DDP-impl torch: PyTorch's DistributedDataParallel all-reduces its gradient buckets during
        # the (last micro-batch's) backward
        grad_overlap = True
        assumed.append("gradients all-reduced during the backward (--DDP-impl torch)")
    if not grad_overlap:
        assumed.append("gradients reduced after the last backward (the trainer had no overlap then)")

    # Megatron-LM of February 2021 to January 2023 split a hand-off over the TP ranks (its default then)
    scatter_gather = bool(r.get("scatter_gather_optimization")) and runtime is Runtime.MEGATRON and pp > 1
    if scatter_gather and tp > 1 and not sp:
        assumed.append("pipeline hand-offs split over TP and all-gathered (Megatron-LM's scatter/gather of 2021-22)")

    def layout(recompute: Recompute) -> ParallelConfig:
        return ParallelConfig(tp=tp, pp=pp, dp=dp, zero=zero if dp > 1 else 0,
                              sequence_parallel=sp and tp > 1,
                              recompute=recompute, micro_batch=int(mb),
                              num_microbatches=m, schedule=schedule,
                              virtual_stages=v if schedule is Schedule.INTERLEAVED else 1,
                              precision=precision, cp=cp, runtime=runtime,
                              tp_comm_overlap=tp_overlap and tp > 1,
                              overlap_param_gather=param_overlap and dp > 1, flash_attention=flash,
                              overlap_grad_reduce=grad_overlap, pp_scatter_gather=scatter_gather)

    # GPUs a node shares NVLink among: eight in every DGX/HGX server; a row says where its NVLink domain
    # differs (GB200 NVL72 racks, of which Megatron-Bridge's scripts use 64 GPUs)
    per_node = int(r.get("gpus_per_node") or 8)
    model, cluster = ModelSource(cfg.name, config=cfg), make_cluster(gpus, per_node, gpu)
    if r.get("attention_impl") == "triton":
        # llm-foundry's Triton flash-attention kernel, for which parplan has no figures
        remark = "; ".join(x for x in (remark, "Triton flash attention (attn_impl triton) priced as PyTorch's "
                                       "FlashAttention-2") if x)
    if r.get("cpu_offload"):
        remark = "; ".join(x for x in (remark, f"CPU offload of {r['cpu_offload']} not priced") if x)
    stated = _recompute(r.get("recompute"), assumed)
    if stated is None and str(r["source"]).startswith(_FULL_RECOMPUTE_ONLY):
        stated = Recompute.FULL
        assumed.append("recompute full (the only recomputation of Megatron-LM in 2021)")
    if stated is None:
        # unstated: selective recomputation (Megatron-LM's usual choice) where it fits the GPU's
        # memory in parplan's memory model, else full recomputation (the run did fit)
        e = evaluate(model, cluster, layout(Recompute.SELECTIVE), seq_len=seq)
        if e.fits:
            assumed.append("recompute selective")
        else:
            assumed.append(f"recompute full (selective needs {e.memory.peak_bytes / 2**30:.0f} GiB)")
            e = evaluate(model, cluster, layout(Recompute.FULL), seq_len=seq)
    else:
        e = evaluate(model, cluster, layout(stated), seq_len=seq)
    if runtime is Runtime.TORCHTITAN and e.strategy.recompute is Recompute.SELECTIVE:
        # torchtitan's selective checkpointing (its Llama 3 configs' default) works per operator:
        # every other matmul and the elementwise operators rerun in backward. parplan's selective is
        # Megatron-LM's, which with flash attention reruns nothing.
        assumed.append("torchtitan's per-operator selective checkpointing (reruns every other matmul) is not "
                       "expressible: priced without recomputation")
    strategy = e.strategy
    published = float(r.get("step_seconds") or r["step_seconds_derived"])
    return {"source": r["source"], "params": r["params"], "gpus": gpus, "gpu": gpu,
            "layout": strategy.describe() + (f" {precision}" if precision != "bf16" else ""), "published_s": published,
            "published_kind": "printed" if r.get("step_seconds") else "derived",
            "predicted_s": e.time.step_seconds, "ratio": e.time.step_seconds / published,
            "assumed": ", ".join(assumed), "remark": remark, "stand_in": stand_in, "runtime": runtime.value}


def measure() -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
    """Every priced row, and the rows left out with the reason. Rows on a GPU parplan has no preset
    for but prices with a stand-in (``stand_in``, :func:`_gpu`) are among the priced; :func:`split`
    parts them."""
    with open(DATA) as f:
        data = json.load(f)
    rows, skipped = [], []
    for r in data["runs"]:
        why = _skip_reason(r)
        if why is None:
            try:
                rows.append(price(r))
            except Exception as e:  # a layout parplan rejects is reported, not hidden
                skipped.append((r["source"], r["params"], f"parplan refused: {e}"))
        else:
            skipped.append((r["source"], r["params"], why))
    return rows, skipped


def split(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(counted rows, rows priced on a stand-in GPU): torchtitan's 500 W HBM2e H100s have no datasheet
    (their peak is unknown), so they are shown, priced as the SXM preset, but not counted."""
    return [x for x in rows if not x["stand_in"]], [x for x in rows if x["stand_in"]]


def _table(rows: list[dict[str, Any]]) -> None:
    print("| source | model | GPUs | layout | published s | predicted s | ratio | assumed | remark |")
    print("|---|---|---:|---|---:|---:|---:|---|---|")
    for x in rows:
        print(f"| {x['source']} | {x['params']} | {x['gpus']} {x['gpu']} | {x['layout']} | "
              f"{x['published_s']:.3f} ({x['published_kind']}) | {x['predicted_s']:.3f} | {x['ratio']:.2f} | "
              f"{x['assumed']} | {x['remark']} |")


def _figures(ratios: list[float]) -> dict[str, Any]:
    geo = math.exp(sum(math.log(q) for q in ratios) / len(ratios))
    # unrounded: a plan's note rounds once, as the table here does (1.2147 stored as 1.215 printed 1.22)
    return {"rows": len(ratios), "geometric_mean_ratio": geo, "min_ratio": min(ratios), "max_ratio": max(ratios),
            "within_10_percent": sum(1 for q in ratios if abs(q - 1) <= 0.10)}


def summary(rows: list[dict[str, Any]], not_counted: int = 0) -> dict[str, Any]:
    """What a plan shows beside its time (parplan/solver/time_accuracy.json), over the counted rows
    (``not_counted``: how many more were priced on a stand-in GPU), and ``by_kind``: the same
    figures over the rows of each runtime on each GPU generation."""
    kinds: dict[tuple[str, str], list[float]] = defaultdict(list)
    for x in rows:
        kinds[(gpu_generation(x["gpu"]), x["runtime"])].append(x["ratio"])
    return {**_figures([x["ratio"] for x in rows]), "sources": len({x["source"] for x in rows}),
            "not_counted": not_counted, "measured_by": "bench/time_model_accuracy.py",
            "by_kind": [{"generation": g, "runtime": rt, **_figures(qs)} for (g, rt), qs in sorted(kinds.items())]}


def main() -> None:
    priced, skipped = measure()
    rows, stand_in = split(priced)
    with open(DATA) as f:
        total = len(json.load(f)["runs"])
    print(header("Time model against published training runs (issue 12)"))
    print(f"data: bench/data/published_runs.json ({total} rows, {len(rows)} priced and counted, "
          f"{len(stand_in)} priced on a stand-in GPU)\n")
    _table(rows)
    ratios = [x["ratio"] for x in rows]
    by_source: dict[str, list[float]] = defaultdict(list)
    for x in rows:
        by_source[x["source"]].append(x["ratio"])
    s = summary(rows, len(stand_in))
    print(f"\nall {s['rows']} rows: geometric mean {s['geometric_mean_ratio']:.3f}, min {min(ratios):.2f}, "
          f"max {max(ratios):.2f}, within 10%: {s['within_10_percent']}")
    for src, qs in sorted(by_source.items()):
        g = math.exp(sum(math.log(q) for q in qs) / len(qs))
        print(f"- {src}: {len(qs)} rows, geometric mean {g:.3f}, {min(qs):.2f} to {max(qs):.2f}")
    print("\nby runtime and GPU generation (what a plan of that kind shows beside its time):")
    for k in s["by_kind"]:
        print(f"- runtime {k['runtime']} on {k['generation']}: {k['rows']} rows, geometric mean "
              f"{k['geometric_mean_ratio']:.3f}, {k['min_ratio']:.2f} to {k['max_ratio']:.2f}, "
              f"within 10%: {k['within_10_percent']}")
    if stand_in:
        qs = [x["ratio"] for x in stand_in]
        g = math.exp(sum(math.log(q) for q in qs) / len(qs))
        print(f"\nnot counted: {len(stand_in)} rows on a GPU without a preset, priced as the SXM preset "
              f"(geometric mean {g:.3f}, {min(qs):.2f} to {max(qs):.2f}):\n")
        _table(stand_in)
    print("\nleft out:")
    for src, params, why in skipped:
        print(f"- {src}, {params}: {why}")
    if "--write" in sys.argv[1:]:
        with open(ACCURACY_FILE, "w") as f:
            json.dump(s, f, indent=2)
            f.write("\n")
        print(f"\nwrote {os.path.relpath(ACCURACY_FILE)}")


if __name__ == "__main__":
    main()
