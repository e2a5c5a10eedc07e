"""The dashboard in a real browser: the form shows the API's field errors beside the fields; a
plan is followed live to its page with the stage memory chart and the Pareto plot; a running job
is cancelled from the jobs table; a validation's measured-vs-predicted table; a capacity sweep's
page filled in live from the real ``POST /v1/capacity``. The charts are uPlot's: the tests read
each chart's data (PP.charts) against the API's documents, the legend and readout under the
cursor, zoom, and that no tick label falls outside its chart."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.service import FAST_REQUEST, SLOW_REQUEST, finished, poll_job

GIB = 2**30
HF_CONFIGS = Path(__file__).parents[1] / "data" / "hf"
Login = Callable[[Any, str, str], None]
HARDWARE = {"key": "A100-80GB", "device": "cuda", "device_name": "NVIDIA A100-SXM4-80GB", "device_count": 8,
            "memory_bytes": 80 * GIB, "torch_version": "2.13.0"}


def _chart(page: Any, chart: str) -> dict[str, list[Any]]:
    """A chart's data by series label, once it is drawn (uPlot's instance, kept in PP.charts)."""
    page.wait_for_selector(f"#{chart} .uplot")
    return dict(page.evaluate("id => PP.charts[id].series.map((s, i) => [s.label, PP.charts[id].data[i]])", chart))


def _hover(page: Any, chart: str, x: float) -> None:
    """Put the mouse on the chart at data value ``x``, half way up."""
    at = page.evaluate("""([id, x]) => { const u = PP.charts[id]; u.root.scrollIntoView({ block: "center" });
        const r = u.over.getBoundingClientRect();
        return [r.left + u.valToPos(x, "x"), r.top + r.height / 2]; }""", [chart, x])
    page.mouse.move(*at)


def _legend(page: Any, chart: str) -> dict[str, str]:
    """The legend's rows (uPlot's: the values at the cursor), label to text."""
    rows = page.query_selector_all(f"#{chart} .u-legend .u-series")
    return {r.query_selector(".u-label").inner_text(): (r.query_selector(".u-value").inner_text()
                                                        if r.query_selector(".u-value") else "") for r in rows}


_OUTSIDE = """id => { const u = PP.charts[id], out = [], px = uPlot.pxRatio;
  u.axes.forEach((a, k) => { if (!a.show) return; u.ctx.font = a.font[0];
    (a._values || []).forEach((v, i) => { if (v === null || v === "") return;
      const w = u.ctx.measureText(String(v)).width / px;
      if (a.side % 2 === 0) { const x = u.bbox.left / px + u.valToPos(a._splits[i], a.scale);
        if (x - w / 2 < 0 || x + w / 2 > u.width) out.push([k, v]); }
      else if (w + a.ticks.size + a.gap > a._size) out.push([k, v]); }); });
  return out; }"""


def _labels_outside(page: Any, chart: str) -> list[Any]:
    """Tick labels that do not fit in the chart: wider than their axis, or past the canvas' edge."""
    return list(page.evaluate(_OUTSIDE, chart))


def _zoom_and_reset(page: Any, chart: str) -> None:
    """Drag across the middle of the plot: the x scale narrows to it; a double-click restores it."""
    scale = "id => [PP.charts[id].scales.x.min, PP.charts[id].scales.x.max]"
    full = page.evaluate(scale, chart)
    page.locator(f"#{chart}").scroll_into_view_if_needed()
    box = page.locator(f"#{chart} .u-over").bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.6, y, steps=5)
    page.mouse.up()
    lo, hi = page.evaluate(scale, chart)
    assert full[0] < lo < hi < full[1] and (hi - lo) < 0.5 * (full[1] - full[0]), (full, lo, hi)
    page.mouse.dblclick(box["x"] + box["width"] / 2, y)
    assert page.evaluate(scale, chart) == pytest.approx(full)


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
    with _client(dashboard, dashboard.writer) as c:
        doc = c.get(f"/v1/plans/{page.url.rsplit('/', 1)[1]}").json()
    memory = _chart(page, "stage-memory-chart")
    assert page.locator("#layer-groups tbody tr").count() >= 1
    assert {"parameters", "optimizer_states", "activations", "stage peak", "device memory"} <= set(memory)
    stages = doc["memory"]["stages"]
    for c in ("parameters", "optimizer_states", "activations"):  # the bars are the API's bytes, in GiB
        assert memory[c] == pytest.approx([s["breakdown"][c] / GIB for s in stages], rel=1e-9)
    assert memory["stage peak"] == pytest.approx([s["peak_bytes"] / GIB for s in stages], rel=1e-9)
    _hover(page, "stage-memory-chart", 0)  # the legend shows the bar under the cursor
    legend = _legend(page, "stage-memory-chart")
    assert legend["stage"] == f"stage {stages[0]['stage']}"
    assert legend["activations"] == f"{stages[0]['breakdown']['activations'] / GIB:.2f}"
    pareto = _chart(page, "pareto-chart")
    baselines = set(pareto) - {"step time", "frontier", "chosen", "device memory"}
    assert "megatron" in baselines and len(baselines) >= 2
    assert [v for v in pareto["chosen"] if v is not None] == pytest.approx([doc["memory"]["peak_bytes"] / GIB])
    _hover(page, "pareto-chart", doc["time"]["step_seconds"])
    assert _legend(page, "pareto-chart")["chosen"] == f"{doc['memory']['peak_bytes'] / GIB:.2f}"
    assert doc["strategy"]["summary"] in page.inner_text("#pareto-chart-readout")
    for chart in ("stage-memory-chart", "pareto-chart"):
        assert _labels_outside(page, chart) == [], chart
    _zoom_and_reset(page, "pareto-chart")
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
    memory = _chart(page, "stage-memory-chart")
    assert memory["stage"] == [0] and len(memory["stage peak"]) == 1  # one bar: the device
    assert {"parameters", "optimizer_states", "activations"} <= set(memory)
    assert [v for v in _chart(page, "pareto-chart")["chosen"] if v is not None] != []


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


#: A small sweep (2 pools x 4 GPU counts, up to 8: a few seconds a cell) whose goal picks two cells.
CAPACITY = {"model": {"preset": "bert-large"}, "training": {"global_batch": 64, "seq_len": 512, "tokens": 2e10},
            "pools": [{"gpu": "A100-80GB", "gpus_per_node": 4, "max_gpus": 8, "price_per_gpu_hour": 2.0},
                      {"gpu": "H100-80GB", "gpus_per_node": 4, "max_gpus": 8, "price_per_gpu_hour": 4.0}],
            "goal": {"deadline_hours": 30, "budget": 210}, "search": "dp"}
_LIVE = """() => { const u = typeof PP === "object" && PP.charts && PP.charts["throughput-chart"];
  if (!u) return false;
  const rows = [...document.querySelectorAll("#cells-body tr")];
  const answered = rows.filter((r) => r.dataset.status !== "pending").length;
  const drawn = u.data.slice(1).flat().filter((v) => v !== null).length;
  return rows.length > 0 && answered > 0 && answered < rows.length && drawn > 0; }"""


def _points(series: dict[str, list[Any]], label: str, x: str) -> dict[float, float]:
    return {xv: yv for xv, yv in zip(series[x], series[label], strict=True) if yv is not None}


def _at(cells: list[dict[str, Any]]) -> dict[float, float]:
    return {cell["time_to_train_hours"]: cell["cost"] for cell in cells}


def test_a_capacity_sweep_fills_its_page_live(page: Any, dashboard: Any, login: Login, artifacts: Path) -> None:
    login(page, dashboard.base + "/ui", dashboard.writer)  # the token is kept for the tab: the page opens at once
    with _client(dashboard, dashboard.writer) as c:
        r = c.post("/v1/capacity", json=CAPACITY)
        assert r.status_code == 202, r.text
        sweep = r.json()["job"]["id"]
        page.goto(dashboard.base + f"/ui/capacity/{sweep}")
        page.wait_for_function(_LIVE, timeout=60_000)  # some cells drawn while others are still pending
        assert "cells" in page.inner_text("#sweep-stage")
        page.wait_for_selector("#sweep-status:text('succeeded')", timeout=120_000)
        page.wait_for_function("() => !document.querySelector('#cells-body tr[data-status=pending]')")
        doc = c.get(r.json()["result_url"]).json()
    assert doc["complete"] and doc["cheapest_meeting_deadline"] and doc["fastest_within_budget"], doc
    rows = page.query_selector_all("#cells-body tr")
    assert [(r.get_attribute("data-gpu"), int(r.get_attribute("data-gpus") or 0)) for r in rows] == [
        (cell["gpu"], cell["gpus"]) for cell in doc["cells"]]
    throughput = _chart(page, "throughput-chart")
    for gpu in ("A100-80GB", "H100-80GB"):  # each pool's curve is its fitting cells' tokens/s
        fitting = [cell for cell in doc["cells"] if cell["gpu"] == gpu and cell["fits"]]
        assert _points(throughput, gpu, "GPUs") == pytest.approx({c["gpus"]: c["tokens_per_second"] for c in fitting})
    cost = _chart(page, "cost-chart")
    assert _points(cost, "frontier", "time to train (hours)") == pytest.approx(_at(doc["frontier"]))
    cheapest, fastest = doc["cheapest_meeting_deadline"], doc["fastest_within_budget"]
    assert _points(cost, "cheapest by the deadline", "time to train (hours)") == pytest.approx(_at([cheapest]))
    assert _points(cost, "fastest within budget", "time to train (hours)") == pytest.approx(_at([fastest]))
    _hover(page, "cost-chart", cheapest["time_to_train_hours"])
    assert f"cheapest by the deadline: {cheapest['gpus']} × {cheapest['gpu']}" in page.inner_text("#cost-chart-readout")
    answers = page.inner_text("#answers")
    for gpu, fewest in doc["fewest_gpus_that_fit"].items():
        assert f"fewest {gpu} that fit\n{fewest}" in answers
    assert f"{fastest['gpus']} × {fastest['gpu']}" in answers
    for chart in ("throughput-chart", "cost-chart"):
        assert _labels_outside(page, chart) == [], chart
    page.mouse.move(0, 0)
    page.screenshot(path=str(artifacts / "capacity-page.png"), full_page=True)
    page.goto(dashboard.base + f"/ui/jobs/{sweep}")  # the sweep's job page hands over to this page
    page.wait_for_url(f"**/ui/capacity/{sweep}")


def test_a_capacity_sweep_is_cancelled_from_its_page(page: Any, dashboard: Any, login: Login) -> None:
    slow = CAPACITY | {"model": {"preset": "llama-2-70b"},  # 11 cells of a few seconds each
                       "pools": [{"gpu": "H100-80GB", "gpus_per_node": 8, "max_gpus": 64, "price_per_gpu_hour": 4.0}]}
    login(page, dashboard.base + "/ui", dashboard.writer)
    with _client(dashboard, dashboard.writer) as c:
        r = c.post("/v1/capacity", json=slow)
        assert r.status_code == 202, r.text
        sweep = r.json()["job"]["id"]
        page.goto(dashboard.base + f"/ui/capacity/{sweep}")
        page.click("#sweep-cancel")
        page.wait_for_selector("#sweep-status:text('cancelled')", timeout=20_000)
        assert c.get(f"/v1/jobs/{sweep}").json()["job"]["status"] == "cancelled"
        assert page.locator("#sweep-cancel").count() == 0
