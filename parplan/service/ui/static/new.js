// /ui/new: a plan request form. The API validates it; its problem document's errors are shown
// next to the fields they name.
"use strict";

(async () => {
  const { el, api, status } = PP;
  const content = document.getElementById("content");

  function field(name, label, input, hint) {
    input.setAttribute("name", name);
    input.id = `f-${name.replace(/\./g, "-")}`;
    return el("div", { class: "field", "data-field": name },
      el("label", { for: input.id, text: label }), input,
      hint ? el("small", { class: "hint", text: hint }) : null,
      el("span", { class: "field-error", "data-error-for": name }));
  }
  const text = (attrs) => el("input", Object.assign({ type: "text", inputmode: "decimal" }, attrs || {}));
  const select = (options, value) => el("select", {}, options.map((o) =>
    el("option", { value: o, text: o, selected: o === value })));

  const presetSelect = el("select", {});
  const gpuSelect = el("select", {});
  const source = select(["preset", "hf_config", "graph"], "preset");
  const form = el("form", { id: "plan-form", novalidate: true },
    el("fieldset", {}, el("legend", { text: "Model" }),
      field("model.source", "Source", source),
      field("model.preset", "Preset", presetSelect),
      field("model.hf_config", "Hugging Face config.json", el("input", { type: "file", accept: ".json" })),
      field("model.graph", "Graph JSON", el("input", { type: "file", accept: ".json" }))),
    el("fieldset", {}, el("legend", { text: "Cluster" }),
      field("cluster.gpus", "GPUs", text({ value: "8" })),
      field("cluster.gpus_per_node", "GPUs per node", text({ placeholder: "the GPU's default" })),
      field("cluster.gpu", "GPU", gpuSelect),
      field("cluster.gpu_memory_gib", "Device memory (GiB)", text({ placeholder: "the GPU's" }))),
    el("fieldset", {}, el("legend", { text: "Training" }),
      field("training.global_batch", "Global batch", text({ placeholder: "the GPU count" })),
      field("training.seq_len", "Sequence length", text({ placeholder: "the model's" })),
      field("training.micro_batch", "Micro-batch", text({ placeholder: "searched" }))),
    el("fieldset", {}, el("legend", { text: "Objective and search" }),
      field("objective.kind", "Objective", select(["min-memory", "max-throughput"], "min-memory")),
      field("objective.max_slowdown", "Max slowdown", text({ value: "0.1" }), "min-memory: within this of the fastest"),
      field("objective.memory_budget_gib", "Memory budget (GiB)", text({ placeholder: "all of it" })),
      field("objective.alpha", "Alpha (GiB per second)", text({ placeholder: "none" }),
        "min-memory as memory + alpha × step time"),
      field("search", "Search", select(["auto", "dp", "ilp"], "auto")),
      field("target", "Target", select(["any", "megatron", "torchtitan", "deepspeed", "galvatron", "parplan"], "any")),
      field("time_limit", "Time limit (s)", text({ placeholder: "60" }))),
    el("p", {}, el("button", { type: "submit", id: "submit", text: "Plan" })),
    el("div", { id: "form-errors", class: "field-error" }));
  content.append(form);

  function showSource() {
    for (const s of ["preset", "hf_config", "graph"]) {
      form.querySelector(`[data-field="model.${s}"]`).hidden = source.value !== s;
    }
  }
  source.addEventListener("change", showSource);
  showSource();


  /** A number when the text is one, else the text itself (the API then says what is wrong). */
  function value(name) {
    const raw = form.elements[name].value.trim();
    if (raw === "") return undefined;
    const n = Number(raw);
    return Number.isFinite(n) ? n : raw;
  }

  async function readJson(name) {
    const file = form.elements[name].files[0];
    if (!file) return undefined;
    try {
      return JSON.parse(await file.text());
    } catch (err) {
      throw new PP.ApiError(400, { detail: `${file.name} is not JSON`, errors: [{ field: name,
        message: `not a JSON file: ${err.message}` }] });
    }
  }

  function prune(obj) {
    const out = {};
    for (const [k, v] of Object.entries(obj)) if (v !== undefined) out[k] = v;
    return out;
  }

  async function requestBody() {
    const model = {};
    if (source.value === "preset") model.preset = presetSelect.value;
    else model[source.value] = await readJson(`model.${source.value}`);
    return prune({
      model,
      cluster: prune({ gpus: value("cluster.gpus"), gpus_per_node: value("cluster.gpus_per_node"),
        gpu: gpuSelect.value || undefined, gpu_memory_gib: value("cluster.gpu_memory_gib") }),
      training: prune({ global_batch: value("training.global_batch"), seq_len: value("training.seq_len"),
        micro_batch: value("training.micro_batch") }),
      objective: prune({ kind: form.elements["objective.kind"].value, max_slowdown: value("objective.max_slowdown"),
        memory_budget_gib: value("objective.memory_budget_gib"), alpha: value("objective.alpha") }),
      search: form.elements.search.value,
      target: form.elements.target.value,
      time_limit: value("time_limit"),
    });
  }

  /** The field an error names, or its closest named ancestor (model.hf_config.hidden_size → model.hf_config). */
  function slotFor(path) {
    const parts = String(path || "").split(".");
    while (parts.length) {
      const slot = form.querySelector(`[data-error-for="${CSS.escape(parts.join("."))}"]`);
      if (slot && !slot.closest("[hidden]")) return slot;
      parts.pop();
    }
    return null;
  }

  function showErrors(problem) {
    const general = document.getElementById("form-errors");
    const errors = problem.errors || [];
    const unplaced = [];
    for (const e of errors) {
      const slot = slotFor(e.field === "model" ? `model.${source.value}` : e.field);
      if (slot) {
        slot.textContent = slot.textContent ? `${slot.textContent}; ${e.message}` : e.message;
        slot.closest(".field").classList.add("invalid");
      } else {
        unplaced.push(`${e.field}: ${e.message}`);
      }
    }
    general.textContent = unplaced.join("; ") || (errors.length ? "" : problem.detail || "");
  }

  function clearErrors() {
    for (const s of form.querySelectorAll(".field-error")) s.textContent = "";
    for (const f of form.querySelectorAll(".field.invalid")) f.classList.remove("invalid");
  }

  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    clearErrors();
    status("submitting…");
    const button = document.getElementById("submit");
    button.disabled = true;
    try {
      const { status: code, data } = await api("/v1/plans", { method: "POST", json: await requestBody() });
      status(code === 200 ? "served from the plan cache" : "queued");
      location.assign(code === 200 && data.plan ? `/ui/plans/${data.plan.id}` : `/ui/jobs/${data.job.id}`);
    } catch (err) {
      if (err instanceof PP.ApiError && err.problem) {
        status(`${err.status}: ${err.problem.detail || "the request was refused"}`, "error");
        showErrors(err.problem);
      } else {
        PP.fail(err);
      }
    } finally {
      button.disabled = false;
    }
  });

  PP.who();
  try {
    const [models, gpus] = await Promise.all([api("/v1/models"), api("/v1/clusters/presets")]);
    presetSelect.replaceChildren(...models.data.models.map((m) => el("option", { value: m.name, text: m.name })));
    gpuSelect.replaceChildren(...gpus.data.gpus.map((g) => el("option", { value: g.name, text: g.name,
      selected: g.name === "A100-80GB" })));
  } catch (err) {
    PP.fail(err);
  }
})();
