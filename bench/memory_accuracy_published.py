"""parplan's memory and fit verdict against the published per-GPU memory of multi-GPU training runs
(bench/data/published_memory_runs.json; its fields: bench/data/README.md).

Each row is priced with the closest parplan configuration (``evaluate``: the row's model shape, degrees,
micro-batch, ZeRO/FSDP with HSDP's shard group as ``dp_shard``, recomputation and runtime) on the row's GPU
preset, then compared with the row's counter: ``max_allocated`` with the allocated peak, ``max_reserved``
with the reserved peak, ``device_total_used`` with the reserved peak plus the CUDA context and NCCL
buffers, ``unknown`` with the reserved peak (the larger of the two counters). A Megatron-LM row with its launch
flags (Megatron-LM's CI) is priced as ``parplan memory --from megatron-args`` reads them (:func:`_imported`: its
model, degrees, precision, recomputation, overlaps and attention core); a flag the import refuses shows the row
apart with the import's reason. Error = published /
predicted − 1. Every row's verdict is checked: a completed run must not be predicted not to fit, an
out-of-memory run must be predicted not to fit.

Every row is *counted* or *shown apart* with its reason (a feature parplan does not build, a configuration
the source leaves open); a row shown apart is still priced where it can be, for information, but enters no
figure. None is dropped.

The Ultra-Scale Playbook's rows (nanotron) are priced as they ran by ``nanotron_published.py``
(``price_playbook_row``: world rank 0's allocated peak through parplan's nanotron import, runtime
``nanotron``); their counter is not stated and is compared as ``unknown`` (the reserved peak:
docs/nanotron.md). The playbook is sampled: every ``PLAYBOOK_STRIDE``-th row is priced and counted, the
rest shown apart as outside the sample (say ``--all`` to price and count every one). Graphs of the other
rows are built once per (shape, micro-batch, sequence) and their unit costs reused.

Run: python bench/memory_accuracy_published.py [--all]   (writes bench/out/memory_accuracy_published.txt)
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import sys
from collections import Counter, defaultdict
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench._common import header
from bench.nanotron_published import price_playbook_row
from parplan.imports.common import Imported, ImportProblemError
from parplan.imports.megatron import read_megatron_args
from parplan.solver.cluster import GIB, Cluster, make_cluster
from parplan.solver.cost.activations import Recompute
from parplan.solver.cost.runtime import Runtime
from parplan.solver.cost.units import GraphCosts
from parplan.solver.device_memory import FitVerdict, device_memory, reserved_peak_bytes, verdict
from parplan.solver.errors import ConfigError, SolverError
from parplan.solver.evaluate import evaluate_graph
from parplan.solver.frontends.config import TransformerConfig
from parplan.solver.ir import Graph
from parplan.solver.models import ModelSource
from parplan.solver.strategy import ParallelConfig, Schedule

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "published_memory_runs.json")
OUT = os.path.join(HERE, "out", "memory_accuracy_published.txt")
PLAYBOOK_STRIDE = 20
SAMPLE_REASON = f"outside the priced sample (every {PLAYBOOK_STRIDE}th Playbook row; --all prices every one)"

_GRAPHS: dict[tuple[Any, ...], tuple[Graph, GraphCosts]] = {}


def apart_reason(r: dict[str, Any]) -> str | None:
    """Why row ``r`` is shown apart (None: counted)."""
    ac = str(r.get("activation_checkpointing") or "")
    launch = _launch(r)
    zero = str(r.get("zero_fsdp") or "")
    if r["source_group"] == "colossalai":
        return "Colossal-AI Gemini runtime not built"
    if "per-op" in ac and _runtime(r) is Runtime.MEGATRON and not _from_flags(r):
        return "per-operator selective checkpointing outside PyTorch-native trainers not built"
    if r.get("fp8") and not _from_flags(r) and _float8(r) is None:
        return "Float8 training as this trainer runs it not built"
    if r.get("compile"):
        return "torch.compile (parplan prices eager kernels and buffers)"
    if str(r.get("offload") or "none") != "none":
        return "offloading not priced"
    if int(r.get("ep") or 1) > 1 and not _from_flags(r):
        return "a mixture of experts without its Megatron-LM flags (its model and layout are read from them)"
    if _from_flags(r):
        megatron = _megatron_apart(r, launch)
        if megatron is not None:
            return megatron
        try:
            _imported(r)
        except (ImportProblemError, ValueError) as exc:
            problems = exc.problems if isinstance(exc, ImportProblemError) else [str(exc)]
            return "as parplan's Megatron-LM import reads it: " + "; ".join(problems)
        return None  # its model, strategy and recomputation are the import's
    if r["model"].get("layers") is None:
        return "model sizes not in the row (a config name only)"
    if re.search(r"(?<!no )HSDP", zero) and _hsdp_shard(r) is None:
        return "HSDP without its shard and replicate degrees"
    if "Megatron FSDP" in zero or "DeepSpeed" in zero:
        return f"sharding not built as run ({zero.split(',')[0][:40]})"
    if r["outcome"] == "completed" and r.get("memory_gib") is None and r.get("memory_pct_of_device") is None:
        return None  # verdict only
    if not ac or "not stated" in ac:
        return "recomputation not stated"
    return None


def _megatron_apart(r: dict[str, Any], launch: dict[str, Any]) -> str | None:
    """Why a Megatron-LM row is shown apart: a flag that changes what the measured rank holds and that
    parplan does not build, or a run on fewer GPUs than the row states."""
    if "--cross-entropy-loss-fusion" in launch:
        # fusions/fused_cross_entropy.py: the loss's in-place steps under torch.compile (core/jit.py's
        # jit_fuser); the CI measures about one fp32 logits-sized buffer more than the unfused loss
        return "Megatron-LM's --cross-entropy-loss-fusion (torch.compile'd loss) not built"
    gb, mb = r.get("global_batch"), r.get("micro_batch")
    dp = int(r["gpus"]) // (int(r.get("tp") or 1) * int(r.get("pp") or 1) * int(r.get("cp") or 1))
    if gb and mb and int(gb) < int(mb) * dp:
        # arguments.py asserts the global batch is a multiple of micro-batch x data-parallel size
        return f"global batch {gb} is less than micro-batch {mb} x {dp} data-parallel ranks: fewer GPUs ran"
    return None


def _from_flags(r: dict[str, Any]) -> bool:
    """Whether row ``r`` is a Megatron-LM run with its launch flags (priced as ``parplan memory --from
    megatron-args`` reads them: :func:`_imported`)."""
    return _runtime(r) is Runtime.MEGATRON and bool(_launch(r))


_IMPORTED: dict[str, Imported] = {}


def _imported(r: dict[str, Any]) -> Imported:
    """A Megatron-LM row's launch flags, with its vocabulary (:func:`_vocab`), read by parplan's
    Megatron-LM import on the row's GPUs: its model and strategy as ``parplan memory --from
    megatron-args`` prices them."""
    if r["id"] not in _IMPORTED:
        words = []
        for name, value in _launch(r).items():
            if value is True:
                words.append(name)
                continue
            text = str(value)
            if text.startswith("[") and text.endswith("]"):  # a list flag (nargs="*") as the CI's YAML writes it
                text = text[1:-1]
            words += [name, *([shlex.quote(w) for w in text.split()] or ["''"])]
        words += ["--vocab-size", str(_vocab(r))]
        _IMPORTED[r["id"]] = read_megatron_args(" ".join(words), gpus=int(r["gpus"]))
    return _IMPORTED[r["id"]]


def _float8(r: dict[str, Any]) -> str | None:
    """The parplan precision of a torchtitan row's torchao Float8 (its tensorwise recipe, with FSDP2's float8
    all-gather where the row's config sets it); None for other rows and recipes not priced."""
    text = str(r.get("fp8") or "")
    tensorwise = "tensorwise" in text or "quantize.linear.float8" in text  # the converter's default recipe
    titan = (Runtime.TORCHTITAN, Runtime.TORCHTITAN_UNCHUNKED_LOSS)
    if _runtime(r) not in titan or "torchao" not in text.lower() or not tensorwise:
        return None
    return "fp8-torchao-fsdp8" if "enable_fsdp_float8_all_gather" in text else "fp8-torchao"


def _precision(r: dict[str, Any]) -> str:
    """The row's precision: its Float8 (:func:`_float8`) or bf16, with Transformer Engine FusedAdam's stored
    remainders (``-remainders``: the fp32 master as the bf16 weight and its 16-bit remainder) where the row's
    optimizer is TE's ``FusedAdam`` with ``master_weights`` and ``store_param_remainders`` (NeMo Automodel's
    rows), and bf16 moments (``-moments-bf16``) where it says ``exp_avg/exp_avg_sq bf16``."""
    base, text = _float8(r) or "bf16", str(r.get("optimizer") or "")
    if "FusedAdam" not in text or "master_weights" not in text or not re.search(r"store_param_remainders(?! false)",
                                                                                  text):
        return base
    return f"{base}-remainders" + ("-moments-bf16" if "exp_avg/exp_avg_sq bf16" in text else "")


def _gpu(r: dict[str, Any]) -> tuple[str, float | None]:
    """The preset for the row's GPU and a memory override (GiB) where the part differs from the preset."""
    text = str(r.get("gpu") or "")
    if "GB200" in text:
        return "GB200-186GB", None
    if "H200" in text:
        return "H200-141GB", None
    if "96 GB" in text:
        return "H100-80GB", 95.0  # torchtitan's H100 96GB (Grand Teton): the 95 GiB its logs divide by
    if "H100" in text:
        return "H100-80GB", None
    return "A100-80GB", None  # A100 80GB, A800 80GB, and the CI's DGX A100 (size not stated: 80 GB assumed)


def _recompute(r: dict[str, Any]) -> Recompute:
    ac = str(r.get("activation_checkpointing") or "none").lower()
    if ac.startswith("full") or "granularity full" in ac:
        return Recompute.FULL
    if "per-op" in ac:  # torchtitan's selective_ac_option 'op'
        return Recompute.OP
    if "selective" in ac:  # Megatron-LM's rows read their --recompute-modules through the import
        return Recompute.SELECTIVE
    return Recompute.NONE


def _zero(r: dict[str, Any]) -> int:
    z = str(r.get("zero_fsdp") or "").lower()
    if "fsdp" in z or "zero-3" in z:
        return 3
    if "zero-2" in z:
        return 2
    if "zero-1" in z or "distributed optimizer" in z:
        return 1
    return 0


def _hsdp_shard(r: dict[str, Any]) -> int | None:
    """The shard group of a row whose sharding text states HSDP as 'shard S x replicate R' (S x R = the
    data-parallel ranks); None otherwise."""
    m = re.search(r"(?<!no )HSDP\b.*?shard (\d+) x replicate (\d+)", str(r.get("zero_fsdp") or ""))
    return int(m.group(1)) if m else None


#: torchtitan commits whose trainer's loss was not chunked, as read there: train.py's ``loss_fn``,
#: ``cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))``, never compiled ("compiling loss
#: function causes CUDA errors, turning off for now"), on the model's whole bf16 output.
TORCHTITAN_UNCHUNKED_LOSS_COMMITS = ("9dec370ad26b",)


def _runtime(r: dict[str, Any]) -> Runtime:
    fw = str(r.get("framework") or "").lower()
    if "torchtitan" in fw:
        version = str(r.get("framework_version") or "")
        if version.startswith(TORCHTITAN_UNCHUNKED_LOSS_COMMITS):
            return Runtime.TORCHTITAN_UNCHUNKED_LOSS
        return Runtime.TORCHTITAN
    if "automodel" in fw:
        return Runtime.TORCH
    return Runtime.MEGATRON  # Megatron-LM, ms-swift's Megatron backend, and nanotron's closest


def _launch(r: dict[str, Any]) -> dict[str, Any]:
    """The row's launch flags (Megatron-LM's CI rows and ms-swift's), empty where the row has none."""
    other = r.get("other")
    return dict(other.get("launch_args") or {}) if isinstance(other, dict) else {}


def layout(r: dict[str, Any]) -> ParallelConfig:
    """The closest parplan strategy for row ``r`` (one without Megatron-LM's launch flags)."""
    tp, pp, cp = int(r.get("tp") or 1), int(r.get("pp") or 1), int(r.get("cp") or 1)
    dp = int(r["gpus"]) // (tp * pp * cp)
    local = r.get("local_batch")
    # no micro-batch stated: the local batch in one micro-batch (torchtitan accumulates only when told)
    mb = int(r.get("micro_batch") or (local if not r.get("grad_accum") and local else 1))
    m = int(r.get("grad_accum") or r.get("pp_microbatches") or (int(local) // mb if local else 1))
    v = int(r.get("virtual_stages") or 1)
    sched = Schedule.INTERLEAVED if pp > 1 and v > 1 and m % pp == 0 else Schedule.ONE_F_ONE_B
    zero = _zero(r) if dp * cp > 1 else 0  # both trainers shard over the data- and context-parallel ranks
    return ParallelConfig(tp=tp, pp=pp, dp=dp, zero=zero, dp_shard=_hsdp_shard(r) or 0,
                          sequence_parallel=bool(r.get("sequence_parallel")) and tp > 1,
                          recompute=_recompute(r), micro_batch=mb, num_microbatches=max(1, m), schedule=sched,
                          virtual_stages=v if sched is Schedule.INTERLEAVED else 1, cp=cp, runtime=_runtime(r),
                          precision=_precision(r))


def _vocab(r: dict[str, Any]) -> int:
    """The row's vocabulary; Megatron-LM's CI rows leave GPT-2's BPE (50,257 tokens) padded to a multiple
    of --make-vocab-size-divisible-by x TP (megatron/training/tokenizer: _vocab_size_with_padding)."""
    if r["model"].get("vocab") is not None:
        return int(r["model"]["vocab"])
    text = " ".join(a for a in r.get("ambiguous") or [] if "GPT2BPETokenizer" in a)
    if not text:
        raise ValueError("vocabulary not stated")
    m = re.search(r"make-vocab-size-divisible-by \((\d+)", text)
    multiple = int(m.group(1) if m else 128) * int(r.get("tp") or 1)
    return -(-50257 // multiple) * multiple


def _graph(r: dict[str, Any], mb: int) -> tuple[Graph, GraphCosts]:
    md = dict(r["model"], vocab=_vocab(r))
    seq = int(r["seq_len"])
    key = (md["layers"], md["hidden"], md["heads"], md.get("kv_heads"), md.get("ffn"), md.get("vocab"),
           bool(md.get("tied_embeddings")), mb, seq)
    if key not in _GRAPHS:
        cfg = TransformerConfig(family="llama", name=str(md["name"])[:40], layers=int(md["layers"]),
                                hidden=int(md["hidden"]), heads=int(md["heads"]), ffn=int(md["ffn"]),
                                vocab=int(md["vocab"]), seq_len=seq, kv_heads=md.get("kv_heads"),
                                tied_embeddings=bool(md.get("tied_embeddings")))
        g = ModelSource(cfg.name, config=cfg).build(mb, seq)
        _GRAPHS[key] = (g, GraphCosts(g))
    return _GRAPHS[key]


def _published_gib(r: dict[str, Any], cluster: Cluster) -> float | None:
    if r.get("memory_gib") is not None:
        return float(r["memory_gib"])
    if r.get("memory_pct_of_device") is not None:  # torchtitan's log: % of the capacity torch reports
        return float(r["memory_pct_of_device"]) / 100 * device_memory(cluster).visible_bytes / GIB
    return None


def _cluster(r: dict[str, Any]) -> Cluster:
    gpu, override = _gpu(r)
    return make_cluster(int(r["gpus"]), int(r.get("gpus_per_node") or min(8, int(r["gpus"]))), gpu, override)


def _compared(r: dict[str, Any], cluster: Cluster, v: FitVerdict, rank_allocated: float) -> dict[str, Any]:
    """The row's counter against the prediction at the rank it reports (``rank_allocated``: that rank's
    allocated peak, bytes), and the verdict ``v`` of the plan's most loaded rank against the outcome."""
    dm = device_memory(cluster)
    reserved = reserved_peak_bytes(rank_allocated)
    predicted = {"max_allocated": rank_allocated,
                 "device_total_used": reserved + dm.context_bytes + dm.communicator_bytes}.get(
        str(r.get("counter")), reserved) / GIB
    published = _published_gib(r, cluster)
    wrong = (r["outcome"] == "completed" and not v.fits) or (r["outcome"] == "oom" and v.fits)
    return {"gpu": _gpu(r)[0], "allocated_gib": rank_allocated / GIB, "reserved_gib": reserved / GIB,
            "usable_gib": v.usable_bytes / GIB, "fits": v.fits, "predicted_gib": predicted,
            "published_gib": published, "error": None if published is None else published / predicted - 1,
            "wrong_verdict": wrong}


def price(r: dict[str, Any]) -> dict[str, Any]:
    """Row ``r`` priced: allocated and reserved peaks, the verdict, the published figure and the error.
    A Megatron-LM run with its launch flags is priced with the model and strategy parplan's Megatron-LM
    import reads from them (:func:`_imported`)."""
    cluster = _cluster(r)
    if _from_flags(r):
        imported = _imported(r)
        assert imported.model is not None and imported.model.config is not None
        s = imported.strategy
        key = (imported.model.config, s.micro_batch, imported.seq_len)
        if key not in _GRAPHS:
            g = imported.model.build(s.micro_batch, imported.seq_len)
            _GRAPHS[key] = (g, GraphCosts(g))
        g, gc = _GRAPHS[key]
    else:
        s = layout(r)
        g, gc = _graph(r, s.micro_batch)
    e = evaluate_graph(g, str(r["model"]["name"]), g.parameter_count(), cluster, s, costs=gc)
    rank = e.memory.peak_bytes  # the most loaded rank, where the row names none
    if str(r.get("memory_rank") or "").startswith("last rank") and e.memory.stages:
        rank = e.memory.stages[-1].peak_bytes  # Megatron-LM's TensorBoard writer: the last pipeline stage
    return {"layout": s.describe()} | _compared(r, cluster, verdict(e.memory.peak_bytes, cluster), rank)


def price_playbook(r: dict[str, Any]) -> dict[str, Any]:
    """A playbook row priced as it ran (``price_playbook_row``): its figure (world rank 0's) against stage
    0's prediction, the verdict on the most loaded stage (stage 0 where it is priced alone); ``apart`` set
    to its reason where the row cannot be priced."""
    p = price_playbook_row(r)
    if p.apart is not None or p.stage0_gib is None:
        return {"apart": p.apart or "not priced", "not_priced": p.apart}
    cluster = _cluster(r)
    res = _compared(r, cluster, verdict((p.peak_gib or p.stage0_gib) * GIB, cluster), p.stage0_gib * GIB)
    mega = None if p.megatron_stage0_gib is None else p.measured_gib * GIB / reserved_peak_bytes(
        p.megatron_stage0_gib * GIB) - 1
    return {"layout": f"tp{r['tp']} pp{r['pp']} dp{r['dp']} {r['zero_fsdp'].lower()} mb{r['micro_batch']}x"
                      f"{r['grad_accum']} nanotron" + ("" if p.peak_gib is not None else " (stage 0 alone)"),
            "megatron_error": mega} | res


def run(all_rows: bool) -> list[dict[str, Any]]:
    """Every row, counted or shown apart, priced where it can be."""
    with open(DATA) as f:
        rows = json.load(f)["runs"]
    out = []
    playbook = 0
    for r in rows:
        reason = apart_reason(r)
        res: dict[str, Any] = {"id": r["id"], "source": r["source_group"], "counter": r.get("counter"),
                               "outcome": r["outcome"], "apart": reason}
        if r["source_group"] == "ultrascale_playbook":
            sampled = all_rows or playbook % PLAYBOOK_STRIDE == 0
            playbook += 1
            res |= price_playbook(r) if sampled else {"apart": SAMPLE_REASON, "not_priced": SAMPLE_REASON}
            out.append(res)
            continue
        try:
            res |= price(r)
        except (ConfigError, SolverError, ValueError, KeyError, TypeError) as exc:
            res["not_priced"] = f"{type(exc).__name__}: {exc}"[:160]
            if reason is None:
                res["apart"] = "configuration parplan cannot express: " + res["not_priced"]
        out.append(res)
    return out


TARGET = {"max_allocated": (-0.02, 0.08), "max_reserved": (-0.10, 0.10)}


def _within(row: dict[str, Any]) -> bool | None:
    lo, hi = TARGET.get(str(row["counter"]), (-0.10, 0.10))
    return None if row.get("error") is None else lo <= row["error"] <= hi


def summary_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per source: rows, counted, shown apart (by reason), median error, within target, wrong verdicts."""
    by: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        by[r["source"]].append(r)
    lines = ["| source | rows | counted | with a figure | median error | within target | wrong verdicts "
             "(counted) | shown apart |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for src, rs in by.items():
        counted = [r for r in rs if r["apart"] is None]
        errs = [r["error"] for r in counted if r.get("error") is not None]
        within = sum(1 for r in counted if _within(r))
        wrong = sum(1 for r in counted if r.get("wrong_verdict"))
        apart = Counter(r["apart"] for r in rs if r["apart"] is not None)
        med = f"{statistics.median(errs):+.1%}" if errs else "-"
        lines.append(f"| {src} | {len(rs)} | {len(counted)} | {len(errs)} | {med} | {within} of {len(errs)} | "
                     f"{wrong} of {len(counted)} | " + "; ".join(f"{n}: {k}" for k, n in apart.most_common()) + " |")
    return lines


def _fmt(x: float | None, pct: bool = False) -> str:
    if x is None:
        return "-"
    return f"{x:+.1%}" if pct else f"{x:.1f}"


def row_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Every row, one line each, but the Playbook's outside the priced sample."""
    lines = ["| row | counter | outcome | layout | published GiB | allocated GiB | reserved GiB | usable GiB | "
             "error | verdict | shown apart |",
             "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in rows:
        if r["apart"] == SAMPLE_REASON:
            continue
        verdict_text = "-" if "fits" not in r else ("fits" if r["fits"] else "does not fit") + (
            " (WRONG)" if r["wrong_verdict"] else "")
        cells = [r["id"], r["counter"], r["outcome"], r.get("layout", r.get("not_priced", "-")),
                 _fmt(r.get("published_gib")), _fmt(r.get("allocated_gib")), _fmt(r.get("reserved_gib")),
                 _fmt(r.get("usable_gib")), _fmt(r.get("error"), True), verdict_text, r["apart"] or ""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def playbook_lines(rows: list[dict[str, Any]]) -> list[str]:
    """What of the Playbook is counted, and its sample under the runtime ``megatron`` for comparison."""
    pb = [r for r in rows if r["source"] == "ultrascale_playbook"]
    sample = [r for r in pb if r["apart"] != SAMPLE_REASON]
    if not pb:
        return []
    scope = (f"sampled ({len(sample)} of {len(pb)} rows, every {PLAYBOOK_STRIDE}th), priced" if len(sample) < len(pb)
             else f"every one of its {len(pb)} rows priced")
    line = (f"Ultra-Scale Playbook: {scope} with the runtime `nanotron` as they ran (bench/nanotron_published.py); "
            "the priced rows are what is counted, the others are shown apart. Its figure (world rank 0's, counter "
            "not stated) is compared with stage 0's reserved prediction.")
    mega = [r["megatron_error"] for r in sample if r.get("megatron_error") is not None]
    if mega:
        line += (f" The same rows under the runtime `megatron` (Megatron-LM's buffers, even layer split): median "
                 f"error {statistics.median(mega):+.1%}.")
    return [line]


def main() -> None:
    rows = run("--all" in sys.argv[1:])
    text = [header("Published multi-GPU memory: parplan's allocated and reserved peaks and fit verdict"), "",
            "Targets: rows reporting allocated memory within -2%..+8% of the allocated prediction, reserved "
            "(and unknown) within +-10% of the reserved prediction; error = published / predicted - 1.", "",
            *summary_lines(rows), "", *playbook_lines(rows), "", *row_lines(rows), ""]
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        f.write("\n".join(text))
    print("\n".join(summary_lines(rows)))


if __name__ == "__main__":
    main()
