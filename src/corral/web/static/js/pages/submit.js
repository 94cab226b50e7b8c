// Submit a job by form (task roles, instances, resources, command, environment, retries) or by
// pasting YAML. Checks that need no server are done here (nothing is sent while they fail); the
// API's 422 errors are shown next to the field their `loc` names. `?clone=ID` prefills from a job.

import { ApiError, api, get } from "../api.js";
import { currentUser, navigate } from "../app.js";
import { clear, fill, h, toYaml, toast } from "../ui.js";

const NAME_RE = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;
const MEMORY_RE = /^\s*\d+(\.\d+)?\s*[A-Za-z]*\s*$/;

const EXAMPLE_YAML = `name: my-training
priority: normal
retries: 0
tasks:
  trainer:
    instances: 1
    resources: {gpus: 1, cpus: 4, memory: 8GiB}
    command: python train.py --epochs 10
env:
  EPOCHS: "10"
`;

let fieldSeq = 0;

// One labelled input with a slot for its error message (aria-describedby points at it).
function field(label, input, hint) {
  const id = input.id || `f${++fieldSeq}`;
  input.id = id;
  const error = h("p", { class: "field-error", id: `${id}-error`, hidden: true });
  input.setAttribute("aria-describedby", `${id}-error`);
  return h(
    "div",
    { class: "field" },
    h("label", { for: id }, label),
    input,
    hint ? h("p", { class: "hint" }, hint) : null,
    error,
  );
}

function setError(input, message) {
  const slot = document.getElementById(`${input.id}-error`);
  input.setAttribute("aria-invalid", message ? "true" : "false");
  if (slot) {
    slot.textContent = message || "";
    slot.hidden = !message;
  }
}

function taskFieldset(role, task, onRemove) {
  const res = (task && task.resources) || {};
  const memory = res.memory === undefined ? "4GiB" : typeof res.memory === "number" ? `${res.memory}MiB` : res.memory;
  const inputs = {
    role: h("input", { value: role, class: "task-role", autocomplete: "off" }),
    instances: h("input", { type: "number", min: 1, max: 64, value: task.instances ?? 1, class: "task-instances" }),
    gpus: h("input", { type: "number", min: 0, max: 64, value: res.gpus ?? 0, class: "task-gpus" }),
    gpu_model: h("input", { value: res.gpu_model ?? "", placeholder: "any", class: "task-gpu-model" }),
    cpus: h("input", { type: "number", min: 0.1, step: "any", value: res.cpus ?? 1, class: "task-cpus" }),
    memory: h("input", { value: memory, class: "task-memory" }),
    command: h("textarea", { rows: 3, class: "task-command", spellcheck: "false" }, task.command || ""),
  };
  const fs = h(
    "fieldset",
    { class: "task" },
    h("legend", {}, "Task"),
    h(
      "div",
      { class: "grid-fields" },
      field("Role name", inputs.role),
      field("Instances", inputs.instances, "gang-scheduled"),
      field("GPUs per instance", inputs.gpus),
      field("GPU model", inputs.gpu_model, "e.g. A100 or A100|H100"),
      field("CPUs per instance", inputs.cpus),
      field("Memory per instance", inputs.memory, "e.g. 512MiB, 16GiB"),
    ),
    field("Command", inputs.command),
    h("button", { type: "button", class: "button subtle remove-task", onclick: () => onRemove(fs) }, "Remove this task"),
  );
  fs.inputs = inputs;
  fs.original = task || {}; // a cloned task's fields the form does not show (its env) are kept
  return fs;
}

function envToText(env) {
  return Object.entries(env || {})
    .map(([k, v]) => `${k}=${v}`)
    .join("\n");
}

export async function render(ctx) {
  const me = currentUser();
  let prefill = null;
  const cloneId = ctx.query.get("clone");
  if (cloneId) prefill = (await get(`/jobs/${encodeURIComponent(cloneId)}`)).spec || null;
  const spec = prefill || {};
  const groups = (me.groups || []).map((g) => (typeof g === "string" ? g : g.name));

  const general = h("div", { class: "error-box", role: "alert", id: "submit-errors", hidden: true });
  const inputs = {
    name: h("input", { id: "job-name", value: spec.name ? `${spec.name}${cloneId ? "-copy" : ""}` : "", required: true }),
    group: h(
      "select",
      { id: "job-group" },
      h("option", { value: "" }, `default (${me.default_group || "none"})`),
      groups.map((g) => h("option", { value: g, selected: g === spec.group }, g)),
    ),
    priority: h(
      "select",
      { id: "job-priority" },
      ["low", "normal", "high"].map((p) => h("option", { value: p, selected: p === (spec.priority || "normal") }, p)),
    ),
    environment: h("input", { id: "job-environment", value: spec.environment || "default" }),
    retries: h("input", { id: "job-retries", type: "number", min: 0, max: 20, value: spec.retries ?? 0 }),
    max_runtime: h("input", { id: "job-max-runtime", value: spec.max_runtime || "", placeholder: "e.g. 6h" }),
    preemptible: h("input", { id: "job-preemptible", type: "checkbox", checked: spec.preemptible !== false }),
    env: h("textarea", { id: "job-env", rows: 3, spellcheck: "false", placeholder: "KEY=value, one per line" }, envToText(spec.env)),
  };
  const tasksBox = h("div", { class: "tasks" });
  const removeTask = (fs) => {
    if (tasksBox.children.length > 1) fs.remove();
    else toast("A job needs at least one task.", "error");
  };
  const initialTasks = Object.entries(spec.tasks || { main: { instances: 1, resources: { gpus: 1, cpus: 1 }, command: "" } });
  for (const [role, task] of initialTasks) tasksBox.append(taskFieldset(role, task, removeTask));
  const addTask = h(
    "button",
    {
      type: "button",
      class: "button subtle",
      onclick: () => {
        const fs = taskFieldset(`task${tasksBox.children.length + 1}`, { instances: 1, resources: {} }, removeTask);
        tasksBox.append(fs);
        fs.inputs.role.focus();
      },
    },
    "+ Add a task role",
  );

  const form = h(
    "form",
    { id: "submit-form", class: "card", novalidate: true },
    general,
    h(
      "div",
      { class: "grid-fields" },
      field("Job name", inputs.name),
      field("Group", inputs.group),
      field("Priority", inputs.priority),
      field("Environment", inputs.environment, "a named Python environment (local) or an image"),
      field("Retries", inputs.retries, "whole-job retries on failure"),
      field("Max runtime", inputs.max_runtime, "optional: 90m, 6h, 1d"),
    ),
    h("div", { class: "field checkbox" }, inputs.preemptible, h("label", { for: "job-preemptible" }, "Preemptible (may borrow idle quota)")),
    h("h2", {}, "Tasks"),
    tasksBox,
    addTask,
    field("Environment variables", inputs.env, "KEY=value, one per line"),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "button primary", id: "submit-job" }, "Submit job")),
  );

  const yamlText = h("textarea", { id: "job-yaml", rows: 18, spellcheck: "false", class: "code" }, prefill ? toYaml(prefill) : EXAMPLE_YAML);
  const yamlErrors = h("div", { class: "error-box", role: "alert", id: "yaml-errors", hidden: true });
  const yamlForm = h(
    "form",
    { id: "yaml-form", class: "card", novalidate: true, hidden: true },
    yamlErrors,
    h("div", { class: "field" }, h("label", { for: "job-yaml" }, "Job spec (YAML)"), yamlText),
    h("div", { class: "actions" }, h("button", { type: "submit", class: "button primary", id: "submit-yaml" }, "Submit YAML")),
  );

  const tabs = tabBar(
    [
      ["Form", form],
      ["YAML", yamlForm],
    ],
    ctx.query.get("tab") === "yaml" ? 1 : 0,
  );
  ctx.main.append(h("h1", {}, cloneId ? `Clone job #${cloneId}` : "Submit a job"), tabs, form, yamlForm);

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    submitForm(form, inputs, tasksBox, general, spec);
  });
  yamlForm.addEventListener("submit", (event) => {
    event.preventDefault();
    submitYaml(yamlText, yamlErrors);
  });
}

// The chosen tab is kept in the address (?tab=yaml, next to ?clone=), so a reload shows it again.
// Replaced, not pushed: Back leaves the page rather than stepping through the tabs, and nothing is
// drawn again (a push would re-render the page and lose what was typed).
function tabBar(tabs, initial) {
  const select = (i) => {
    tabs.forEach(([, p], j) => {
      p.hidden = j !== i;
      buttons[j].setAttribute("aria-selected", j === i ? "true" : "false");
    });
  };
  const buttons = tabs.map(([label, panel], i) => {
    panel.setAttribute("role", "tabpanel");
    panel.setAttribute("aria-labelledby", `tab-${label.toLowerCase()}`);
    return h(
      "button",
      {
        type: "button",
        role: "tab",
        class: "tab",
        id: `tab-${label.toLowerCase()}`,
        "aria-controls": panel.id,
        onclick: () => {
          select(i);
          const url = new URL(window.location.href);
          if (i === 0) url.searchParams.delete("tab");
          else url.searchParams.set("tab", label.toLowerCase());
          history.replaceState(history.state, "", url.pathname + url.search);
        },
      },
      label,
    );
  });
  select(initial);
  return h("div", { class: "tabs", role: "tablist", "aria-label": "How to give the spec" }, buttons);
}

// What the form itself sets; the rest of a cloned spec (code, mounts, secrets, stop_grace, idle_gpu,
// on_hang ...) is submitted as it was, so a clone by form is the job again, not a job without its
// code or data. `kind` is left out: the form submits a batch job.
const FORM_KEYS = new Set(["name", "group", "priority", "environment", "retries", "max_runtime", "preemptible", "env", "tasks", "kind"]);
const TASK_FORM_KEYS = new Set(["instances", "resources", "command"]);

function keptFrom(original, formKeys) {
  return Object.fromEntries(Object.entries(original || {}).filter(([key]) => !formKeys.has(key)));
}

// Build the spec from the form over `base` (the cloned spec, or {}); returns {spec, fields: Map(loc
// -> input), errors: [[input, msg]]}.
function collect(inputs, tasksBox, base) {
  const errors = [];
  const fields = new Map();
  const spec = { ...keptFrom(base, FORM_KEYS), name: inputs.name.value.trim(), priority: inputs.priority.value, tasks: {} };
  for (const key of ["name", "group", "priority", "environment", "retries", "max_runtime", "preemptible", "env"]) {
    fields.set(key, inputs[key]);
  }
  if (!spec.name) errors.push([inputs.name, "Give the job a name."]);
  else if (!NAME_RE.test(spec.name)) errors.push([inputs.name, "Use letters, digits, '.', '_' or '-' (start with a letter or digit)."]);
  if (inputs.group.value) spec.group = inputs.group.value;
  spec.environment = inputs.environment.value.trim() || "default";
  spec.retries = intValue(inputs.retries, 0, 20, errors);
  if (inputs.max_runtime.value.trim()) spec.max_runtime = inputs.max_runtime.value.trim();
  spec.preemptible = inputs.preemptible.checked;
  spec.env = parseEnv(inputs.env, errors);
  for (const fs of tasksBox.children) {
    const t = fs.inputs;
    const role = t.role.value.trim();
    if (!role || !NAME_RE.test(role)) errors.push([t.role, "Use letters, digits, '.', '_' or '-'."]);
    else if (spec.tasks[role]) errors.push([t.role, `Another task is already named ${role}.`]);
    const task = {
      ...keptFrom(fs.original, TASK_FORM_KEYS),
      instances: intValue(t.instances, 1, 64, errors),
      resources: {
        gpus: intValue(t.gpus, 0, 64, errors),
        cpus: numberValue(t.cpus, errors),
        memory: t.memory.value.trim(),
      },
      command: t.command.value.trim(),
    };
    if (t.gpu_model.value.trim()) task.resources.gpu_model = t.gpu_model.value.trim();
    if (!MEMORY_RE.test(task.resources.memory)) errors.push([t.memory, "Give a size such as 512MiB or 16GiB."]);
    if (!task.command) errors.push([t.command, "Give the command to run."]);
    spec.tasks[role] = task;
    const base = `tasks.${role}`;
    fields.set(base, t.role);
    fields.set(`${base}.instances`, t.instances);
    fields.set(`${base}.command`, t.command);
    fields.set(`${base}.resources`, t.gpus);
    for (const key of ["gpus", "gpu_model", "cpus", "memory"]) fields.set(`${base}.resources.${key}`, t[key]);
  }
  fields.set("tasks", tasksBox.firstElementChild ? tasksBox.firstElementChild.inputs.role : inputs.name);
  return { spec, fields, errors };
}

function intValue(input, min, max, errors) {
  const raw = input.value.trim();
  const n = Number(raw);
  if (raw === "" || !Number.isInteger(n) || n < min || n > max) {
    errors.push([input, `Give a whole number from ${min} to ${max}.`]);
    return raw;
  }
  return n;
}

function numberValue(input, errors) {
  const n = Number(input.value.trim());
  if (!input.value.trim() || !Number.isFinite(n) || n <= 0) {
    errors.push([input, "Give a number above 0."]);
    return input.value;
  }
  return n;
}

function parseEnv(input, errors) {
  const env = {};
  const lines = input.value.split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
  for (const [i, line] of lines.entries()) {
    const eq = line.indexOf("=");
    const key = eq > 0 ? line.slice(0, eq).trim() : "";
    if (!ENV_NAME_RE.test(key)) {
      errors.push([input, `Line ${i + 1} must look like NAME=value (letters, digits and '_').`]);
      break;
    }
    env[key] = line.slice(eq + 1);
  }
  return env;
}

function clearErrors(form, general) {
  for (const input of form.querySelectorAll("[aria-invalid='true']")) setError(input, "");
  general.hidden = true;
  clear(general);
}

// The input whose loc is the longest prefix of the error's loc ("tasks.main.resources.gpus").
function inputForLoc(fields, loc) {
  const parts = loc.map(String);
  for (let n = parts.length; n > 0; n--) {
    const input = fields.get(parts.slice(0, n).join("."));
    if (input) return input;
  }
  return null;
}

function showErrors(pairs, general) {
  const unplaced = [];
  const byInput = new Map();
  for (const [input, msg, loc] of pairs) {
    if (input) byInput.set(input, byInput.has(input) ? `${byInput.get(input)} ${msg}` : msg);
    else unplaced.push(loc && loc.length ? `${loc.join(".")}: ${msg}` : msg);
  }
  for (const [input, msg] of byInput) setError(input, msg);
  fill(general, 
    h("strong", {}, "The job was not submitted. "),
    byInput.size ? "Fix the fields marked below." : "",
    unplaced.length ? h("ul", {}, unplaced.map((m) => h("li", {}, m))) : null,
  );
  general.hidden = false;
  const first = byInput.keys().next().value;
  (first || general).focus();
}

async function submitForm(form, inputs, tasksBox, general, base) {
  clearErrors(form, general);
  const { spec, fields, errors } = collect(inputs, tasksBox, base);
  if (errors.length) {
    showErrors(errors, general);
    return;
  }
  const button = form.querySelector("#submit-job");
  button.disabled = true;
  try {
    const job = await api("POST", "/jobs", { json: spec });
    toast(`Job #${job.id} submitted.`, "success");
    navigate(`/jobs/${job.id}`);
  } catch (err) {
    if (err instanceof ApiError && err.fieldErrors.length) {
      showErrors(err.fieldErrors.map((e) => [inputForLoc(fields, e.loc), e.msg, e.loc]), general);
    } else {
      showErrors([[null, err.message, []]], general);
    }
  } finally {
    button.disabled = false;
  }
}

async function submitYaml(textarea, box) {
  box.hidden = true;
  textarea.setAttribute("aria-invalid", "false");
  if (!textarea.value.trim()) {
    showYamlErrors(box, textarea, ["Paste a job spec first."]);
    return;
  }
  try {
    const job = await api("POST", "/jobs", { text: textarea.value, contentType: "application/yaml" });
    toast(`Job #${job.id} submitted.`, "success");
    navigate(`/jobs/${job.id}`);
  } catch (err) {
    const msgs = err instanceof ApiError && err.fieldErrors.length
      ? err.fieldErrors.map((e) => (e.loc.length ? `${e.loc.join(".")}: ${e.msg}` : e.msg))
      : [err.message];
    showYamlErrors(box, textarea, msgs);
  }
}

function showYamlErrors(box, textarea, messages) {
  textarea.setAttribute("aria-invalid", "true");
  fill(box, h("strong", {}, "The job was not submitted:"), h("ul", {}, messages.map((m) => h("li", {}, m))));
  box.hidden = false;
  textarea.focus();
}
