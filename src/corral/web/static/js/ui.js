// Small DOM helpers shared by every page. Text always goes in through textContent (never
// innerHTML), so job names, log lines and alert texts cannot inject markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key === "value") el.value = value;
    else if (key === "checked" || key === "selected" || key === "disabled") el[key] = Boolean(value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function svgEl(tag, attrs, ...children) {
  const el = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  for (const child of children) {
    if (child !== null && child !== undefined) el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export function link(href, ...children) {
  return h("a", { href }, ...children);
}

// Replace el's children (null/false children are skipped, arrays flattened, like h()).
export function fill(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

// ---- formatting -----------------------------------------------------------------------------

// The API sends unix seconds (floats) or ISO strings; accept both.
export function toDate(value) {
  if (value === null || value === undefined || value === "") return null;
  if (typeof value === "number") return new Date(value * 1000);
  const d = new Date(value);
  return Number.isNaN(d.getTime()) ? null : d;
}

export function fmtTime(value) {
  const d = toDate(value);
  if (!d) return "—";
  const pad = (n) => String(n).padStart(2, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(
    d.getMinutes(),
  )}:${pad(d.getSeconds())}`;
}

export function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function fmtRelative(value) {
  const d = toDate(value);
  if (!d) return "—";
  const delta = (d.getTime() - Date.now()) / 1000;
  return delta >= 0 ? `in ${fmtDuration(delta)}` : `${fmtDuration(-delta)} ago`;
}

export function timeEl(value) {
  const d = toDate(value);
  if (!d) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: d.toISOString(), title: fmtTime(value) }, fmtRelative(value));
}

export const WAITING_STATES = ["queued", "scheduled", "starting", "preempted"];
export const TERMINAL_STATES = ["succeeded", "failed", "cancelled"];
export const ALL_STATES = ["queued", "scheduled", "starting", "running", "preempted", "succeeded", "failed", "cancelled"];

export function stateBadge(state) {
  const s = String(state || "unknown").toLowerCase();
  return h("span", { class: `badge state-${s}` }, s);
}

export function isTerminal(state) {
  return TERMINAL_STATES.includes(String(state || "").toLowerCase());
}

export function jobGpus(job) {
  const tasks = job && job.spec && job.spec.tasks;
  if (!tasks || typeof tasks !== "object") return null;
  let total = 0;
  for (const task of Object.values(tasks)) {
    const res = (task && task.resources) || {};
    total += Number(task.instances || 1) * Number(res.gpus || 0);
  }
  return total;
}

// ---- feedback ---------------------------------------------------------------------------------

export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  if (!box) return;
  const item = h("div", { class: `toast toast-${kind}` }, message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}

export function errorBox(err, title = "Something went wrong") {
  return h("div", { class: "error-box", role: "alert" }, h("strong", {}, title + ": "), String(err.message || err));
}

// A page's own line for a refused action (the API's words), as the login, submit and workspace
// forms show theirs: an error box kept outside what the page redraws on its timer, so the refusal
// stays until the next action or its close button, where a toast was gone in seconds (and a
// redraw would have wiped a message drawn inside it): {element, show(message), clear()}.
export function messageBox(id) {
  const text = h("span", { class: "message-text" });
  const close = h("button", { type: "button", class: "button subtle message-close", "aria-label": "Dismiss this message" }, "×");
  const element = h("div", { id, class: "error-box message-box", role: "alert", hidden: true }, text, close);
  const clearBox = () => {
    text.textContent = "";
    element.hidden = true;
  };
  close.addEventListener("click", clearBox);
  return {
    element,
    show(message) {
      text.textContent = message;
      element.hidden = false;
    },
    clear: clearBox,
  };
}

// An input with its label and its own error line (aria-describedby, aria-invalid), as the submit
// form's fields: {wrap, input, show(message), clear()}.
export function field(label, input) {
  const error = h("p", { class: "field-error", id: `${input.id}-error`, role: "alert", hidden: true });
  const labelEl = h("label", { for: input.id }, label);
  const wrap =
    input.type === "checkbox" // the box before its label, as the portal's other checkboxes
      ? h("div", { class: "field checkbox" }, input, labelEl, error)
      : h("div", { class: "field" }, labelEl, input, error);
  return {
    wrap,
    input,
    show(message) {
      error.textContent = message;
      error.hidden = false;
      input.setAttribute("aria-invalid", "true");
      input.setAttribute("aria-describedby", error.id);
    },
    clear() {
      error.hidden = true;
      input.removeAttribute("aria-invalid");
      input.removeAttribute("aria-describedby");
    },
  };
}

export function emptyState(text) {
  return h("p", { class: "empty" }, text);
}

export function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", {}, title), ...children);
}

// A table from rows: columns = [{label, cell: (row) => Node|string, class?}]
export function table(columns, rows, options = {}) {
  const head = h(
    "tr",
    {},
    columns.map((c) => h("th", { scope: "col", class: c.class }, c.header || c.label)),
  );
  const body = rows.map((row) =>
    h(
      "tr",
      {},
      columns.map((c) => h("td", { class: c.class, "data-label": c.label }, c.cell(row))),
    ),
  );
  return h(
    "div",
    { class: "table-wrap" },
    h("table", { class: "data " + (options.class || "") }, h("thead", {}, head), h("tbody", {}, body)),
  );
}

// A horizontal usage bar: used / total, with an optional marker (e.g. the guaranteed share).
export function usageBar(used, total, label, marker) {
  const pct = total > 0 ? Math.min(100, (used / total) * 100) : 0;
  const bar = h(
    "div",
    {
      class: "bar",
      role: "meter",
      "aria-valuemin": 0,
      "aria-valuemax": total,
      "aria-valuenow": used,
      "aria-label": label,
    },
    h("div", { class: "bar-fill" + (pct >= 100 ? " full" : ""), style: `width:${pct.toFixed(1)}%` }),
  );
  if (marker !== undefined && marker !== null && total > 0) {
    const left = Math.min(100, (marker / total) * 100);
    bar.append(h("div", { class: "bar-marker", style: `left:${left.toFixed(1)}%`, title: `guaranteed ${marker}` }));
  }
  return bar;
}

// ---- charts -------------------------------------------------------------------------------------

// A small inline-SVG line chart. series: [{name, points: [[x, v], ...]}]. By default x is unix
// seconds and v a percentage 0..100 (GPU utilization); `options.x: "steps"` makes x plain numbers
// (a job's reported metrics over their step) and the v axis the values' own range, any sign.
export function lineChart(series, options = {}) {
  const width = options.width || 900; // in the viewBox: a narrow chart's text stays readable
  const height = options.height || 200;
  const steps = options.x === "steps";
  const pad = { l: steps ? 64 : 36, r: 8, t: 8, b: 22 };
  const all = series.flatMap((s) => s.points);
  const svg = svgEl("svg", {
    viewBox: `0 0 ${width} ${height}`,
    class: "chart",
    role: "img",
    "aria-label": options.label || "chart",
  });
  if (!all.length) return svg;
  const t0 = Math.min(...all.map((p) => p[0]));
  // Time: at least a minute wide, so the first samples do not stretch across the whole chart.
  // Steps: at least one step wide, so a single point sits at the left.
  const t1 = Math.max(...all.map((p) => p[0]), t0 + (steps ? 1 : 60));
  const [vMin, vMax] = steps ? valueRange(all.map((p) => p[1])) : [0, options.max || 100];
  const x = (t) => pad.l + ((t - t0) / (t1 - t0)) * (width - pad.l - pad.r);
  const y = (v) => height - pad.b - ((Math.max(vMin, Math.min(vMax, v)) - vMin) / (vMax - vMin)) * (height - pad.t - pad.b);
  const vText = steps ? fmtNumber : (v) => `${Number(v).toFixed(0)}%`;
  for (const tick of [0, 25, 50, 75, 100]) {
    const value = vMin + (tick / 100) * (vMax - vMin);
    const ty = y(value);
    svg.append(svgEl("line", { x1: pad.l, x2: width - pad.r, y1: ty, y2: ty, class: "grid" }));
    svg.append(svgEl("text", { x: pad.l - 4, y: ty + 4, class: "axis", "text-anchor": "end" }, vText(value)));
  }
  const tText = steps ? (t) => `${options.xLabel || "step"} ${fmtNumber(t)}` : (t) => fmtTime(t).slice(11);
  svg.append(svgEl("text", { x: pad.l, y: height - 6, class: "axis" }, tText(t0)));
  svg.append(svgEl("text", { x: width - pad.r, y: height - 6, class: "axis", "text-anchor": "end" }, tText(t1)));
  series.forEach((s, i) => {
    const d = s.points.map((p, j) => `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ");
    const path = svgEl("path", { d, class: `series series-${i % 6}` });
    path.append(svgEl("title", {}, s.name));
    svg.append(path);
    // The latest sample as a dot: visible even while a series has a single point.
    const [lt, lv] = s.points[s.points.length - 1];
    const dot = svgEl("circle", { cx: x(lt).toFixed(1), cy: y(lv).toFixed(1), r: 3.5, class: `dot series-${i % 6}` });
    dot.append(svgEl("title", {}, `${s.name}: ${vText(lv)}`));
    svg.append(dot);
  });
  return svg;
}

// [min, max] of values, widened where they are all equal (a flat line is drawn mid-chart).
function valueRange(values) {
  const lo = Math.min(...values);
  const hi = Math.max(...values);
  if (hi > lo) return [lo, hi];
  const half = Math.abs(lo) / 2 || 1;
  return [lo - half, hi + half];
}

// A metric's value in at most 4 significant digits (12345.6 -> "12350", 123456.7 -> "1.235e+5").
export function fmtNumber(v) {
  const n = Number(v);
  if (!Number.isFinite(n)) return String(v);
  if (Number.isInteger(n) && Math.abs(n) < 1e6) return String(n);
  return Math.abs(n) >= 1e5 || (n !== 0 && Math.abs(n) < 1e-3) ? n.toPrecision(4).replace(/\.?0+e/, "e") : String(Number(n.toPrecision(4)));
}

// ---- labels ---------------------------------------------------------------------------------------

// A job's labels as chips `name=value`, sorted by name; each a link to the jobs list filtered by it
// where `href` is given (label -> address), plain text otherwise.
export function labelChips(labels, href) {
  const entries = Object.entries(labels || {}).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  if (!entries.length) return h("span", { class: "muted" }, "—");
  return h(
    "span",
    { class: "labels" },
    entries.map(([k, v]) => {
      const text = `${k}=${v}`;
      return href ? h("a", { class: "chip", href: href(text), title: `only jobs labelled ${text}` }, text) : h("span", { class: "chip" }, text);
    }),
  );
}

// ---- YAML ----------------------------------------------------------------------------------------

// A small YAML emitter for job specs (maps, lists, scalars); enough for "download spec" and
// for prefilling the YAML editor. Strings are quoted whenever plain style could be misread.
export function toYaml(value, indent = 0) {
  const pad = "  ".repeat(indent);
  if (Array.isArray(value)) {
    if (!value.length) return "[]";
    return value
      .map((item) => {
        const inner = toYaml(item, indent + 1);
        return isScalar(item) ? `${pad}- ${inner}` : `${pad}-\n${inner}`;
      })
      .join("\n");
  }
  if (value && typeof value === "object") {
    const entries = Object.entries(value).filter(([, v]) => v !== undefined);
    if (!entries.length) return "{}";
    return entries
      .map(([k, v]) => {
        const key = yamlScalar(k);
        if (isScalar(v) || (Array.isArray(v) && !v.length) || (isPlainObject(v) && !Object.keys(v).length)) {
          return `${pad}${key}: ${toYaml(v, indent + 1)}`;
        }
        return `${pad}${key}:\n${toYaml(v, indent + 1)}`;
      })
      .join("\n");
  }
  return yamlScalar(value);
}

function isPlainObject(v) {
  return v !== null && typeof v === "object" && !Array.isArray(v);
}

function isScalar(v) {
  return v === null || typeof v !== "object";
}

function yamlScalar(v) {
  if (v === null || v === undefined) return "null";
  if (typeof v === "number" || typeof v === "boolean") return String(v);
  const s = String(v);
  const plain = /^[A-Za-z_/.][A-Za-z0-9_ ./@+-]*$/.test(s) && !/^(true|false|yes|no|on|off|null|~)$/i.test(s);
  return plain && !s.endsWith(" ") && !s.includes(": ") && !s.includes(" #") ? s : JSON.stringify(s);
}

export function downloadText(filename, text, type = "application/yaml") {
  const url = URL.createObjectURL(new Blob([text], { type }));
  const a = h("a", { href: url, download: filename, hidden: true });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}
