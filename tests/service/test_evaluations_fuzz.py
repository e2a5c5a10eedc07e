"""POST /v1/evaluations never answers 500: any text of any kind is priced (200) or a 422 problem.

Texts are valid trainer files with random edits (a value swapped for junk, a flag or key dropped or
duplicated, quotes left open), and random text."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

Headers = dict[str, str]

MEGATRON = ("--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 128 --vocab-size 1000 "
            "--micro-batch-size 1 --global-batch-size 8 --tensor-model-parallel-size 2 --sequence-parallel --bf16")
TORCHTITAN = ("--module llama3 --config llama3_8b --training.seq_len 1024 --training.local_batch_size 1 "
              "--parallelism.tensor_parallel_degree 2 --parallelism.data_parallel_shard_degree 4 "
              "activation_checkpoint:full")
DS = json.dumps({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 2,
                 "zero_optimization": {"stage": 2}, "bf16": {"enabled": True}})
GALVATRON = json.dumps({"pp_deg": 2, "tp_sizes_enc": "2,2,2,2", "tp_consecutive_flags": "1,1,1,1",
                        "dp_types_enc": "0,1,0,1", "checkpoint": "0,0,1,1", "global_bsz": 16, "chunks": 4,
                        "pp_division": "2,2", "pipeline_type": "pipedream_flush", "default_dp_type": "ddp"})
HF = {"model_type": "gpt2", "n_layer": 4, "n_embd": 256, "n_head": 4, "vocab_size": 1000, "n_positions": 128}
SEEDS = {"megatron-args": MEGATRON, "torchtitan-config": TORCHTITAN, "ds-config": DS, "galvatron-config": GALVATRON}
JUNK = st.sampled_from(["0", "-1", "x", "1e9", "", "'", '"', "[", "{}", "null", "true", "2.5", "99999999999", "--",
                        ","])


@st.composite
def edited(draw: Any) -> tuple[str, str]:
    kind = draw(st.sampled_from(sorted(SEEDS)))
    text = SEEDS[kind]
    if draw(st.booleans()):
        return kind, draw(st.text(max_size=200))
    sep = " " if kind in ("megatron-args", "torchtitan-config") else ","
    parts = text.split(sep)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(parts) - 1))
        action = draw(st.sampled_from(["junk", "drop", "dup"]))
        if action == "junk":
            parts[i] = draw(JUNK) if kind in ("megatron-args", "torchtitan-config") else \
                parts[i].split(":")[0] + ":" + draw(JUNK)
        elif action == "drop" and len(parts) > 1:
            parts.pop(i)
        else:
            parts.insert(i, parts[i])
    return kind, sep.join(parts)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=edited())
def test_any_text_is_priced_or_a_422_problem(client: TestClient, reader: Headers, case: tuple[str, str]) -> None:
    kind, text = case
    body: dict[str, Any] = {"kind": kind, "text": text or " ", "cluster": {"gpus": 8}}
    if kind in ("ds-config", "galvatron-config"):
        body["model"] = {"hf_config": HF}
    r = client.post("/v1/evaluations", json=body, headers=reader)
    assert r.status_code in (200, 422), (kind, text, r.status_code, r.text[:500])
    if r.status_code == 422:
        assert r.headers["content-type"] == "application/problem+json"
    else:
        assert r.json()["memory"]["peak_bytes"] > 0
