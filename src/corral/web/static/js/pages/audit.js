// The admin audit log (GET /audit, admins only): who changed what, when and from where, newest
// first, with the same filters as `corral audit ls` and pages of PAGE records.

import { get } from "../api.js";
import { emptyState, errorBox, fill, fmtTime, h, table } from "../ui.js";

const PAGE = 50;
const FILTERS = [
  ["actor", "Actor", "user name or system:retention"],
  ["action", "Action", "e.g. group or token.create"],
  ["target", "Target", "e.g. node or group:vision"],
  ["since", "Since", "e.g. 7d, 12h or 2026-11-25"],
];

// "key: before → after" for each key that changed; the whole state where only one side exists.
export function changeText(record) {
  const { before, after } = record;
  const show = (v) => (typeof v === "string" ? v : JSON.stringify(v));
  let text = "";
  if (before && after && typeof before === "object" && typeof after === "object") {
    const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])];
    text = keys
      .filter((k) => JSON.stringify(before[k]) !== JSON.stringify(after[k]))
      .map((k) => `${k}: ${show(before[k])} → ${show(after[k])}`)
      .join(", ");
  } else if (after !== null && after !== undefined) {
    text = show(after);
  } else if (before !== null && before !== undefined) {
    text = `was ${show(before)}`;
  }
  if (record.detail) text = text ? `${text} (${record.detail})` : record.detail;
  return text;
}

export async function render(ctx) {
  const inputs = Object.fromEntries(
    FILTERS.map(([name, , placeholder]) => [
      name,
      h("input", { id: `audit-${name}`, name, placeholder, value: ctx.query.get(name) || "" }),
    ]),
  );
  const form = h(
    "form",
    { id: "audit-filters", class: "toolbar" },
    FILTERS.map(([name, label]) => [h("label", { for: `audit-${name}` }, label), inputs[name]]),
    h("button", { type: "submit" }, "Filter"),
  );
  const body = h("div", { id: "audit-body" });
  const pager = h("div", { class: "toolbar pager" });
  ctx.main.append(h("h1", {}, "Audit log"), form, body, pager);
  let offset = 0;

  // The first load lets a 403 through, so a non-admin gets the portal's 403 page; later loads
  // (a bad filter, say) show the error above the table instead.
  const load = async (first = false) => {
    const query = { limit: PAGE, offset };
    for (const [name] of FILTERS) if (inputs[name].value.trim()) query[name] = inputs[name].value.trim();
    let page;
    try {
      page = await get("/audit", query);
    } catch (err) {
      if (first) throw err;
      fill(body, errorBox(err, "Cannot load the audit log"));
      fill(pager);
      return;
    }
    if (!ctx.alive()) return;
    fill(
      body,
      page.items.length
        ? table(
            [
              // The columns' widths and wrapping are style.css's (table.audit): it fits an 800 px
              // window, From (the least telling column) giving way under 900 px.
              { label: "When", cell: (r) => h("time", { datetime: new Date(r.at * 1000).toISOString() }, fmtTime(r.at)), class: "audit-when" },
              { label: "Actor", cell: (r) => r.actor, class: "audit-actor" },
              { label: "From", cell: (r) => r.source || "—", class: "audit-from" },
              { label: "Action", cell: (r) => h("code", {}, r.action), class: "audit-action" },
              { label: "Target", cell: (r) => `${r.target_kind}:${r.target_id}`, class: "audit-target" },
              { label: "Change", cell: changeText, class: "audit-change" },
            ],
            page.items,
            { class: "audit" },
          )
        : emptyState("No audit records match."),
    );
    const last = Math.min(offset + page.items.length, page.total);
    fill(
      pager,
      h("span", { class: "muted" }, page.total ? `${offset + 1}–${last} of ${page.total}` : ""),
      h("button", { type: "button", disabled: offset === 0, onclick: () => { offset = Math.max(0, offset - PAGE); load(); } }, "Newer"),
      h("button", { type: "button", disabled: last >= page.total, onclick: () => { offset += PAGE; load(); } }, "Older"),
    );
  };
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    offset = 0;
    load();
  });
  await load(true);
}
