// Job templates: the ones you may use (parameters, sharing, uses), and a template's form, built
// from its typed parameters. Values are checked here first (type, range, choices: nothing is sent
// while one is wrong, and the message names the parameter); the server checks them again and its
// 422 lands next to the parameter its `loc` names. `?name=T` opens a template, `&model=M@V`
// prefills the model mounted read-only at /models/M (fine-tune from the Models page).

import { ApiError, get, post } from "../api.js";
import { emptyState, errorBox, fill, h, link, section, table, toast } from "../ui.js";

const params = () => new URLSearchParams(window.location.search);

function inputFor(p) {
  const attrs = { name: p.name, id: `param-${p.name}`, "data-type": p.type, autocomplete: "off" };
  if (p.type === "bool") return h("input", { ...attrs, type: "checkbox", checked: p.default === true });
  if (p.type === "choice") {
    return h(
      "select",
      attrs,
      p.choices.map((c) => h("option", { value: String(c), selected: String(c) === String(p.default) }, String(c))),
    );
  }
  const number = p.type === "int" || p.type === "float";
  return h("input", {
    ...attrs,
    type: number ? "number" : "text",
    step: p.type === "int" ? 1 : number ? "any" : undefined,
    min: p.min,
    max: p.max,
    value: p.default === undefined ? "" : String(p.default),
    placeholder: p.default === undefined ? "required" : undefined,
  });
}

// The value of one parameter's input, or an error naming the parameter (the server's rules).
export function checkValue(p, input) {
  const name = `parameter '${p.name}'`;
  if (p.type === "bool") return { value: input.checked };
  const text = input.value.trim();
  if (text === "") return p.default === undefined ? { error: `${name} has no default; give it a value` } : { skip: true };
  if (p.type === "choice") return { value: text };
  if (p.type === "string") return { value: input.value };
  const number = Number(text);
  if (!Number.isFinite(number)) return { error: `${name}: expected a number, got '${text}'` };
  if (p.type === "int" && !Number.isInteger(number)) return { error: `${name}: expected an integer, got '${text}'` };
  if (p.min !== undefined && number < p.min) return { error: `${name}: ${number} is less than the minimum ${p.min}` };
  if (p.max !== undefined && number > p.max) return { error: `${name}: ${number} is more than the maximum ${p.max}` };
  return { value: number };
}

function templateForm(t) {
  const errors = new Map();
  const rows = t.parameters.map((p) => {
    const input = inputFor(p);
    const error = h("p", { class: "field-error", id: `param-${p.name}-error`, hidden: true });
    errors.set(p.name, error);
    const hint = [p.description, p.min !== undefined || p.max !== undefined ? `range ${p.min ?? ""}..${p.max ?? ""}` : null]
      .filter(Boolean)
      .join(" · ");
    return h("div", { class: "field" }, h("label", { for: input.id }, `${p.name} (${p.type})`), input, hint ? h("p", { class: "hint" }, hint) : null, error);
  });
  const model = h("input", { name: "model", id: "template-model", value: params().get("model") || "", placeholder: "e.g. digits@2 (optional)" });
  const result = h("div", { id: "template-result" });
  const showError = (name, message) => {
    const slot = errors.get(name);
    if (slot) {
      slot.textContent = message;
      slot.hidden = !message;
    }
  };
  const form = h(
    "form",
    { class: "form", id: "template-form", novalidate: true },
    rows,
    h("div", { class: "field" }, h("label", { for: model.id }, "Model (read-only at /models/NAME)"), model),
    h("button", { type: "submit", class: "button" }, "Submit job"),
    result,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const values = {};
    let bad = 0;
    for (const p of t.parameters) {
      const checked = checkValue(p, form.elements[p.name]);
      showError(p.name, checked.error || "");
      if (checked.error) bad += 1;
      else if (!checked.skip) values[p.name] = checked.value;
    }
    if (bad) {
      fill(result, h("p", { class: "field-error" }, `Not submitted: ${bad} parameter${bad > 1 ? "s" : ""} to correct.`));
      return;
    }
    try {
      const body = { values, models: model.value.trim() ? [model.value.trim()] : [] };
      const job = await post(`/templates/${encodeURIComponent(t.name)}/use`, body);
      toast(`Job ${job.id} submitted from ${t.name}`);
      fill(result, h("p", {}, "Submitted: ", link(`/jobs/${job.id}`, `job ${job.id} (${job.name})`)));
    } catch (err) {
      const fields = err instanceof ApiError ? err.fieldErrors : [];
      for (const f of fields) if (f.loc[0] === "values" && f.loc[1]) showError(String(f.loc[1]), f.msg);
      fill(result, errorBox(err, "Not submitted"));
    }
  });
  return form;
}

export async function render(ctx) {
  const list = h("div", { id: "templates-list" });
  const detail = h("div", { id: "template-detail" });
  ctx.main.append(h("h1", {}, "Templates"), list, detail);
  try {
    const rows = await get("/templates");
    if (!ctx.alive()) return;
    const columns = [
      { label: "Name", cell: (t) => h("a", { href: `/templates?name=${encodeURIComponent(t.name)}` }, t.name) },
      { label: "Version", cell: (t) => `v${t.latest}` },
      { label: "Parameters", cell: (t) => t.parameters.map((p) => p.name).join(", ") || "—" },
      { label: "Shared", cell: (t) => (t.visibility === "group" ? `group ${t.group}` : t.visibility) },
      { label: "Uses", cell: (t) => String(t.uses) },
      { label: "Owner", cell: (t) => t.owner },
      { label: "Description", cell: (t) => t.description },
    ];
    fill(list, rows.length ? table(columns, rows) : emptyState("No templates you may use yet. Publish one with `corral template publish`."));
    const name = params().get("name");
    if (!name) return;
    const t = await get(`/templates/${encodeURIComponent(name)}`);
    if (!ctx.alive()) return;
    fill(
      detail,
      section(
        `Template ${t.name} v${t.version}`,
        t.description ? h("p", {}, t.description) : null,
        h("p", { class: "muted" }, `By ${t.owner} · used ${t.uses} times · CLI: corral template use ${t.name} --set NAME=VALUE`),
        templateForm(t),
      ),
    );
  } catch (err) {
    if (ctx.alive()) fill(detail, errorBox(err, "Cannot load templates"));
  }
}
