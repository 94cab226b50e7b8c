// Jobs list: filters (state, user, group, labels), sorting and pagination, all server-side through
// the API's query parameters (limit/offset), so the page stays fast with 100,000 jobs. The address
// bar holds the view (`/jobs?state=running&label=experiment=e1&offset=50`) so it can be bookmarked
// and shared. Labels: `name=value` (or a bare name: any value), several ANDed, as `corral ls -l`;
// a label chip in the LABELS column adds that label to the filter. Filtered by labels, the page
// also shows the experiment view (pages/experiment.js): each job's final value of a metric.

import { get, itemsOf } from "../api.js";
import { navigate } from "../app.js";
import { experimentPanel } from "./experiment.js";
import { ALL_STATES, fill, emptyState, errorBox, h, jobGpus, labelChips, link, stateBadge, timeEl } from "../ui.js";

const PAGE_SIZES = [25, 50, 100];
// The columns; `view` is the page's filters (the label chips link to the view with one more label).
const COLUMNS = [
  { key: "id", label: "ID", sortable: true, cell: (j) => link(`/jobs/${j.id}`, `#${j.id}`) },
  { key: "name", label: "Name", sortable: true, class: "name", cell: (j) => link(`/jobs/${j.id}`, j.name || "(unnamed)") },
  { key: "state", label: "State", sortable: true, cell: (j) => (j.hold ? [stateBadge(j.state), " ", h("span", { class: "badge held" }, "held")] : stateBadge(j.state)) },
  { key: "user", label: "User", sortable: false, cell: (j) => j.user || "—" },
  { key: "group", label: "Group", sortable: false, cell: (j) => j.group || "—" },
  { key: "priority", label: "Priority", sortable: false, cell: (j) => priorityName(j.priority) },
  { key: "gpus", label: "GPUs", sortable: false, cell: (j) => String(jobGpus(j) ?? "—") },
  { key: "labels", label: "Labels", sortable: false, class: "job-labels", cell: (j, view) => labelChips(j.labels, (text) => withLabel(view, text)) },
  // Ids are handed out at submission, so "newest first" is the ID order (indexed, fast at any size).
  { key: "created_at", label: "Submitted", sortable: false, cell: (j) => timeEl(j.created_at ?? j.submitted_at) },
];

function priorityName(p) {
  return { 0: "low", 1: "normal", 2: "high" }[p] ?? String(p ?? "—");
}

function readView(query) {
  const size = Number(query.get("limit")) || 25;
  return {
    state: query.get("state") || "",
    user: query.get("user") || "",
    group: query.get("group") || "",
    label: query.getAll("label").filter(Boolean),
    metric: query.get("metric") || "", // the experiment view's metric, and its order ("desc")
    morder: query.get("morder") === "desc" ? "desc" : "",
    // Newest first by id: ids grow with submission, and the primary key needs no sort step, so
    // the default page stays fast however many jobs there are.
    sort: query.get("sort") || "id",
    order: query.get("order") === "asc" ? "asc" : "desc",
    limit: PAGE_SIZES.includes(size) ? size : 25,
    offset: Math.max(0, Number(query.get("offset")) || 0),
  };
}

function viewUrl(view) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(view)) {
    if (Array.isArray(v)) {
      for (const item of v) q.append(k, item);
      continue;
    }
    const isDefault = (k === "sort" && v === "id") || (k === "order" && v === "desc") || (k === "limit" && v === 25);
    if (v !== "" && v !== 0 && !isDefault) q.set(k, String(v));
  }
  const s = q.toString();
  return s ? `/jobs?${s}` : "/jobs";
}

export async function render(ctx) {
  const view = readView(ctx.query);
  const results = h("div", { id: "jobs-results" });
  const experiment = view.label.length ? experimentPanel(ctx, view, viewUrl) : null;
  const parts = [h("div", { class: "page-head" }, h("h1", {}, "Jobs"), link("/submit", "Submit a job")), filterForm(view)];
  ctx.main.append(...parts, ...(experiment ? [experiment.element] : []), results);
  if (experiment) {
    experiment.load();
    ctx.every(15000, experiment.load);
  }
  const { metric, morder, ...listed } = view; // the experiment view's, not the list's
  const refresh = async () => {
    try {
      const payload = await get("/jobs", listed);
      if (ctx.alive()) drawResults(results, view, payload);
    } catch (err) {
      if (ctx.alive()) fill(results, errorBox(err, "Cannot load jobs"));
    }
  };
  await refresh();
  ctx.every(5000, refresh);
}

// The view's address with one more label filter (none twice), from its first page.
function withLabel(view, text) {
  return viewUrl({ ...view, label: view.label.includes(text) ? view.label : [...view.label, text], offset: 0 });
}

// "experiment=e1, trial" -> ["experiment=e1", "trial"]: split on commas and spaces (no label name
// or value holds either); the API names any that is no label.
function labelsOf(text) {
  return text.split(/[\s,]+/).filter(Boolean);
}

function filterForm(view) {
  const state = h(
    "select",
    { id: "filter-state", name: "state" },
    h("option", { value: "" }, "any state"),
    ALL_STATES.map((s) => h("option", { value: s, selected: s === view.state }, s)),
  );
  const user = h("input", { id: "filter-user", name: "user", value: view.user, placeholder: "any user" });
  const group = h("input", { id: "filter-group", name: "group", value: view.group, placeholder: "any group" });
  const labels = h("input", {
    id: "filter-label",
    name: "label",
    value: view.label.join(" "),
    placeholder: "name=value …",
    title: "jobs carrying every one of these labels: name=value, or a name for any value",
  });
  const form = h(
    "form",
    { class: "filters", role: "search", "aria-label": "Filter jobs" },
    h("div", { class: "field" }, h("label", { for: "filter-state" }, "State"), state),
    h("div", { class: "field" }, h("label", { for: "filter-user" }, "User"), user),
    h("div", { class: "field" }, h("label", { for: "filter-group" }, "Group"), group),
    h("div", { class: "field" }, h("label", { for: "filter-label" }, "Labels"), labels),
    h("button", { type: "submit", class: "button" }, "Filter"),
    h("a", { href: "/jobs", class: "button subtle" }, "Clear"),
  );
  const apply = (event) => {
    if (event) event.preventDefault();
    const chosen = { state: state.value, user: user.value.trim(), group: group.value.trim(), label: labelsOf(labels.value) };
    navigate(viewUrl({ ...view, ...chosen, offset: 0 }));
  };
  form.addEventListener("submit", apply);
  state.addEventListener("change", () => apply());
  return form;
}

function sortHeader(view, col) {
  if (!col.sortable) return h("th", { scope: "col" }, col.label);
  const active = view.sort === col.key;
  const nextOrder = active && view.order === "desc" ? "asc" : "desc";
  const arrow = active ? (view.order === "asc" ? " ▲" : " ▼") : "";
  return h(
    "th",
    { scope: "col", "aria-sort": active ? (view.order === "asc" ? "ascending" : "descending") : "none" },
    h(
      "a",
      { href: viewUrl({ ...view, sort: col.key, order: nextOrder, offset: 0 }), class: "sort-link" },
      col.label,
      h("span", { "aria-hidden": "true" }, arrow),
    ),
  );
}

function drawResults(root, view, payload) {
  const jobs = itemsOf(payload);
  const total = Number((payload && payload.total) ?? jobs.length);
  const first = total ? view.offset + 1 : 0;
  const last = view.offset + jobs.length;
  const pager = h(
    "nav",
    { class: "pager", "aria-label": "Pages" },
    h("span", { id: "jobs-range" }, `${first}–${last} of ${total}`),
    view.offset > 0
      ? h("a", { href: viewUrl({ ...view, offset: Math.max(0, view.offset - view.limit) }), class: "button", rel: "prev" }, "← Previous")
      : null,
    last < total
      ? h("a", { href: viewUrl({ ...view, offset: view.offset + view.limit }), class: "button", rel: "next" }, "Next →")
      : null,
    pageSizeSelect(view),
  );
  if (!jobs.length) {
    fill(root, emptyState(total ? "No jobs on this page." : "No jobs match these filters."), pager);
    return;
  }
  const tableEl = h(
    "table",
    { class: "data jobs" },
    h("thead", {}, h("tr", {}, COLUMNS.map((c) => sortHeader(view, c)))),
    h(
      "tbody",
      {},
      jobs.map((j) =>
        h("tr", { "data-job-id": j.id }, COLUMNS.map((c) => h("td", { class: c.class, "data-label": c.label }, c.cell(j, view)))),
      ),
    ),
  );
  fill(root, h("div", { class: "table-wrap" }, tableEl), pager);
}

function pageSizeSelect(view) {
  const select = h(
    "select",
    { id: "page-size", "aria-label": "Jobs per page" },
    PAGE_SIZES.map((n) => h("option", { value: n, selected: n === view.limit }, `${n} per page`)),
  );
  select.addEventListener("change", () => navigate(viewUrl({ ...view, limit: Number(select.value), offset: 0 })));
  return select;
}
