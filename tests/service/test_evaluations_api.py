"""POST /v1/evaluations: a trainer's own configuration priced as ``parplan memory --from`` prices it;
unknown settings listed; unmodelled settings and sizes that do not add up are 422 problems."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from parplan.exports import export_plan
from parplan.solver.planner import solve
from parplan.solver.request import parse_plan_request

Headers = dict[str, str]
DS = {"train_batch_size": 32, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
      "zero_optimization": {"stage": 3}, "bf16": {"enabled": True}, "optimizer": {"type": "AdamW"},
      "elasticity": {"enabled": False}}


def test_a_deepspeed_config_is_priced_with_what_it_did_not_use_listed(client: TestClient, reader: Headers) -> None:
    r = client.post("/v1/evaluations", json={"kind": "ds-config", "text": json.dumps(DS),
                                             "model": {"preset": "llama-2-7b"}, "cluster": {"gpus": 8}},
                    headers=reader)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["strategy"]["summary"].startswith("tp1 pp1 dp8 zero3") and doc["memory"]["peak_bytes"] > 0
    report = doc["import"]
    # the optimizer's type is read (Adam's states are priced), so it is neither unknown nor ignored
    assert (report["kind"], report["target"], report["unknown"], report["ignored"]) == (
        "ds-config", "deepspeed", ["elasticity"], [])
    # DeepSpeed's default buckets are larger than the deepspeed runtime prices: said, not hidden
    assert any("reduce_bucket_size = 500,000,000 (DeepSpeed's default)" in u for u in report["unpriced"])


def test_an_exported_megatron_plan_prices_as_planned(client: TestClient, reader: Headers) -> None:
    plan = solve(parse_plan_request({"model": {"preset": "llama-2-13b"}, "cluster": {"gpus": 8, "gpu": "A100-40GB"},
                                     "training": {"global_batch": 16}, "target": "megatron"}))
    text = export_plan(plan, "megatron").files["megatron_args.txt"]
    r = client.post("/v1/evaluations", json={"kind": "megatron-args", "text": text,
                                             "cluster": {"gpus": 8, "gpu": "A100-40GB"}}, headers=reader)
    assert r.status_code == 200, r.text
    assert r.json()["memory"]["peak_bytes"] == plan["memory"]["peak_bytes"]
    assert r.json()["time"]["step_seconds"] == plan["time"]["step_seconds"]


def test_megatron_context_parallelism_is_priced(client: TestClient, reader: Headers) -> None:
    text = ("--num-layers 4 --hidden-size 1024 --num-attention-heads 16 --seq-length 16384 --vocab-size 50000 "
            "--micro-batch-size 1 --global-batch-size 4 --tensor-model-parallel-size 2 --sequence-parallel "
            "--context-parallel-size {cp} --bf16 --swiglu --disable-bias-linear --normalization RMSNorm "
            "--position-embedding-type rope")
    docs = {}
    for cp in (1, 2):
        r = client.post("/v1/evaluations", json={"kind": "megatron-args", "text": text.format(cp=cp),
                                                 "cluster": {"gpus": 8, "gpu": "H100-80GB"}}, headers=reader)
        assert r.status_code == 200, r.text
        docs[cp] = r.json()
    assert (docs[2]["strategy"]["cp"], docs[2]["strategy"]["dp"]) == (2, 2)
    assert (docs[1]["strategy"]["cp"], docs[1]["strategy"]["dp"]) == (1, 4)
    # one sample of 16K tokens per micro-batch either way; CP halves what each rank holds of it
    one, two = (d["memory"]["stages"][0]["activation_bytes_per_microbatch"] for d in (docs[1], docs[2]))
    assert two == pytest.approx(one / 2, rel=0.02)


def test_configurations_that_cannot_be_priced_are_422_naming_why(client: TestClient, reader: Headers) -> None:
    cases = [
        ({"kind": "ds-config", "text": json.dumps(DS | {"train_batch_size": 30}), "model": {"preset": "llama-2-7b"},
          "cluster": {"gpus": 8}}, "train_batch_size 30"),
        ({"kind": "ds-config", "text": json.dumps(DS), "cluster": {"gpus": 8}}, "give --model"),
        ({"kind": "ds-config", "text": "{nope", "model": {"preset": "llama-2-7b"}, "cluster": {"gpus": 8}},
         "not JSON"),
        ({"kind": "megatron-args", "text": "--num-layers 30 --hidden-size 1024 --num-attention-heads 16 "
                                           "--seq-length 2048 --vocab-size 50000 --micro-batch-size 1 "
                                           "--tensor-model-parallel-size 3", "cluster": {"gpus": 8}},
         "does not divide"),
        ({"kind": "megatron-args", "text": "--num-layers 30 --hidden-size 1024 --num-attention-heads 16 "
                                           "--seq-length 2048 --vocab-size 50000 --micro-batch-size 1 "
                                           "--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4",
          "cluster": {"gpus": 8}}, "layers are not"),
        ({"kind": "megatron-args", "text": "--num-layers 24", "cluster": {"gpus": 8}}, "missing"),
        ({"kind": "torchtitan-config", "text": "--module llama3 --config llama3_8b --training.seq_len 2048 "
                                               "--training.local_batch_size 1 --parallelism.context_parallel_degree 2",
          "cluster": {"gpus": 8}}, "context parallelism"),
        ({"kind": "torchtitan-config", "text": "--module llama3 --config llama3_8b --training.seq_len 2048 "
                                               "--training.local_batch_size 1 --training.dtype bfloat16",
          "cluster": {"gpus": 8}}, "float32 weights"),
        ({"kind": "torchtitan-config", "text": "--module qwen3 --config llama3_8b --training.seq_len 2048 "
                                               "--training.local_batch_size 1", "cluster": {"gpus": 8}},
         "--module qwen3"),
    ]
    for body, why in cases:
        r = client.post("/v1/evaluations", json=body, headers=reader)
        assert r.status_code == 422, (body, r.text)
        assert r.headers["content-type"] == "application/problem+json" and why in r.text, (why, r.text)
    bad_kind = client.post("/v1/evaluations", json={"kind": "nemo", "text": "x"}, headers=reader)
    assert bad_kind.status_code == 422


def test_a_galvatron_strategy_file_is_priced_as_its_per_layer_plan(client: TestClient, reader: Headers) -> None:
    body = {"model": {"preset": "gpt-1.7b"}, "cluster": {"gpus": 16, "gpus_per_node": 8, "gpu": "A100-40GB"},
            "training": {"global_batch": 64}, "target": "galvatron"}
    plan = solve(parse_plan_request(body))
    out = export_plan(plan, "galvatron")
    r = client.post("/v1/evaluations", json={
        "kind": "galvatron-config", "text": out.files["galvatron_config.json"],
        "launch": out.files["train_galvatron.sh"], "model": {"preset": "gpt-1.7b"},
        "cluster": {"gpus": 16, "gpus_per_node": 8, "gpu": "A100-40GB"}}, headers=reader)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["strategy"]["kind"] == "per-layer" and doc["strategy"]["summary"] == plan["strategy"]["summary"]
    assert doc["memory"]["peak_bytes"] == plan["memory"]["peak_bytes"]
    assert doc["time"]["step_seconds"] == plan["time"]["step_seconds"]
    bad = client.post("/v1/evaluations", json={
        "kind": "galvatron-config", "text": out.files["galvatron_config.json"], "model": {"preset": "llama-2-7b"},
        "cluster": {"gpus": 16}}, headers=reader)
    assert bad.status_code == 422 and "block strategies" in bad.text


def test_a_nanotron_config_is_priced_and_one_whose_sizes_disagree_is_422(client: TestClient,
                                                                         reader: Headers) -> None:
    import yaml

    from tests.exports.test_nanotron_export import CONFIG

    ok = client.post("/v1/evaluations", json={"kind": "nanotron-config", "text": yaml.safe_dump(CONFIG),
                                              "cluster": {"gpu": "H100-80GB"}}, headers=reader)
    assert ok.status_code == 200, ok.text
    assert ok.json()["strategy"]["runtime"] == "nanotron" and ok.json()["cluster"]["gpus"] == 8
    bad = client.post("/v1/evaluations", json={"kind": "nanotron-config", "text": yaml.safe_dump(CONFIG),
                                               "cluster": {"gpus": 16}}, headers=reader)
    assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"
    assert "is not the 16 GPUs" in bad.text and '"text"' in bad.text, bad.text
