// /ui/plans/{id}: strategy, memory per pipeline stage, step time, baselines, the Pareto frontier
// and the exports (all charts are inline SVG built here).
"use strict";

(async () => {
  const { el, svg, api, fail, gib } = PP;
  const id = PP.pageId();
  const content = document.getElementById("content");
  const CATEGORIES = ["parameters", "gradients", "optimizer_states", "activations", "temporary"];
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

  function legend() {
    return el("p", { class: "legend" }, CATEGORIES.map((c) => el("span", { class: `key cat-${c}` }, c)));
  }

  /** One stacked bar per pipeline stage: bytes by category, against the device's memory. */
  function stageMemoryChart(doc) {
    // Per-operator (ILP) plans have no pipeline: one bar for the device.
    const stages = doc.memory.stages && doc.memory.stages.length ? doc.memory.stages
      : [{ stage: 0, breakdown: doc.memory.breakdown, peak_bytes: doc.memory.peak_bytes }];
    const device = doc.memory.device_memory_bytes || doc.cluster.device_memory_bytes;
    const W = 640, rowH = 28, left = 70, right = 20, top = 20;
    const H = top + stages.length * (rowH + 10) + 30;
    const sums = stages.map((s) => CATEGORIES.reduce((a, c) => a + (s.breakdown[c] || 0), 0));
    const scaleMax = Math.max(device, ...sums, 1);
    const x = (b) => left + (b / scaleMax) * (W - left - right);
    const chart = svg("svg", { id: "stage-memory-chart", class: "chart", viewBox: `0 0 ${W} ${H}`, width: W,
      height: H, role: "img", "aria-label": "memory per pipeline stage by category" });
    stages.forEach((s, i) => {
      const y = top + i * (rowH + 10);
      let at = 0;
      chart.append(svg("text", { x: 4, y: y + rowH / 2 + 4, class: "axis", text: `stage ${s.stage}` }));
      for (const c of CATEGORIES) {
        const b = s.breakdown[c] || 0;
        if (b <= 0) continue;
        chart.append(svg("rect", { x: x(at), y, width: Math.max(0.5, x(at + b) - x(at)), height: rowH,
          class: `cat-${c}`, "data-category": c }, svg("title", { text: `stage ${s.stage} ${c}: ${gib(b)} GiB` })));
        at += b;
      }
      chart.append(svg("line", { x1: x(s.peak_bytes), x2: x(s.peak_bytes), y1: y - 3, y2: y + rowH + 3,
        class: "peak" }, svg("title", { text: `stage ${s.stage} peak: ${gib(s.peak_bytes)} GiB` })));
    });
    const yEnd = H - 24;
    chart.append(svg("line", { x1: x(device), x2: x(device), y1: 8, y2: yEnd, class: "device" }),
      svg("text", { x: x(device) - 4, y: H - 8, class: "axis end", text: `device ${gib(device)} GiB` }),
      svg("text", { x: left, y: H - 8, class: "axis", text: "0" }));
    return [legend(), chart,
      el("p", { class: "hint", text: "Bars: each category at its own peak; the dark tick is the stage's peak " +
        "(the busiest moment, at most their sum); the red line is the device's memory." })];
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
    const chosen = { name: "chosen", step_seconds: doc.time.step_seconds, peak_bytes: doc.memory.peak_bytes };
    const pts = [...frontier, ...others, chosen];
    const W = 640, H = 360, L = 64, R = 20, T = 16, B = 44;
    const device = doc.memory.device_memory_bytes;
    // Points far above the device's memory (a baseline that does not fit) are drawn on the top edge.
    const inScale = [...frontier, chosen, ...others.filter((p) => p.peak_bytes <= 1.5 * device)];
    const xs = pts.map((p) => p.step_seconds), ys = inScale.map((p) => p.peak_bytes).concat([device]);
    const pad = (lo, hi) => (hi > lo ? [lo - (hi - lo) * 0.08, hi + (hi - lo) * 0.08] : [lo * 0.9, hi * 1.1 + 1e-9]);
    const [x0, x1] = pad(Math.min(...xs), Math.max(...xs));
    const y0 = 0, y1 = Math.max(...ys) * 1.08;
    const X = (v) => L + ((v - x0) / (x1 - x0)) * (W - L - R);
    const Y = (v) => H - B - ((v - y0) / (y1 - y0)) * (H - T - B);
    const chart = svg("svg", { id: "pareto-chart", class: "chart", viewBox: `0 0 ${W} ${H}`, width: W, height: H,
      role: "img", "aria-label": "peak memory against step time" });
    chart.append(svg("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, class: "axisline" }),
      svg("line", { x1: L, x2: L, y1: T, y2: H - B, class: "axisline" }));
    for (let i = 0; i <= 4; i++) {
      const xv = x0 + ((x1 - x0) * i) / 4, yv = y0 + ((y1 - y0) * i) / 4;
      chart.append(svg("text", { x: X(xv), y: H - B + 16, class: "axis middle", text: PP.seconds(xv) }),
        svg("text", { x: L - 6, y: Y(yv) + 4, class: "axis end", text: gib(yv) }));
    }
    chart.append(svg("text", { x: (L + W) / 2, y: H - 6, class: "axis middle", text: "step time" }),
      svg("text", { x: 12, y: (T + H - B) / 2, class: "axis", text: "GiB",
        transform: `rotate(-90 12 ${(T + H - B) / 2})` }));
    if (device <= y1) {
      chart.append(svg("line", { x1: L, x2: W - R, y1: Y(device), y2: Y(device), class: "device" }),
        svg("text", { x: L + 6, y: Y(device) - 4, class: "axis", text: "device memory" }));
    }
    if (frontier.length > 1) {
      chart.append(svg("polyline", { class: "frontier", points: frontier.map((p) => `${X(p.step_seconds)},${Y(p.peak_bytes)}`).join(" ") }));
    }
    for (const p of frontier) {
      chart.append(svg("circle", { cx: X(p.step_seconds), cy: Y(p.peak_bytes), r: 4, class: "point frontier-point" },
        svg("title", { text: `${p.summary || "frontier"}: ${gib(p.peak_bytes)} GiB, ${PP.seconds(p.step_seconds)}` })));
    }
    for (const p of others) {
      const off = p.peak_bytes > y1;
      const py = off ? T : Y(p.peak_bytes);
      chart.append(svg("rect", { x: X(p.step_seconds) - 4, y: py - 4, width: 8, height: 8,
        class: "point baseline-point", "data-baseline": p.name },
        svg("title", { text: `${p.name}: ${gib(p.peak_bytes)} GiB, ${PP.seconds(p.step_seconds)}` })),
        svg("text", { x: X(p.step_seconds) + (X(p.step_seconds) > W * 0.75 ? -7 : 7), y: py + (off ? 14 : -6),
          class: X(p.step_seconds) > W * 0.75 ? "axis end" : "axis", text: off ? `${p.name} ↑ ${gib(p.peak_bytes)} GiB` : p.name }));
    }
    chart.append(svg("circle", { id: "chosen-point", cx: X(chosen.step_seconds), cy: Y(chosen.peak_bytes), r: 7,
      class: "point chosen" }, svg("title", { text: `chosen: ${gib(chosen.peak_bytes)} GiB, ${PP.seconds(chosen.step_seconds)}` })),
    svg("text", { x: X(chosen.step_seconds) + 9, y: Y(chosen.peak_bytes) + 14, class: "axis chosen-label", text: "chosen" }));
    return [chart, el("p", { class: "hint", text: `${frontier.length} frontier point(s) (circles, joined), ` +
      "baselines (squares), the chosen plan (large circle)." })];
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
