// /ui/validations/{id}: measured vs predicted memory per rank and category, with the error.
"use strict";

(async () => {
  const { el, api, fail } = PP;
  const id = PP.pageId();
  const content = document.getElementById("content");
  document.getElementById("title").textContent = `Validation ${id}`;
  PP.who();
  const errorCell = (rel) => el("span", { class: rel !== null && Math.abs(rel) > 0.1 ? "bad" : "good",
    text: rel === null || rel === undefined ? "–" : `${rel >= 0 ? "+" : ""}${(rel * 100).toFixed(1)}%` });

  try {
    const v = (await api(`/v1/validations/${id}`)).data.validation;
    content.append(el("dl", { class: "details" },
      el("dt", { text: "status" }), el("dd", {}, el("span", { class: `badge ${v.status}`, text: v.status })),
      el("dt", { text: "plan" }), el("dd", {}, el("a", { href: `/ui/plans/${v.plan_id}`, text: v.plan_id })),
      el("dt", { text: "agent" }), el("dd", { text: v.agent_id || "–" }),
      el("dt", { text: "finished" }), el("dd", { text: PP.when(v.finished_at) })));
    if (v.error) content.append(el("p", { class: "error", text: v.error }));
    const categories = (v.result && v.result.categories) || {};
    const rows = [];
    for (const [cat, entries] of Object.entries(categories)) {
      for (const e of entries) {
        rows.push([String(e.rank), cat, PP.gib(e.measured), PP.gib(e.predicted), errorCell(e.relative_error)]);
      }
    }
    rows.sort((a, b) => Number(a[0]) - Number(b[0]) || a[1].localeCompare(b[1]));
    content.append(el("h2", { text: "Measured vs predicted (GiB)" }),
      rows.length ? PP.table(["rank", "category", "measured", "predicted", "error"], rows, { id: "validation-table" })
        : el("p", { text: "no measurement yet" }));
    const maxErr = v.result && v.result.max_relative_error;
    if (maxErr !== null && maxErr !== undefined) {
      content.append(el("p", { id: "max-error", text: `largest relative error reported by the agent: ${PP.pct(maxErr)}` }));
    }
  } catch (err) {
    fail(err);
  }
})();
