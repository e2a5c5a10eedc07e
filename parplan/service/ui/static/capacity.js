// /ui/capacity/{id}: a capacity sweep (POST /v1/capacity): throughput against GPUs per pool, cost against time
// to train with the frontier and the allocations the goal picks, and the cells, filled in live as the sweep's job
// reports each cell on its events stream (the result document is readable while it runs).
"use strict";

(async () => {
  const { el, api, fail, status } = PP;
  const id = PP.pageId();
  const content = document.getElementById("content");
  document.getElementById("title").textContent = `Capacity sweep ${id}`;
  const FRONTIER = "#1d232b", CHEAPEST = "#f2a900", FASTEST = "#2ca58d", DEADLINE = "#b3261e", BUDGET = "#7a4fb3";

  const hours = (h) => (h === null || h === undefined ? "–" : h < 48 ? `${h.toFixed(1)} h` : `${(h / 24).toFixed(1)} d`);
  const money = (c) => (c === null || c === undefined ? "–"
    : c.toLocaleString("en", { maximumFractionDigits: c < 100 ? 2 : 0 }));
  const rate = (t) => (t === null || t === undefined ? "–" : t >= 1e6 ? `${(t / 1e6).toFixed(2)} M`
    : t >= 1e3 ? `${(t / 1e3).toFixed(1)} k` : t.toFixed(0));
  const fitting = (c) => c.status === "done" && c.fits === true;
  const where = (c) => `${c.gpus} × ${c.gpu}`;
  const section = (title, ...children) => el("section", {}, el("h2", { text: title }), ...children);
  const planLink = (c) => (c && c.plan_id ? el("a", { href: `/ui/plans/${c.plan_id}`, text: where(c) }) : "–");

  const state = el("span", { id: "sweep-status", class: "badge" });
  const bar = el("progress", { id: "sweep-progress", max: "1", value: "0" });
  const stage = el("span", { id: "sweep-stage" });
  const actions = el("span", { id: "sweep-actions" });
  const answers = el("dl", { id: "answers", class: "details" });
  const cellsBody = el("tbody", { id: "cells-body" });
  const charts = {};

  function showJob(job) {
    state.textContent = job.cancel_requested && job.status === "running" ? "cancelling" : job.status;
    state.className = `badge ${job.status}`;
    bar.value = job.progress.fraction || 0;
    stage.textContent = job.progress.stage || "";
    if (PP.TERMINAL.has(job.status)) actions.replaceChildren();
  }

  function throughputPoints(doc, pools) {
    return pools.map((gpu) => doc.cells.filter((c) => c.gpu === gpu).map((c) => ({ x: c.gpus,
      y: fitting(c) ? c.tokens_per_second : null,
      info: fitting(c) ? `${where(c)}: ${rate(c.tokens_per_second)} tokens/s, scaling ${PP.pct(c.scaling_efficiency)}`
        : null })));
  }

  function costPoints(doc, pools) {
    const point = (c) => ({ x: c.time_to_train_hours, y: c.cost,
      info: `${where(c)}, ${hours(c.time_to_train_hours)}, cost ${money(c.cost)}` });
    const ok = doc.cells.filter((c) => fitting(c) && c.time_to_train_hours !== null && c.cost !== null);
    return [...pools.map((gpu) => ok.filter((c) => c.gpu === gpu).map(point)),
      doc.frontier.map(point),
      doc.cheapest_meeting_deadline ? [point(doc.cheapest_meeting_deadline)] : [],
      doc.fastest_within_budget ? [point(doc.fastest_within_budget)] : []];
  }

  /** Both charts, made once (the pools and the goal do not change while the sweep runs). */
  function makeCharts(doc, pools) {
    const goal = doc.goal || {};
    const pool = (gpu, k) => ({ label: gpu, color: Charts.PALETTE[k % Charts.PALETTE.length], points: [] });
    charts.throughput = Charts.scatter("throughput-chart", {
      series: pools.map((gpu, k) => ({ ...pool(gpu, k), line: true })),
      x: { label: "GPUs", format: (v) => String(Math.round(v)), log: 2 },
      y: { label: "tokens/s", format: rate } });
    const limits = [];
    if (goal.deadline_hours) limits.push({ label: "deadline", color: DEADLINE, value: goal.deadline_hours, axis: "x" });
    if (goal.budget) limits.push({ label: "budget", color: BUDGET, value: goal.budget });
    charts.cost = Charts.scatter("cost-chart", {
      series: [...pools.map(pool), { label: "frontier", color: FRONTIER, line: true, points: [] },
        { label: "cheapest by the deadline", color: CHEAPEST, size: 14, points: [] },
        { label: "fastest within budget", color: FASTEST, size: 14, points: [] }],
      x: { label: "time to train (hours)", format: (h) => h.toFixed(h < 100 ? 1 : 0) }, y: { label: "cost", format: money },
      limits });
    content.append(
      section("Throughput against GPUs", ...charts.throughput.nodes, el("p", { class: "hint", text: "Tokens per " +
        "second of each pool's plans that fit (a gap: no plan fits, or not answered yet); GPUs on a log scale." })),
      section("Cost against time to train", ...charts.cost.nodes, el("p", { class: "hint", text: "Every allocation " +
        "that fits; the frontier joins those no other beats on both; the large points are what the goal picks. " +
        "Point for values; drag across to zoom, double-click to reset." })),
      section("Cells", el("table", { id: "cells" }, el("thead", {}, el("tr", {}, ["pool", "GPUs", "status", "fits",
        "step", "tokens/s", "scaling", "time to train", "cost", "plan"].map((h) => el("th", { text: h })))), cellsBody)));
  }

  function showAnswers(doc, pools) {
    const fewest = doc.fewest_gpus_that_fit || {};
    const goal = doc.goal || {};
    const rows = [["cells answered", `${doc.cells.filter((c) => c.status !== "pending").length} of ${doc.cells.length}`],
      ...pools.map((gpu) => [`fewest ${gpu} that fit`, fewest[gpu] === null || fewest[gpu] === undefined
        ? (doc.complete ? "none fits" : "–") : String(fewest[gpu])])];
    if (goal.deadline_hours) rows.push([`cheapest by ${hours(goal.deadline_hours)}`, planLink(doc.cheapest_meeting_deadline)]);
    if (goal.budget) rows.push([`fastest within ${money(goal.budget)}`, planLink(doc.fastest_within_budget)]);
    if (!goal.deadline_hours && !goal.budget) rows.push(["goal", "none (no allocation is picked)"]);
    if (doc.note) rows.push(["note", doc.note]);
    answers.replaceChildren(...rows.flatMap(([k, v], i) => [el("dt", { text: k }), el("dd", { "data-answer": i }, v)]));
  }

  function showCells(doc) {
    cellsBody.replaceChildren(...doc.cells.map((c) => el("tr", { "data-gpu": c.gpu, "data-gpus": c.gpus,
      "data-status": c.status },
    el("td", { text: c.gpu }), el("td", { text: String(c.gpus) }),
    el("td", {}, el("span", { class: `badge ${c.status === "done" ? "succeeded" : c.status}`, text: c.status })),
    el("td", { text: c.fits === null ? "–" : c.fits ? "yes" : "no" }), el("td", { text: PP.seconds(c.step_seconds) }),
    el("td", { text: rate(c.tokens_per_second) }), el("td", { text: PP.pct(c.scaling_efficiency) }),
    el("td", { text: hours(c.time_to_train_hours) }), el("td", { text: money(c.cost) }),
    el("td", {}, c.plan_id ? el("a", { href: `/ui/plans/${c.plan_id}`, text: "plan" }) : (c.error || "–")))));
  }

  function show(doc) {
    const pools = [...new Set(doc.cells.map((c) => c.gpu))];
    if (!charts.cost) makeCharts(doc, pools);
    charts.throughput.update(throughputPoints(doc, pools));
    charts.cost.update(costPoints(doc, pools));
    showAnswers(doc, pools);
    showCells(doc);
  }

  // One read of the result at a time; news meanwhile asks for one more read after it.
  let reading = null, again = false;
  async function refresh() {
    if (reading) {
      again = true;
      return reading;
    }
    reading = (async () => {
      do {
        again = false;
        show((await api(`/v1/capacity/${id}`)).data);
      } while (again);
    })();
    try {
      await reading;
    } finally {
      reading = null;
    }
  }

  function cancelButton(scopes, job) {
    if (PP.TERMINAL.has(job.status) || job.cancel_requested || !scopes.includes("plans:write")) return;
    const b = el("button", { type: "button", class: "cancel", id: "sweep-cancel", text: "Cancel the sweep" });
    b.addEventListener("click", async () => {
      b.disabled = true;
      try {
        showJob((await api(`/v1/jobs/${id}/cancel`, { method: "POST" })).data.job);
      } catch (err) {
        fail(err);
      }
    });
    actions.replaceChildren(b);
  }

  try {
    const scopes = await PP.who();
    const job = (await api(`/v1/jobs/${id}`)).data.job;
    content.append(el("p", { class: "live" }, state, " ", bar, " ", stage, " ", actions), answers);
    showJob(job);
    cancelButton(scopes, job);
    await refresh();
    if (!PP.TERMINAL.has(job.status)) {
      const last = await PP.follow(id, (j) => {
        showJob(j);
        refresh().catch(fail);
      });
      await refresh();
      status(last.status === "succeeded" ? "" : `the sweep ended: ${last.status}`, last.status === "failed" ? "error" : "");
    }
  } catch (err) {
    fail(err);
  }
})();
