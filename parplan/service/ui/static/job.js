// /ui/jobs/{id}: the job's live progress (events stream), then the way to its plan.
"use strict";

(async () => {
  const { el, api, fail, status } = PP;
  const id = PP.pageId();
  const content = document.getElementById("content");
  document.getElementById("title").textContent = `Job ${id}`;
  const state = el("span", { id: "job-status", class: "badge" });
  const bar = el("progress", { id: "job-progress", max: "1", value: "0" });
  const stage = el("span", { id: "job-stage" });
  const details = el("dl", { class: "details" });
  const actions = el("p", { id: "job-actions" });
  content.append(el("p", { class: "live" }, state, " ", bar, " ", stage), actions, details);
  const scopes = await PP.who();

  function show(job) {
    state.textContent = job.cancel_requested && job.status === "running" ? "cancelling" : job.status;
    state.className = `badge ${job.status}`;
    bar.value = job.progress.fraction || 0;
    stage.textContent = `${job.progress.stage || "–"} ${Math.round((job.progress.fraction || 0) * 100)}%`;
    const rows = [["created", PP.when(job.created_at)], ["started", PP.when(job.started_at)],
      ["finished", PP.when(job.finished_at)], ["duration", PP.duration(job)], ["attempts", job.attempts]];
    if (job.error) rows.push(["error", `${job.error.code}: ${job.error.message}`]);
    details.replaceChildren(...rows.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { text: v })]));
    actions.replaceChildren();
    if (job.plan_id) actions.append(el("a", { id: "plan-link", class: "button", href: `/ui/plans/${job.plan_id}`,
      text: "Open the plan" }));
    if (!PP.TERMINAL.has(job.status) && !job.cancel_requested && scopes.includes("plans:write")) {
      const b = el("button", { type: "button", class: "cancel", text: "Cancel" });
      b.addEventListener("click", async () => {
        b.disabled = true;
        try {
          show((await api(`/v1/jobs/${id}/cancel`, { method: "POST" })).data.job);
        } catch (err) {
          fail(err);
        }
      });
      actions.append(b);
    }
  }

  try {
    const first = (await api(`/v1/jobs/${id}`)).data.job;
    if (first.kind === "capacity") {  // a sweep has a page of its own, live too
      location.replace(`/ui/capacity/${id}`);
      return;
    }
    show(first);
    const job = await PP.follow(id, show);
    if (job.status === "succeeded" && job.plan_id) {
      status("done; opening the plan…");
      setTimeout(() => location.assign(`/ui/plans/${job.plan_id}`), 600);
    } else {
      status(`the job ended: ${job.status}`, job.status === "failed" ? "error" : "");
    }
  } catch (err) {
    fail(err);
  }
})();
