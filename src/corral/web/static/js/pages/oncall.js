// On-call: who is on call now per schedule, the coming shifts with gap warnings, escalation
// policies, and pages (yours, or all for admins) with an Acknowledge button. Polls every 15 s.

import { get, post } from "../api.js";
import { emptyState, errorBox, fill, h, section, table, timeEl, toast } from "../ui.js";

function whoCell(user, source) {
  if (!user) return h("span", { class: "badge sev-warning" }, "nobody (gap)");
  return [h("strong", {}, user), " ", h("span", { class: "muted" }, `(${source})`)];
}

function nowTable(rows) {
  return table(
    [
      { label: "Schedule", cell: (r) => r.schedule },
      { label: "On call", cell: (r) => whoCell(r.user, r.source) },
      // null: the shift runs past the 14 days looked at (a one-member layer), not "unknown"
      { label: "Until", cell: (r) => (r.until === null ? "over 14 days" : timeEl(r.until)) },
      { label: "Next", cell: (r) => (r.next ? whoCell(r.next.user, r.next.source) : "—") },
    ],
    rows,
    { class: "oncall-now" },
  );
}

function scheduleCard(s) {
  const shifts = table(
    [
      { label: "From", cell: (x) => timeEl(x.start) },
      { label: "To", cell: (x) => timeEl(x.end) },
      { label: "On call", cell: (x) => whoCell(x.user, x.source) },
    ],
    s.shifts,
  );
  const warnings = s.warnings.map((w) => h("p", { role: "note" }, h("span", { class: "badge sev-warning" }, "warning"), " ", w));
  return section(`${s.name} (${s.time_zone})`, ...warnings, shifts);
}

function policyTable(policies) {
  const steps = (p) => p.steps.map((s) => `${s.schedule ? "on call of " + s.schedule : s.user} (+${s.wait_minutes} min)`).join(" → ");
  return table(
    [
      { label: "Policy", cell: (p) => p.name },
      { label: "Steps", cell: steps },
      { label: "Repeat", cell: (p) => String(p.repeat) },
    ],
    policies,
  );
}

// The existing badge colours: red while someone must answer, green once acknowledged.
const PAGE_BADGE = { triggered: "sev-critical", exhausted: "sev-critical", acknowledged: "state-succeeded", cancelled: "state-cancelled" };

function pageTable(pages, refresh) {
  const ackButton = (p) => {
    if (p.state !== "triggered" && p.state !== "exhausted") return p.acked_by ? `by ${p.acked_by}` : "—";
    const button = h("button", { type: "button", class: "button small" }, "Acknowledge");
    button.addEventListener("click", async () => {
      try {
        await post(`/oncall/pages/${p.id}/ack`);
        toast(`Page ${p.id} acknowledged`, "success");
        await refresh();
      } catch (err) {
        toast(String(err.message || err), "error");
      }
    });
    return button;
  };
  return table(
    [
      { label: "Page", cell: (p) => `#${p.id}` },
      { label: "Subject", cell: (p) => p.subject },
      { label: "State", cell: (p) => h("span", { class: `badge ${PAGE_BADGE[p.state] || ""}` }, p.state) },
      { label: "Policy", cell: (p) => `${p.policy} (round ${p.round}, next step ${p.next_step})` },
      { label: "Started", cell: (p) => timeEl(p.created_at) },
      { label: "Acknowledge", cell: ackButton },
    ],
    pages,
    { class: "pages" },
  );
}

export async function render(ctx) {
  const body = h("div", {});
  ctx.main.append(h("h1", {}, "On-call"), body);
  const refresh = async () => {
    let now, schedules, policies, pages;
    try {
      [now, schedules, policies, pages] = await Promise.all([
        get("/oncall/now"),
        get("/oncall/schedules"),
        get("/oncall/policies"),
        get("/oncall/pages", { limit: 50 }),
      ]);
    } catch (err) {
      fill(body, errorBox(err, "Cannot load on-call"));
      return;
    }
    fill(
      body,
      section("On call now", now.length ? nowTable(now) : emptyState("No schedules yet: `corral oncall schedule set`.")),
      section("Pages", pages.length ? pageTable(pages, refresh) : emptyState("No pages.")),
      ...schedules.map(scheduleCard),
      section("Escalation policies", policies.length ? policyTable(policies) : emptyState("No policies yet.")),
    );
  };
  await refresh();
  ctx.every(15000, refresh);
}
