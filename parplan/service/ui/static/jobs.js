// /ui: the jobs table, refreshed every two seconds, with a status filter and cancel buttons.
"use strict";

(async () => {
  const { el, api, fail, status } = PP;
  const STATUSES = ["", "queued", "running", "succeeded", "failed", "cancelled"];
  const content = document.getElementById("content");
  const filter = el("select", { id: "status-filter", name: "status" },
    STATUSES.map((s) => el("option", { value: s, text: s || "all" })));
  const body = el("tbody", { id: "jobs-body" });
  content.append(
    el("p", {}, el("label", {}, "Status ", filter), " ", el("a", { href: "/ui/new", class: "button" }, "New plan")),
    el("table", { id: "jobs", class: "jobs" },
      el("thead", {}, el("tr", {}, ["status", "progress", "model", "cluster", "objective", "target", "created",
        "duration", "cached", ""].map((h) => el("th", { text: h })))),
      body));
  const scopes = await PP.who();
  const canWrite = scopes.includes("plans:write");

  async function cancel(job, button) {
    button.disabled = true;
    try {
      await api(`/v1/jobs/${job.id}/cancel`, { method: "POST" });
      status(`cancel requested for job ${job.id}`);
      await refresh();
    } catch (err) {
      fail(err);
    }
  }

  function row(job) {
    const s = job.request_summary || {};
    const sweep = job.kind === "capacity";
    const actions = el("span", { class: "actions" }, el("a", { href: sweep ? `/ui/capacity/${job.id}`
      : `/ui/jobs/${job.id}`, text: sweep ? "capacity" : "job" }));
    if (job.plan_id) actions.append(" ", el("a", { href: `/ui/plans/${job.plan_id}`, text: "plan" }));
    if (canWrite && !PP.TERMINAL.has(job.status) && !job.cancel_requested) {
      const b = el("button", { type: "button", class: "cancel", "data-job": job.id, text: "cancel" });
      b.addEventListener("click", () => cancel(job, b));
      actions.append(" ", b);
    }
    return el("tr", { "data-job": job.id, "data-status": job.status },
      el("td", {}, el("span", { class: `badge ${job.status}`, text: job.cancel_requested && job.status === "running"
        ? "cancelling" : job.status })),
      el("td", {}, PP.progressCell(job)),
      el("td", { text: s.model || "–" }),
      el("td", { text: s.gpus ? `${s.gpus} × ${s.gpu}` : job.kind && job.kind !== "plan" ? `${job.kind} sweep` : "–" }),
      el("td", { text: s.objective || "–" }),
      el("td", { text: s.target || "–" }),
      el("td", { text: PP.when(job.created_at) }),
      el("td", { text: PP.duration(job) }),
      el("td", { text: s.cached ? "yes" : "" }),
      el("td", {}, actions));
  }

  async function refresh() {
    const q = filter.value ? `&status=${encodeURIComponent(filter.value)}` : "";
    try {
      const { data } = await api(`/v1/jobs?limit=50${q}`);
      body.replaceChildren(...data.jobs.map(row));
      if (!data.jobs.length) body.append(el("tr", {}, el("td", { colspan: "10", text: "no jobs" })));
      if (document.getElementById("status").classList.contains("error")) status("");
    } catch (err) {
      fail(err);
    }
  }

  filter.addEventListener("change", refresh);
  await refresh();
  setInterval(refresh, 2000);
})();
