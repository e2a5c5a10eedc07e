// parplan dashboard: what every page shares. Plain DOM built from text (never parsed HTML), fetch with the
// token from sessionStorage as a header, Server-Sent Events read from fetch.
"use strict";

const PP = (() => {
  const TOKEN_KEY = "parplan.token";
  const GIB = 2 ** 30;
  const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

  function append(node, children) {
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  /** An element: attributes set with setAttribute (``text`` sets its text), children appended. */
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") node.textContent = String(v);
      else if (k === "on") for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
      else node.setAttribute(k, v === true ? "" : String(v));
    }
    return append(node, children);
  }

  class ApiError extends Error {
    constructor(status, problem) {
      super((problem && problem.detail) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem || {};
    }
  }

  const token = () => sessionStorage.getItem(TOKEN_KEY);

  function headers(extra) {
    const h = new Headers(extra || {});
    const t = token();
    if (t) h.set("Authorization", `Bearer ${t}`);
    return h;
  }

  /** Ask for a token once (the form in the page); the page reloads with it. */
  function askToken(problem) {
    const form = document.getElementById("auth");
    if (!form.hidden) return;
    form.hidden = false;
    if (token()) {
      document.getElementById("auth-error").textContent = (problem && problem.detail) || "the token was refused";
    }
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      sessionStorage.setItem(TOKEN_KEY, document.getElementById("auth-token").value.trim());
      location.reload();
    });
    document.getElementById("auth-token").focus();
  }

  /** Call the API: resolves to {status, data, headers}; rejects with ApiError (a problem document). */
  async function api(path, opts = {}) {
    const h = headers(opts.headers);
    let body = opts.body;
    if (opts.json !== undefined) {
      h.set("Content-Type", "application/json");
      body = JSON.stringify(opts.json);
    }
    const r = await fetch(path, { method: opts.method || "GET", headers: h, body, signal: opts.signal });
    const type = r.headers.get("content-type") || "";
    const data = type.includes("json") ? await r.json() : await r.text();
    if (r.status === 401) askToken(data);
    if (!r.ok) throw new ApiError(r.status, typeof data === "object" ? data : { detail: data });
    return { status: r.status, data, headers: r.headers };
  }

  function status(message, kind) {
    const box = document.getElementById("status");
    box.textContent = message || "";
    box.className = `status ${kind || ""}`;
  }

  function fail(err) {
    if (err instanceof ApiError && err.status === 401) return status("");
    status(err instanceof ApiError ? `${err.status}: ${err.message}` : String(err), "error");
  }

  /** The caller's scopes (shown in the header); [] when the server refuses the token. */
  async function who() {
    try {
      const { data } = await api("/v1/whoami");
      const box = document.getElementById("who");
      box.textContent = `${data.name} · ${data.scopes.join(", ")} `;
      if (token()) {
        box.appendChild(el("button", { type: "button", class: "link", text: "forget token",
          on: { click: () => { sessionStorage.removeItem(TOKEN_KEY); location.reload(); } } }));
      }
      return data.scopes;
    } catch (err) {
      return [];
    }
  }

  const gib = (bytes) => (bytes === null || bytes === undefined ? "–" : (bytes / GIB).toFixed(2));
  const pct = (x) => (x === null || x === undefined ? "–" : `${(x * 100).toFixed(1)}%`);
  function seconds(s) {
    if (s === null || s === undefined) return "–";
    if (s < 1) return `${(s * 1000).toFixed(1)} ms`;
    if (s < 120) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
    return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
  }
  const when = (iso) => (iso ? new Date(iso).toLocaleString() : "–");

  /** How long a job took (finished), has been running, or has waited. */
  function duration(job) {
    const t = (iso) => (iso ? new Date(iso).getTime() : null);
    const start = t(job.started_at) || t(job.created_at);
    const end = t(job.finished_at) || Date.now();
    return seconds(Math.max(0, (end - start) / 1000));
  }

  function progressCell(job) {
    const p = job.progress || {};
    return el("span", { class: "progress" },
      el("progress", { max: "1", value: String(p.fraction || 0) }),
      ` ${p.stage || "–"} ${Math.round((p.fraction || 0) * 100)}%`);
  }

  /** Read a Server-Sent Events stream with fetch (EventSource cannot send the token header).
   *  ``position.lastId`` is the id of the last event read; when set, it is sent as Last-Event-ID. */
  async function readEvents(path, onEvent, position, signal) {
    const extra = { Accept: "text/event-stream" };
    if (position.lastId !== null) extra["Last-Event-ID"] = position.lastId;
    const r = await fetch(path, { headers: headers(extra), signal });
    if (!r.ok || !r.body) {
      const type = r.headers.get("content-type") || "";
      throw new ApiError(r.status, type.includes("json") ? await r.json() : null);
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let name = "message";
        let id = null;
        const data = [];
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) name = line.slice(7);
          else if (line.startsWith("id: ")) id = line.slice(4);
          else if (line.startsWith("data: ")) data.push(line.slice(6));
        }
        if (!data.length) continue;
        if (id !== null) position.lastId = id;
        onEvent(name, JSON.parse(data.join("\n")));
      }
    }
  }

  /** Follow a job to its end: the events stream (reconnecting with Last-Event-ID when it breaks, up
   *  to 3 times in a row without news), then long polls when streaming fails. */
  async function follow(jobId, onJob) {
    let last = null;
    const position = { lastId: null };
    let misses = 0;
    for (;;) {
      let got = 0;
      try {
        await readEvents(`/v1/jobs/${jobId}/events`, (name, data) => {
          last = name === "end" ? data.job : data;
          got += 1;
          onJob(last);
        }, position);
      } catch (err) {
        if (err instanceof ApiError && err.status !== 0 && err.status < 500) throw err;
        if (err instanceof ApiError) break;
      }
      if (last && TERMINAL.has(last.status)) return last;
      if (position.lastId === null) break;
      misses = got ? 0 : misses + 1;
      if (misses >= 3) break;
      await new Promise((done) => setTimeout(done, 500 * 2 ** Math.max(0, misses - 1)));
    }
    for (;;) {
      const { data } = await api(`/v1/jobs/${jobId}?wait=25`);
      last = data.job;
      onJob(last);
      if (TERMINAL.has(last.status)) return last;
    }
  }

  /** A table: ``head`` is a list of labels, ``rows`` lists of cells (text or nodes). */
  function table(head, rows, attrs) {
    return el("table", attrs || {},
      el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))),
      el("tbody", {}, rows.map((r) => el("tr", {}, r.map((c) => el("td", {}, c))))));
  }

  const pageId = () => document.body.dataset.id;

  return { el, api, ApiError, status, fail, who, gib, pct, seconds, when, duration, progressCell, follow,
           table, pageId, TERMINAL, GIB, append };
})();
