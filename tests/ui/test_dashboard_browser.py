"""The dashboard in a real browser: the form shows the API's field errors beside the fields; a
plan is followed live to its page with the stage memory chart and the Pareto plot; a running job
is cancelled from the jobs table; a validation's measured-vs-predicted table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from tests.support.service import FAST_REQUEST, SLOW_REQUEST, finished, poll_job

GIB = 2**30
HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf"
Login = Callable[[Any, str, str], None]
HARDWARE = {"key": "A100-80GB", "device": "cuda", "device_name": "NVIDIA A100-SXM4-80GB", "device_count": 8,
            "memory_bytes": 80 * GIB, "torch_version": "2.13.0"}


def _client(d: Any, token: str) -> httpx.Client:
    return httpx.Client(base_url=d.base, headers={"Authorization": f"Bearer {token}"}, timeout=10)


def test_the_form_shows_the_apis_errors_beside_the_fields(page: Any, dashboard: Any, login: Login) -> None:
    login(page, dashboard.base + "/ui/new", dashboard.writer)
    assert dashboard.writer not in page.url
    assert page.evaluate("sessionStorage.getItem('parplan.token')") == dashboard.writer
    page.wait_for_selector("#f-model-preset option[value='bert-large']", state="attached")
    page.fill("#f-cluster-gpus", "0")
    page.fill("#f-training-seq_len", "long")
    page.fill("#f-objective-alpha", "-1")
    page.click("#submit")
    gpus = page.wait_for_selector("[data-error-for='cluster.gpus']:not(:empty)")
    assert "greater than or equal to 1" in gpus.inner_text()
    seq = page.locator("[data-error-for='training.seq_len']")
    assert "integer" in seq.inner_text()
    assert "greater than or equal to 0" in page.inner_text("[data-error-for='objective.alpha']")
    assert page.locator(".field.invalid").count() == 3
    assert page.locator("[data-error-for='cluster.gpu']").inner_text() == ""
    assert "422" in page.inner_text("#status") and "/ui/new" in page.url


def test_an_uploaded_hf_config_is_checked_by_the_api_then_planned(page: Any, dashboard: Any, login: Login,
                                                                  tmp_path: Path) -> None:
    good = HF_CONFIGS / "bert.json"
    bad = tmp_path / "config.json"
    bad.write_text(json.dumps(json.loads(good.read_text()) | {"num_attention_heads": -3}))
    login(page, dashboard.base + "/ui/new", dashboard.writer)
    page.wait_for_selector("#f-cluster-gpu option[value='A100-80GB']", state="attached")
    page.select_option("#f-model-source", "hf_config")
    assert page.locator("[data-field='model.preset']").is_hidden()
    page.set_input_files("#f-model-hf_config", str(bad))
    page.fill("#f-cluster-gpus", "2")
    page.select_option("#f-search", "dp")
    page.click("#submit")
    slot = page.wait_for_selector("[data-error-for='model.hf_config']:not(:empty)")
    assert "num_attention_heads" in slot.inner_text() and "/ui/new" in page.url
    page.set_input_files("#f-model-hf_config", str(good))
    page.click("#submit")
    page.wait_for_url("**/ui/plans/*", timeout=60_000)
    assert "bert" in page.inner_text("dl.details")


def test_a_submitted_plan_is_followed_live_to_its_page(page: Any, dashboard: Any, login: Login,
                                                       artifacts: Path) -> None:
    login(page, dashboard.base + "/ui/new", dashboard.writer)
    page.wait_for_selector("#f-model-preset option[value='llama-2-70b']", state="attached")
    page.select_option("#f-model-preset", "llama-2-70b")  # a solve of a few seconds (MEDIUM_REQUEST)
    page.fill("#f-cluster-gpus", "64")
    page.select_option("#f-search", "dp")
    page.click("#submit")
    page.wait_for_url("**/ui/jobs/*")
    page.wait_for_function("() => document.getElementById('job-status').textContent === 'running'")
    assert page.inner_text("#job-stage").strip() != ""
    page.wait_for_url("**/ui/plans/*", timeout=60_000)
    chart = page.wait_for_selector("#stage-memory-chart")
    stages = page.locator("#layer-groups tbody tr").count()
    assert stages >= 1
    bars = chart.query_selector_all("rect[data-category]")
    assert {b.get_attribute("data-category") for b in bars} >= {"parameters", "optimizer_states", "activations"}
    assert chart.query_selector("line.device") is not None
    pareto = page.wait_for_selector("#pareto-chart")
    assert pareto.query_selector("#chosen-point") is not None
    assert len(pareto.query_selector_all("rect.baseline-point")) >= 2
    assert "megatron" in page.inner_text("#baselines thead")
    page.screenshot(path=str(artifacts / "plan-page.png"), full_page=True)


def test_a_running_job_is_cancelled_from_the_jobs_table(page: Any, dashboard: Any, login: Login,
                                                        artifacts: Path) -> None:
    with _client(dashboard, dashboard.writer) as c:
        job_id = c.post("/v1/plans", json=SLOW_REQUEST).json()["job"]["id"]
        poll_job(c, f"/v1/jobs/{job_id}", lambda j: j["status"] == "running", timeout=30)
        login(page, dashboard.base + "/ui", dashboard.writer)
        page.wait_for_selector(f"tr[data-job='{job_id}'][data-status='running']")
        page.click(f"button.cancel[data-job='{job_id}']")
        page.wait_for_selector(f"tr[data-job='{job_id}'][data-status='cancelled']", timeout=20_000)
        assert c.get(f"/v1/jobs/{job_id}").json()["job"]["status"] == "cancelled"
        page.screenshot(path=str(artifacts / "jobs-page.png"), full_page=True)
        assert page.locator("#jobs-body tr[data-status='succeeded']").count() >= 1  # the other tests' jobs
        page.select_option("#status-filter", "cancelled")
        page.wait_for_function("() => [...document.querySelectorAll('#jobs-body tr[data-job]')]"
                               ".every(r => r.dataset.status === 'cancelled')")


def _measurement(rank_errors: list[float]) -> dict[str, Any]:
    ranks = []
    for rank, err in enumerate(rank_errors):
        measured = {"parameters": 2 * GIB, "activations": 6 * GIB}
        predicted = {"parameters": 2 * GIB, "activations": int(6 * GIB * (1 + err))}
        ranks.append({"rank": rank, "measured": {"peak_bytes": sum(measured.values()), "breakdown": measured},
                      "predicted": {"peak_bytes": sum(predicted.values()), "breakdown": predicted}})
    return {"hardware_key": "A100-80GB", "max_relative_error": max(rank_errors), "ranks": ranks}


def test_a_validation_shows_measured_against_predicted(page: Any, dashboard: Any, login: Login) -> None:
    with _client(dashboard, dashboard.writer) as w, _client(dashboard, dashboard.agent) as a:
        job = poll_job(w, w.post("/v1/plans", json=FAST_REQUEST).json()["job"]["url"], finished)
        agent = a.post("/v1/agents/register", json={"name": "box", "hardware": HARDWARE}).json()["agent"]
        v = w.post(f"/v1/plans/{job['plan_id']}/validations").json()["validation"]
        assert a.post("/v1/validations/claim", json={"agent_id": agent["id"]}).status_code == 200
        r = a.post(f"/v1/validations/{v['id']}/result",
                   json={"agent_id": agent["id"], "status": "succeeded", "measurement": _measurement([0.02, 0.25])})
        assert r.status_code == 200, r.text
    login(page, dashboard.base + f"/ui/validations/{v['id']}", dashboard.writer)
    table = page.wait_for_selector("#validation-table")
    rows = [[c.inner_text() for c in tr.query_selector_all("td")] for tr in table.query_selector_all("tbody tr")]
    assert len(rows) == 2 * 3  # two ranks x (parameters, activations, peak)
    by_key = {(r[0], r[1]): r for r in rows}
    assert by_key[("0", "activations")][2:] == ["6.00", "6.12", "+2.0%"]
    assert by_key[("1", "activations")][2:] == ["6.00", "7.50", "+25.0%"]
    assert by_key[("1", "parameters")][4] == "+0.0%"
    assert table.query_selector_all("span.bad")[0].inner_text() == "+25.0%"
    assert "25.0%" in page.inner_text("#max-error")


def test_a_per_operator_plan_shows_its_operators_and_one_memory_bar(page: Any, dashboard: Any, login: Login) -> None:
    with _client(dashboard, dashboard.writer) as c:
        url = c.post("/v1/plans", json=FAST_REQUEST | {"search": "ilp"}).json()["job"]["url"]
        job = poll_job(c, url, finished)
    assert job["status"] == "succeeded", job
    login(page, dashboard.base + f"/ui/plans/{job['plan_id']}", dashboard.writer)
    ops = page.wait_for_selector("#unit-strategies")
    assert len(ops.query_selector_all("tbody tr")) >= 5
    chart = page.wait_for_selector("#stage-memory-chart")
    assert len(chart.query_selector_all("text.axis")) >= 1 and len(chart.query_selector_all("line.peak")) == 1
    assert {b.get_attribute("data-category") for b in chart.query_selector_all("rect[data-category]")} >= {
        "parameters", "optimizer_states", "activations"}
    assert page.query_selector("#pareto-chart #chosen-point") is not None


def test_a_plan_with_a_target_exports_from_its_page(page: Any, dashboard: Any, login: Login) -> None:
    request = {"model": {"preset": "bert-large"}, "cluster": {"gpus": 2}, "target": "deepspeed"}
    with _client(dashboard, dashboard.writer) as c:
        job = poll_job(c, c.post("/v1/plans", json=request).json()["job"]["url"], finished)
    assert job["status"] == "succeeded", job
    login(page, dashboard.base + f"/ui/plans/{job['plan_id']}", dashboard.writer)
    page.click("#export-button")
    link = page.wait_for_selector("#export-output a[download='ds_config.json']")
    assert (link.get_attribute("href") or "").startswith("blob:")
    config = json.loads(page.inner_text("#export-output pre"))
    assert config["train_batch_size"] == 2 and config["zero_optimization"]["stage"] in (0, 1, 2, 3)


def test_a_broken_events_stream_is_resumed_with_last_event_id(page: Any, dashboard: Any, login: Login) -> None:
    with _client(dashboard, dashboard.writer) as c:
        job = c.post("/v1/plans", json={"model": {"preset": "llama-2-70b"}, "cluster": {"gpus": 32},
                                        "search": "dp"}).json()["job"]
    sent: list[str | None] = []

    def events(route: Any) -> None:
        sent.append(route.request.headers.get("last-event-id"))
        if len(sent) > 1:
            route.continue_()
            return
        with _client(dashboard, dashboard.writer) as c:  # one event with an id, then the stream closes early
            now = c.get(f"/v1/jobs/{job['id']}").json()["job"]
        route.fulfill(status=200, headers={"content-type": "text/event-stream"},
                      body=f"event: status\nid: 1\ndata: {json.dumps(now)}\n\n")
    page.route("**/v1/jobs/*/events", events)
    login(page, dashboard.base + f"/ui/jobs/{job['id']}", dashboard.writer)
    page.wait_for_url("**/ui/plans/*", timeout=60_000)
    assert sent[:2] == [None, "1"], sent
