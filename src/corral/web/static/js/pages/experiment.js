// The experiment view of the jobs list: while the list is filtered by labels (an AutoML search's
// trials, `experiment=e1`), every job carrying them with the final value of one chosen metric
// (each job's last reported value, from `GET /jobs/metrics?label=...`, one request for up to
// MAX_JOBS jobs), sortable by it. The metric and its order are in the address (`metric=loss`,
// `morder=desc`) like the list's other filters. Read when the page opens and every 15 s: each
// read opens every trial's metrics file on the server, so not at the list's 5 s.

import { get } from "../api.js";
import { navigate } from "../app.js";
import { emptyState, errorBox, fill, fmtNumber, h, labelChips, link, section, stateBadge } from "../ui.js";

const MAX_JOBS = 500; // the API's page of GET /jobs/metrics

// `view`: the jobs list's view (its label filter, metric, morder); `urlOf(view)` its address.
export function experimentPanel(ctx, view, urlOf) {
  const body = h("div", { id: "experiment" });
  const element = section(`Experiment: ${view.label.join(", ")}`, body);
  async function load() {
    let page;
    try {
      // the list's own filters too (an admin's `user=alice`): only the jobs the list shows
      const filters = { user: view.user || undefined, state: view.state || undefined };
      page = await get("/jobs/metrics", { label: view.label, tail: 1, limit: MAX_JOBS, ...filters });
    } catch (err) {
      if (ctx.alive()) fill(body, errorBox(err, "Cannot read the experiment's metrics"));
      return;
    }
    if (ctx.alive()) draw(body, view, page, urlOf);
  }
  return { element, load };
}

function draw(body, view, page, urlOf) {
  const items = page.items || [];
  const names = Array.from(new Set(items.flatMap((j) => Object.keys(j.latest || {})))).sort();
  if (!names.length) {
    fill(body, emptyState(`None of the ${items.length} jobs with these labels has reported metrics yet.`));
    return;
  }
  const metric = names.includes(view.metric) ? view.metric : names[0];
  const desc = view.morder === "desc";
  const valueOf = (j) => (j.latest || {})[metric];
  // Jobs without the metric last, whatever the order; ties by id.
  const rows = items.slice().sort((a, b) => {
    const va = valueOf(a);
    const vb = valueOf(b);
    if (va === undefined || vb === undefined) return (va === undefined) - (vb === undefined) || a.job_id - b.job_id;
    return (desc ? vb - va : va - vb) || a.job_id - b.job_id;
  });
  const select = h(
    "select",
    { id: "experiment-metric", "aria-label": "Metric" },
    names.map((n) => h("option", { value: n, selected: n === metric }, n)),
  );
  select.addEventListener("change", () => navigate(urlOf({ ...view, metric: select.value })));
  const filtered = new Set(view.label.map((l) => l.split("=")[0]));
  const otherLabels = (j) => Object.fromEntries(Object.entries(j.labels || {}).filter(([k]) => !filtered.has(k)));
  const arrow = desc ? " ▼" : " ▲";
  const header = h(
    "th",
    { scope: "col", "aria-sort": desc ? "descending" : "ascending" },
    h("a", { href: urlOf({ ...view, metric, morder: desc ? "" : "desc" }), class: "sort-link", id: "experiment-sort" }, `${metric} (final)`, h("span", { "aria-hidden": "true" }, arrow)),
  );
  const more = page.total > items.length ? h("p", { class: "muted" }, `The first ${items.length} of ${page.total} jobs.`) : null;
  fill(
    body,
    h("div", { class: "toolbar" }, h("label", { for: "experiment-metric" }, "Metric"), select),
    more,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { class: "data experiment" },
        h("thead", {}, h("tr", {}, h("th", { scope: "col" }, "ID"), h("th", { scope: "col" }, "State"), h("th", { scope: "col" }, "Other labels"), header)),
        h(
          "tbody",
          {},
          rows.map((j) => {
            const v = valueOf(j);
            return h(
              "tr",
              { "data-job-id": j.job_id },
              h("td", { "data-label": "ID" }, link(`/jobs/${j.job_id}`, `#${j.job_id}`)),
              h("td", { "data-label": "State" }, stateBadge(j.state)),
              h("td", { "data-label": "Other labels" }, labelChips(otherLabels(j))),
              h("td", { "data-label": metric, class: "metric-value" }, v === undefined ? "—" : fmtNumber(v)),
            );
          }),
        ),
      ),
    ),
  );
}
