// Alerts list (from monitoring's GET /alerts), firing first; refreshed by polling. `?show=all`
// lists resolved ones too.

import { get, itemsOf } from "../api.js";
import { navigate } from "../app.js";
import { fill, emptyState, errorBox, h, table, timeEl } from "../ui.js";

const pick = (obj, ...keys) => {
  for (const k of keys) {
    const v = k.split(".").reduce((o, p) => (o && o[p] !== undefined ? o[p] : undefined), obj);
    if (v !== undefined && v !== null && v !== "") return v;
  }
  return undefined;
};

export function alertState(alert) {
  return String(pick(alert, "state", "status") || "firing").toLowerCase();
}

export function isFiring(alert) {
  return alertState(alert) === "firing" || alertState(alert) === "active";
}

// What the alert is about: "node local · GPU 3 · job 42", from whichever labels it carries.
function subject(alert) {
  const labels = alert.labels || {};
  const parts = [];
  const node = labels.node || labels.instance;
  if (node) parts.push(`node ${node}`);
  if (labels.gpu !== undefined && labels.gpu !== "") parts.push(`GPU ${labels.gpu}`);
  if (labels.job_id) parts.push(h("a", { href: `/jobs/${labels.job_id}` }, `job ${labels.job_id}`));
  if (!parts.length) return "—";
  return parts.flatMap((p, i) => (i ? [" · ", p] : [p]));
}

export function alertRows(alerts) {
  return table(
    [
      {
        label: "Severity",
        cell: (a) => {
          const sev = String(pick(a, "severity", "labels.severity") || "info").toLowerCase();
          return h("span", { class: `badge sev-${sev}` }, sev);
        },
      },
      { label: "Alert", cell: (a) => String(pick(a, "name", "alertname", "labels.alertname") || "alert") },
      {
        label: "Summary",
        cell: (a) => String(pick(a, "summary", "message", "annotations.summary", "description", "annotations.description") || ""),
      },
      { label: "Subject", cell: subject },
      { label: "State", cell: (a) => h("span", { class: `badge alert-${alertState(a)}` }, alertState(a)) },
      { label: "Since", cell: (a) => timeEl(pick(a, "starts_at", "started_at", "startsAt", "created_at", "at")) },
    ],
    alerts,
    { class: "alerts" },
  );
}

export async function render(ctx) {
  // The choice lives in the address (/alerts?show=all), so reload, back and a shared link keep it.
  const shown = ctx.query.get("show") === "all" ? "all" : "firing";
  const filter = h(
    "select",
    { id: "alert-filter" },
    h("option", { value: "firing", selected: shown === "firing" }, "Firing"),
    h("option", { value: "all", selected: shown === "all" }, "All"),
  );
  const body = h("div", {});
  ctx.main.append(
    h("h1", {}, "Alerts"),
    h("div", { class: "toolbar" }, h("label", { for: "alert-filter" }, "Show"), filter),
    body,
  );
  const refresh = async () => {
    let alerts;
    try {
      alerts = itemsOf(await get("/alerts", { status: filter.value === "firing" ? "firing" : undefined, limit: 500 }), "alerts");
    } catch (err) {
      fill(body, errorBox(err, "Cannot load alerts"));
      return;
    }
    const shown = filter.value === "firing" ? alerts.filter(isFiring) : alerts;
    shown.sort((a, b) => Number(isFiring(b)) - Number(isFiring(a)));
    fill(body, 
      shown.length ? alertRows(shown) : emptyState(filter.value === "firing" ? "No alerts are firing." : "No alerts."),
    );
  };
  filter.addEventListener("change", () => navigate(filter.value === "all" ? "/alerts?show=all" : "/alerts"));
  await refresh();
  ctx.every(10000, refresh);
}
