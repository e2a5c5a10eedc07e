// parplan dashboard: the charts, drawn by uPlot (vendored in static/vendor/uplot/, see its README). uPlot gives
// the axes, the legend (the values under the cursor: the tooltip), and zoom (drag across a chart; double-click
// resets). Every chart is kept in PP.charts under its id (the browser tests read its data there).
"use strict";

const Charts = (() => {
  const { el } = PP;
  const FONT = "12px system-ui, -apple-system, 'Segoe UI', sans-serif";
  const LABEL_FONT = "bold 12px system-ui, -apple-system, 'Segoe UI', sans-serif";
  const MUTED = "#5c6670";
  const GRID = "#e6eaee";
  /** Colours for series with no colour of their own (Tableau 10). */
  const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
    "#9c755f", "#bab0ac"];
  PP.charts = {};

  /** An axis; a vertical one is as wide as its longest tick label (uPlot's default is a fixed width). */
  function axis(label, format, extra) {
    return { label, font: FONT, labelFont: LABEL_FONT, stroke: MUTED, grid: { stroke: GRID, width: 1 },
      ticks: { stroke: GRID, width: 1, size: 5 }, values: format ? (u, splits) => splits.map(format) : undefined,
      size(u, values, axisIdx, cycleNum) {
        const a = u.axes[axisIdx];
        if (a.side % 2 === 0) return 36;  // horizontal: one line of text under the ticks
        if (cycleNum > 1) return a._size;
        u.ctx.font = a.font[0];
        const widest = Math.max(0, ...(values || []).map((v) => u.ctx.measureText(String(v)).width));
        return Math.ceil(widest / uPlot.pxRatio + a.ticks.size + a.gap + 8);
      }, ...extra };
  }

  /** The plot's width: the page's content column, at most 880 px. */
  const width = () => Math.max(320, Math.min(880, (document.getElementById("content").clientWidth || 880) - 8));

  /** A plugin that draws a line across the plot at each limit's value (dashed, its colour): horizontal
   *  at a y value, vertical at an x value (``axis: "x"``); the limit is also a series, so the legend names it. */
  function limitLines(limits) {
    return { hooks: { draw: [(u) => {
      const { ctx, bbox } = u;
      ctx.save();
      for (const lim of limits) {
        const vertical = lim.axis === "x";
        const at = Math.round(u.valToPos(lim.value, vertical ? "x" : "y", true));
        const [lo, hi] = vertical ? [bbox.left, bbox.left + bbox.width] : [bbox.top, bbox.top + bbox.height];
        if (!Number.isFinite(at) || at < lo || at > hi) continue;
        ctx.strokeStyle = lim.color;
        ctx.lineWidth = 2 * uPlot.pxRatio;
        ctx.setLineDash([6 * uPlot.pxRatio, 3 * uPlot.pxRatio]);
        ctx.beginPath();
        if (vertical) {
          ctx.moveTo(at, bbox.top);
          ctx.lineTo(at, bbox.top + bbox.height);
        } else {
          ctx.moveTo(bbox.left, at);
          ctx.lineTo(bbox.left + bbox.width, at);
        }
        ctx.stroke();
      }
      ctx.restore();
    }] } };
  }

  /** A plugin that writes each labelled series' name beside its points (``label(i)`` gives the text). */
  function pointLabels(items) {
    return { hooks: { draw: [(u) => {
      const { ctx, bbox } = u;
      ctx.save();
      ctx.font = `${11 * uPlot.pxRatio}px system-ui, sans-serif`;
      ctx.fillStyle = "#1d232b";
      for (const { seriesIdx, label } of items) {
        if (!u.series[seriesIdx].show) continue;
        u.data[seriesIdx].forEach((v, i) => {
          if (v === null || v === undefined) return;
          const x = u.valToPos(u.data[0][i], "x", true), y = u.valToPos(v, "y", true);
          if (x < bbox.left || x > bbox.left + bbox.width) return;
          const text = label(i);
          const w = ctx.measureText(text).width;
          const right = x + 9 * uPlot.pxRatio + w > bbox.left + bbox.width;
          ctx.textAlign = right ? "right" : "left";
          ctx.fillText(text, x + (right ? -9 : 9) * uPlot.pxRatio, Math.max(bbox.top + 12 * uPlot.pxRatio,
            y - 6 * uPlot.pxRatio));
        });
      }
      ctx.restore();
    }] } };
  }

  /** A plugin that shows, under the chart, what the points at the cursor are (their ``info``). */
  function readout(node, infos) {
    return { hooks: { setCursor: [(u) => {
      const i = u.cursor.idx;
      const lines = i === null || i === undefined ? [] : infos().flatMap((info, s) => {
        const text = info && info[i];
        return text && u.series[s + 1].show ? [`${u.series[s + 1].label}: ${text}`] : [];
      });
      node.textContent = lines.join(" · ") || "\u00a0";
    }] } };
  }

  /** Make the chart: uPlot in a box with the given id; kept in PP.charts. */
  function make(id, opts, data, extra) {
    const box = el("div", { id, class: "chart" });
    const u = new uPlot({ width: width(), height: 360, ...opts }, data, box);
    PP.charts[id] = u;
    return [box, ...(extra || [])];
  }

  /** Align point series on the union of their x values (uPlot's data model): [xs, ys of each series], a
   *  series null where it has no point; ``pick`` reads each point's field. */
  function align(series, pick) {
    const xs = [...new Set(series.flatMap((s) => s.points.map((p) => p.x)))].sort((a, b) => a - b);
    const at = new Map(xs.map((x, i) => [x, i]));
    const cols = series.map((s) => {
      const col = xs.map(() => null);
      for (const p of s.points) col[at.get(p.x)] = pick(p);
      return col;
    });
    return [xs, cols];
  }

  /** Points over a numeric x. ``series``: [{label, points: [{x, y, info?}], color?, line?, size?,
   *  labelled?}]: a ``line`` joins its points, ``labelled`` writes its name beside them, ``info`` is shown
   *  under the chart when the cursor is at the point. ``x``/``y``: {label, format, log?, max?}: a point above
   *  ``y.max`` is drawn on the top edge (its label says ↑, the legend its value). ``limits``: [{label, value,
   *  color, axis?}], lines across the plot. Returns the nodes, and ``update(points)`` that redraws with each
   *  series' new points (the same series, in order). */
  function scatter(id, { series, x, y, limits = [] }) {
    const state = { raw: [], shown: [], infos: [], top: null };
    const fmtY = (v) => (v === null || v === undefined ? "–" : y.format(v));
    const fmtX = (v) => (v === null || v === undefined ? "–" : x.format(v));
    function compute(pointLists) {
      const sets = series.map((s, k) => ({ points: pointLists[k] || [] }));
      const [xs, raw] = align(sets, (p) => p.y);
      state.raw = raw;
      state.infos = align(sets, (p) => p.info || null)[1];
      state.shown = raw.map((col) => col.map((v) => (v !== null && y.max !== undefined && v > y.max ? y.max : v)));
      const highest = y.max !== undefined ? y.max : Math.max(...limits.filter((l) => l.axis !== "x").map((l) => l.value),
        ...state.shown.flat().filter((v) => v !== null));
      state.top = Number.isFinite(highest) && highest > 0 ? highest : null;
      return [xs, ...state.shown, ...limits.map((lim) => xs.map(() => (lim.axis === "x" ? null : lim.value)))];
    }
    const data = compute(series.map((s) => s.points));
    const uSeries = [{ label: x.label, value: (u, v) => fmtX(v) }];
    series.forEach((s, k) => {
      const color = s.color || PALETTE[k % PALETTE.length];
      uSeries.push({ label: s.label, stroke: color, width: s.line ? 2 : 0, spanGaps: true,
        fill: s.line ? undefined : color, paths: s.line ? undefined : () => null,
        points: { show: true, size: s.size || (s.line ? 5 : 8), width: s.size ? 2 : 1, stroke: s.size ? "#1d232b" : color,
          fill: color },
        value: (u, v, si, i) => (i === null || i === undefined ? "–" : fmtY(state.raw[k][i])) });
    });
    for (const lim of limits) {
      uSeries.push({ label: lim.label, stroke: lim.color, width: 2, dash: [6, 3], paths: () => null,
        points: { show: false }, value: () => (lim.axis === "x" ? fmtX : fmtY)(lim.value) });
    }
    const labelled = series.flatMap((s, k) => (s.labelled ? [{ seriesIdx: k + 1, label: (i) =>
      (state.raw[k][i] > state.shown[k][i] ? `${s.label} ↑ ${fmtY(state.raw[k][i])}` : s.label) }] : []));
    const info = el("p", { class: "readout hint", id: `${id}-readout`, text: "\u00a0" });
    const pad = (lo, hi) => (lo === null || lo === undefined ? [0, 1]
      : hi > lo ? [lo - (hi - lo) * 0.06, hi + (hi - lo) * 0.06] : [lo * 0.9, hi * 1.1 + 1e-9]);
    const xScale = x.log ? { time: false, distr: 3, log: x.log } : { time: false, range: (u, lo, hi) => pad(lo, hi) };
    const yRange = (u, lo, hi) => [y.min !== undefined ? y.min : Math.min(0, lo || 0), (state.top || hi || 1) * 1.06];
    const nodes = make(id, {
      series: uSeries,
      scales: { x: xScale, y: { range: yRange } },
      axes: [axis(x.label, x.format), axis(y.label, y.format)],
      legend: { live: true },
      cursor: { drag: { x: true, y: false }, focus: { prox: 24 } },
      plugins: [limitLines(limits), pointLabels(labelled), readout(info, () => state.infos)],
    }, data, [info]);
    return { nodes, update: (pointLists) => PP.charts[id].setData(compute(pointLists)) };
  }

  /** Stacked bars, one per group: ``stack`` [{label, values, color}] bottom up; ``marks`` [{label, values,
   *  color}] a dot on each bar; ``limits`` lines across. Values in the y axis' unit. */
  function stackedBars(id, { groups, stack, marks = [], limits = [], y }) {
    const n = groups.length;
    const lower = [], upper = [];
    const run = groups.map(() => 0);
    for (const s of stack) {
      lower.push(run.slice());
      s.values.forEach((v, i) => { run[i] += v || 0; });
      upper.push(run.slice());
    }
    const top = Math.max(...run, ...marks.flatMap((m) => m.values), ...limits.map((l) => l.value), 1e-9) * 1.08;
    const fmt = (v) => (v === null || v === undefined ? "–" : y.format(v));
    const uSeries = [{ label: "stage", value: (u, i) => (i === null || i === undefined ? "–" : groups[Math.round(i)]) }];
    stack.forEach((s, k) => uSeries.push({ label: s.label, fill: s.color, stroke: s.color, width: 0, value: (u, v) => fmt(v),
      points: { show: false }, paths: uPlot.paths.bars({ size: [0.6, 140], disp: {
        y0: { unit: 1, values: () => lower[k] }, y1: { unit: 1, values: () => upper[k] } } }) }));
    for (const m of marks) {
      uSeries.push({ label: m.label, stroke: m.color, fill: m.color, width: 0, paths: () => null, value: (u, v) => fmt(v),
        points: { show: true, size: 10, fill: m.color, stroke: "#fff", width: 1.5 } });
    }
    for (const lim of limits) {
      uSeries.push({ label: lim.label, stroke: lim.color, width: 2, dash: [6, 3], paths: () => null,
        points: { show: false }, value: () => fmt(lim.value) });
    }
    const xs = groups.map((g, i) => i);
    const data = [xs, ...stack.map((s) => s.values), ...marks.map((m) => m.values), ...limits.map((l) => xs.map(() => l.value))];
    return make(id, {
      height: 300,
      series: uSeries,
      scales: { x: { time: false, range: () => [-0.5, n - 0.5] }, y: { range: () => [0, top] } },
      axes: [axis("", null, { splits: () => xs, values: (u, splits) => splits.map((i) => groups[i] || "") }),
        axis(y.label, y.format)],
      legend: { live: true },
      cursor: { drag: { x: false, y: false }, points: { show: false } },
      plugins: [limitLines(limits)],
    }, data);
  }

  return { scatter, stackedBars, PALETTE };
})();
