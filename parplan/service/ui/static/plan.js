// /ui/plans/{id}: strategy, memory per pipeline stage, step time, baselines, the Pareto frontier
// and the exports (charts by charts.js).
"use strict";

(async () => {
  const { el, api, fail, gib, GIB } = PP;
  const id = PP.pageId();
  const content = document.getElementById("content");
  const CATEGORIES = ["parameters", "gradients", "optimizer_states", "activations", "temporary"];
  const COLORS = { parameters: "#4e79a7", gradients: "#f28e2b", optimizer_states: "#76b7b2", activations: "#e15759",
    temporary: "#b07aa1" };
  const BASELINE_COLORS = ["#59a14f", "#8a8f96", "#9c755f", "#edc948", "#ff9da7"];
  const ACCENT = "#2457a6", DEVICE = "#b3261e";
  document.getElementById("title").textContent = `Plan ${id}`;
  PP.who();

  const section = (title, ...children) => el("section", {}, el("h2", { text: title }), ...children);

  function summary(doc) {
    const m = doc.memory || {};
    const t = doc.time || {};
    const s = doc.solver || {};
    const arch = doc.model.architecture;
    const shape = arch ? `, ${arch.family}: ${arch.layers} layers, hidden ${arch.hidden}, ${arch.heads} heads` : "";
    const rows = [["model", `${doc.model.name} (${(doc.model.parameters / 1e9).toFixed(2)} B parameters${shape})`],
      ["cluster", `${doc.cluster.gpus} × ${doc.cluster.gpu} (${doc.cluster.gpus_per_node} per node, ` +
        `${gib(doc.cluster.device_memory_bytes)} GiB each)`],
      ["strategy", (doc.strategy || {}).summary || "–"],
      ["peak memory", `${gib(m.peak_bytes)} GiB on stage ${m.peak_stage}${m.fits === false ? " (does not fit)" : ""}`],
      ["step time", `${PP.seconds(t.step_seconds)}, ${Math.round(t.tokens_per_second || 0).toLocaleString()} tokens/s`],
      ["solver", `${s.method} · ${s.status} · ${PP.seconds(s.seconds)}${s.why ? ` · ${s.why}` : ""}`],
      ["objective", `${doc.objective.kind}${doc.objective.max_slowdown !== null ? `, max slowdown ${doc.objective.max_slowdown}` : ""}`],
      ["target", (doc.target || {}).name || "any"]];
    return el("dl", { class: "details" }, rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
  }

  function strategyTables(st) {
    const out = [];
    if (st.layers && st.layers.length) {
      out.push(PP.table(["stage", "layers", "count", "strategy"], st.layers.map((r) => [String(r.stage),
        r.count === 1 ? r.first : `${r.first} … ${r.last}`, String(r.count), r.strategy]), { id: "layer-groups" }));
    }
    if (st.units && st.units.length) {
      const rows = [];
      for (const u of st.units) {
        for (const [op, info] of Object.entries(u.ops || {})) rows.push([String(u.units), String(u.count), op, info.strategy]);
      }
      out.push(PP.table(["units", "count", "operator", "strategy"], rows, { id: "unit-strategies" }));
    }
    if (st.partition) out.push(el("p", { text: `pipeline partition (layers per stage): ${st.partition.join(", ")}; ` +
      `${st.num_microbatches} micro-batches, ${st.schedule}` }));
    return out.length ? out : [el("p", { text: "no per-layer detail in this plan" })];
  }

  /** One stacked bar per pipeline stage: GiB by category, a dot at the stage's peak, the device's memory. */
  function stageMemoryChart(doc) {
    // Per-operator (ILP) plans have no pipeline: one bar for the device.
    const stages = doc.memory.stages && doc.memory.stages.length ? doc.memory.stages
      : [{ stage: 0, breakdown: doc.memory.breakdown, peak_bytes: doc.memory.peak_bytes }];
    const device = doc.memory.device_memory_bytes || doc.cluster.device_memory_bytes;
    const chart = Charts.stackedBars("stage-memory-chart", {
      groups: stages.map((s) => `stage ${s.stage}`),
      stack: CATEGORIES.map((c) => ({ label: c, color: COLORS[c], values: stages.map((s) => (s.breakdown[c] || 0) / GIB) })),
      marks: [{ label: "stage peak", color: "#111", values: stages.map((s) => s.peak_bytes / GIB) }],
      limits: [{ label: "device memory", color: DEVICE, value: device / GIB }],
      y: { label: "GiB", format: (v) => v.toFixed(2) } });
    return [...chart, el("p", { class: "hint", text: "Bars: each category at its own peak; the dark dot is the stage's " +
      "peak (the busiest moment, at most their sum); the dashed red line is the device's memory. Point at a bar " +
      "for its values." })];
  }

  // The step beyond the slowest stage's micro-batches (time.bubble_fraction), named for what it is:
  // with a pipeline its fill and drain (the bubble), apart from the once-per-step work where the
  // stages are listed; without one only the optimizer step and the data-parallel traffic not hidden.
  function idleParts(doc) {
    const t = doc.time || {};
    const f = t.bubble_fraction;
    if (typeof f !== "number") return [];
    const pp = (doc.strategy && doc.strategy.pp) || 1;
    if (pp <= 1) return [["optimizer + exposed DP", f]];
    if (t.stages && t.stages.length && t.step_seconds > 0) {
      const once = Math.max(...t.stages.map((s) => s.dp_exposed_seconds + s.optimizer_seconds)) / t.step_seconds;
      return [["pipeline bubble", f - once], ["optimizer + exposed DP", once]];
    }
    return [["bubble + optimizer + exposed DP", f]];
  }

  function stepTime(doc) {
    const t = doc.time || {};
    const out = [];
    const idle = idleParts(doc).map(([name, f]) => [name, `${PP.seconds(t.step_seconds * f)} (${PP.pct(f)})`]);
    const rows = [["step", PP.seconds(t.step_seconds)], ...idle,
      ["tokens/s", Math.round(t.tokens_per_second || 0).toLocaleString()],
      ["samples/s", (t.samples_per_second || 0).toFixed(2)], ["calibration", t.calibration || "default"]];
    out.push(PP.table(["", "value"], rows, { id: "step-time" }));
    if (t.stages && t.stages.length) {
      const keys = Object.keys(t.stages[0]).filter((k) => k.endsWith("_seconds"));
      out.push(PP.table(["stage", ...keys.map((k) => k.replace(/_seconds$/, "").replace(/_/g, " "))],
        t.stages.map((s) => [String(s.stage), ...keys.map((k) => PP.seconds(s[k]))]), { id: "stage-times" }));
    }
    return out;
  }

  const ratio = (v) => (typeof v === "number" && Number.isFinite(v) ? v.toFixed(2) : "–");

  function baselines(doc) {
    const cols = [["this plan", doc]];
    for (const [name, b] of Object.entries(doc.baselines || {})) cols.push([name, b]);
    const rel = doc.relative || {};
    const cell = (b, fn) => (b && b.memory ? fn(b) : "none applies");
    const rows = [
      ["strategy", ...cols.map(([, b]) => cell(b, (x) => x.strategy.summary))],
      ["peak GiB", ...cols.map(([, b]) => cell(b, (x) => gib(x.memory.peak_bytes)))],
      ["fits", ...cols.map(([, b]) => cell(b, (x) => ((x.fits ?? x.memory.fits) ? "yes" : "no")))],
      ["step time", ...cols.map(([, b]) => cell(b, (x) => PP.seconds(x.time.step_seconds)))],
      ["tokens/s", ...cols.map(([, b]) => cell(b, (x) => Math.round(x.time.tokens_per_second).toLocaleString()))],
      ["beyond the micro-batches", ...cols.map(([, b]) => cell(b, (x) => idleParts(x).map(([name, f]) =>
        `${name} ${PP.pct(f)}`).join(", ") || "–"))],
      ["plan's memory ÷ this", "1", ...cols.slice(1).map(([n]) => ratio(rel[n] && rel[n].memory))],
      ["plan's throughput ÷ this", "1", ...cols.slice(1).map(([n]) => ratio(rel[n] && rel[n].throughput))]];
    return [PP.table(["", ...cols.map(([n]) => n)], rows, { id: "baselines", class: "side-by-side" })];
  }

  /** Peak memory against step time: the frontier, the baselines and the chosen plan. */
  function paretoChart(doc) {
    const frontier = (doc.pareto || []).filter((p) => p.peak_bytes && p.step_seconds)
      .sort((a, b) => a.step_seconds - b.step_seconds);
    const others = Object.entries(doc.baselines || {}).filter(([, b]) => b && b.memory)
      .map(([n, b]) => ({ name: n, step_seconds: b.time.step_seconds, peak_bytes: b.memory.peak_bytes }));
    const chosen = { step_seconds: doc.time.step_seconds, peak_bytes: doc.memory.peak_bytes };
    const device = doc.memory.device_memory_bytes;
    // Baselines far above the device's memory (one that does not fit) are drawn on the top edge.
    const inScale = [...frontier, chosen, ...others.filter((p) => p.peak_bytes <= 1.5 * device)];
    const point = (p, info) => ({ x: p.step_seconds, y: p.peak_bytes / GIB, info });
    const series = [{ label: "frontier", color: ACCENT, line: true,
      points: frontier.map((p) => point(p, p.summary || null)) },
    ...others.map((p, k) => ({ label: p.name, color: BASELINE_COLORS[k % BASELINE_COLORS.length], labelled: true,
      points: [point(p, null)] })),
    { label: "chosen", color: "#f2a900", size: 14, labelled: true, points: [point(chosen, (doc.strategy || {}).summary)] }];
    const chart = Charts.scatter("pareto-chart", { series,
      x: { label: "step time", format: PP.seconds },
      y: { label: "peak memory (GiB)", format: (v) => v.toFixed(2),
        max: Math.max(device, ...inScale.map((p) => p.peak_bytes)) / GIB },
      limits: [{ label: "device memory", color: DEVICE, value: device / GIB }] });
    return [...chart.nodes, el("p", { class: "hint", text: `${frontier.length} frontier point(s) (joined), the baselines ` +
      "and the chosen plan (large). Point for values; drag across to zoom, double-click to reset." })];
  }

  function exports(doc) {
    const target = (doc.target || {}).name;
    if (!target || target === "any") return [el("p", { text: "No target was set; plan with a target to export." })];
    const out = el("div", { id: "export-output" });
    const button = el("button", { type: "button", id: "export-button", text: `Export for ${target}` });
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const { data } = await api(`/v1/plans/${id}/export?target=${encodeURIComponent(target)}`);
        const files = data.files || {};
        out.replaceChildren(el("p", { text: `${target} ${data.version || ""}` }),
          ...Object.entries(files).flatMap(([name, text]) => {
            const url = URL.createObjectURL(new Blob([text], { type: "text/plain" }));
            return [el("h3", {}, el("a", { href: url, download: name, text: name })), el("pre", { text })];
          }));
      } catch (err) {
        out.replaceChildren(el("p", { class: "error", text: err.message }),
          ...((err.problem && err.problem.errors) || []).map((e) => el("p", { class: "error", text: e.message })));
      } finally {
        button.disabled = false;
      }
    });
    return [button, out];
  }

  try {
    const doc = (await api(`/v1/plans/${id}`)).data;
    if (!doc.memory) {
      content.append(summary(doc), el("p", { class: "error", text: doc.message || "no plan fits" }));
      return;
    }
    content.append(summary(doc),
      section("Strategy per stage and layer group", ...strategyTables(doc.strategy || {})),
      section("Memory per pipeline stage", ...stageMemoryChart(doc)),
      section("Step time", ...stepTime(doc)),
      section("Baselines", ...baselines(doc)),
      section("Memory vs step time", ...paretoChart(doc)),
      section("Export", ...exports(doc)));
  } catch (err) {
    fail(err);
  }
})();
