"""Model and GPU presets (static; computed once)."""

from __future__ import annotations

from functools import cache
from typing import Any

from parplan.solver.cluster import GPU_PRESETS, Link
from parplan.solver.frontends.presets import PRESETS
from parplan.solver.models import ModelSource


@cache
def model_presets() -> list[dict[str, Any]]:
    out = []
    for name, cfg in PRESETS.items():
        out.append({"name": name, "family": cfg.family, "parameters": ModelSource(name, config=cfg).parameter_count(),
                    "layers": cfg.total_layers, "hidden": cfg.hidden, "heads": cfg.heads, "kv_heads": cfg.n_kv_heads,
                    "ffn": cfg.ffn, "vocab": cfg.vocab, "seq_len": cfg.tokens_per_sample,
                    "experts": cfg.num_experts})
    return out


def _link(link: Link) -> dict[str, float]:
    return {"bandwidth_bytes_per_s": link.bandwidth_bytes_per_s, "latency_seconds": link.latency_seconds}


@cache
def gpu_presets() -> list[dict[str, Any]]:
    return [{"name": name, "memory_bytes": g.memory_bytes, "peak_flops": dict(g.peak_flops),
             "hbm_bandwidth_bytes_per_s": g.hbm_bandwidth_bytes_per_s, "intra_node": _link(g.intra_node),
             "inter_node": _link(g.inter_node), "default_gpus_per_node": g.default_gpus_per_node,
             "gpus_per_host": g.gpus_per_host}
            for name, g in GPU_PRESETS.items()]
