// Incidents (admins): the list with filters (state, severity, open only) and SLA countdowns, and one
// incident's detail with its links, timeline, postmortem, the ack/mitigate/resolve/close buttons
// its state allows and a note or comment; there admins correct the severity, set the owner and
// write or edit the postmortem, as the SDK's `edit_incident` and `corral incident postmortem` do.

import { ApiError, api, get, itemsOf, post } from "../api.js";
import { navigate } from "../app.js";
import { emptyState, errorBox, field, fill, fmtDuration, h, section, table, timeEl, toast } from "../ui.js";

const STATES = ["triggered", "acknowledged", "mitigated", "resolved", "closed"];
const SEVERITIES = ["SEV1", "SEV2", "SEV3", "SEV4"];

// "12m" left, or "overdue 3m" (red); once acknowledged / mitigated, "met" or, if that came too
// late, "missed" (red).
function countdown(seconds, breached) {
  if (seconds === null || seconds === undefined) {
    return breached ? h("span", { class: "sla-breached badge sev-critical" }, "missed") : h("span", { class: "sla-met" }, "met");
  }
  if (seconds < 0) return h("span", { class: "sla-breached badge sev-critical" }, `overdue ${fmtDuration(-seconds)}`);
  return h("span", { class: "sla-running" }, fmtDuration(seconds));
}

// An incident that reopens too often is flapping: paged once, its further reopens page nobody
// until it is quiet (services/incident_flapping.py FlapPolicy). Null when it is not flapping.
function flappingBadge(incident) {
  if (!incident.flapping) return null;
  return h("span", { class: "badge incident-flapping", title: "reopens page nobody until it is quiet" }, "flapping");
}

function select(id, label, values, current) {
  return h(
    "select",
    { id },
    h("option", { value: "" }, label),
    ...values.map((v) => h("option", { value: v, selected: v === current }, v)),
  );
}

// The filters live in the address (/incidents?state=resolved&severity=SEV2), so reload, back and
// a shared link keep them.
async function renderList(ctx) {
  const state = select("incident-state", "Open", STATES, ctx.query.get("state"));
  const severity = select("incident-severity", "Any severity", SEVERITIES, ctx.query.get("severity"));
  state.setAttribute("aria-label", "State");
  severity.setAttribute("aria-label", "Severity");
  const body = h("div", {});
  ctx.main.append(h("h1", {}, "Incidents"), h("div", { class: "toolbar" }, state, severity), body);
  const load = () =>
    get("/incidents", {
      state: state.value || undefined,
      severity: severity.value || undefined,
      open: state.value ? undefined : true,
      limit: 500,
    });
  // The first load may throw: a member gets the portal's 403 page, like the audit log's.
  let first = await load();
  const refresh = async () => {
    let page = first;
    first = null;
    if (!page) {
      try {
        page = await load();
      } catch (err) {
        fill(body, errorBox(err, "Cannot load incidents"));
        return;
      }
    }
    const rows = page.items || [];
    fill(
      body,
      rows.length
        ? table(
            [
              { label: "ID", cell: (i) => h("a", { href: `/incidents/${i.id}` }, `#${i.id}`) },
              { label: "Severity", cell: (i) => h("span", { class: `badge sev-${i.severity.toLowerCase()}` }, i.severity) },
              { label: "State", cell: (i) => [h("span", { class: `badge incident-${i.state}` }, i.state), flappingBadge(i)] },
              { label: "Title", cell: (i) => i.title },
              { label: "Opened", cell: (i) => timeEl(i.opened_at) },
              { label: "Ack in", cell: (i) => countdown(i.sla.ack_remaining_s, i.sla.ack_breached) },
              { label: "Mitigate in", cell: (i) => countdown(i.sla.mitigate_remaining_s, i.sla.mitigate_breached) },
              { label: "Owner", cell: (i) => i.owner || "—" },
            ],
            rows,
            { class: "incidents" },
          )
        : emptyState(state.value ? `No ${state.value} incidents.` : "No open incidents."),
    );
  };
  const filtered = () => {
    const q = new URLSearchParams();
    if (state.value) q.set("state", state.value);
    if (severity.value) q.set("severity", severity.value);
    const query = q.toString();
    navigate(query ? `/incidents?${query}` : "/incidents");
  };
  state.addEventListener("change", filtered);
  severity.addEventListener("change", filtered);
  await refresh();
  ctx.every(10000, refresh);
}

function links(incident) {
  const out = [];
  for (const node of incident.links.nodes || []) out.push(h("a", { href: "/nodes" }, `node ${node}`));
  for (const gpu of incident.links.gpus || []) out.push(`GPU ${gpu}`);
  for (const job of incident.links.jobs || []) out.push(h("a", { href: `/jobs/${job}` }, `job ${job}`));
  for (const group of incident.links.groups || []) out.push(`group ${group}`);
  return out.length ? out.flatMap((p, i) => (i ? [" · ", p] : [p])) : "—";
}

function postmortem(incident) {
  const pm = incident.postmortem;
  if (!pm) {
    return section("Postmortem", emptyState(incident.postmortem_required ? "Required before closing (corral incident postmortem)." : "None."));
  }
  return section(
    "Postmortem",
    h("p", {}, h("strong", {}, "Summary: "), pm.summary),
    h("p", {}, h("strong", {}, "Impact: "), pm.impact),
    h("p", {}, h("strong", {}, "Root cause: "), pm.root_cause),
    table(
      [
        { label: "Action item", cell: (a) => a.what },
        { label: "Owner", cell: (a) => a.owner },
        { label: "Due", cell: (a) => a.due },
      ],
      pm.action_items,
    ),
  );
}

// What the API lets each state become (services/incidents.py TRANSITIONS); ack only until someone
// has acknowledged it. A button for a move the API refuses (close while triggered) is not shown.
function actionsFor(incident) {
  const open = ["triggered", "acknowledged", "mitigated"].includes(incident.state);
  return {
    ack: incident.state !== "closed" && !incident.acknowledged_at,
    mitigate: incident.state === "triggered" || incident.state === "acknowledged",
    resolve: open,
    close: incident.state === "resolved",
  };
}

// The note box and the buttons are drawn once: the 5 s refresh redraws only what is below them,
// so a note being typed is not wiped. Mitigate and resolve send the note (the timeline shows it
// instead of "resolved by ..."); "Add comment" needs one.
function actionsBar(id, refresh) {
  const note = h("textarea", { id: "incident-note", rows: 2, "aria-describedby": "incident-note-error" });
  const error = h("p", { class: "field-error", id: "incident-note-error", role: "alert", hidden: true });
  const run = async (button, action, body) => {
    error.hidden = true;
    note.setAttribute("aria-invalid", "false");
    button.disabled = true;
    try {
      await post(`/incidents/${id}/${action}`, body);
      toast(`incident ${id}: ${action} done`, "success");
      if (body.note || body.text) note.value = ""; // sent: it is in the timeline now
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
    await refresh();
  };
  const buttons = {};
  for (const action of ["ack", "mitigate", "resolve", "close"]) {
    const button = h("button", { type: "button", class: "button", "data-action": action }, action);
    button.addEventListener("click", () => {
      const text = note.value.trim();
      run(button, action, action === "mitigate" || action === "resolve" ? { note: text } : {});
    });
    buttons[action] = button;
  }
  const comment = h("button", { type: "button", class: "button subtle", "data-action": "comment" }, "Add comment");
  comment.addEventListener("click", () => {
    if (!note.value.trim()) {
      error.textContent = "Write the comment first.";
      error.hidden = false;
      note.setAttribute("aria-invalid", "true");
      note.focus();
      return;
    }
    run(comment, "comment", { text: note.value.trim() });
  });
  const toolbar = h("div", { class: "toolbar" });
  const bar = h(
    "div",
    { class: "incident-actions" },
    h("div", { class: "field" }, h("label", { for: note.id }, "Note (with mitigate or resolve) or comment"), note, error),
    toolbar,
  );
  bar.update = (incident) => {
    const allowed = actionsFor(incident);
    fill(toolbar, Object.entries(buttons).filter(([action]) => allowed[action]).map(([, button]) => button), comment);
  };
  return bar;
}

async function renderDetail(ctx, id) {
  const head = h("div", {});
  const body = h("div", {});
  // The first read may throw: a missing incident gets the portal's 404 page.
  let incident = await get(`/incidents/${id}`);
  const refresh = async () => {
    try {
      incident = await get(`/incidents/${id}`);
    } catch (err) {
      if (ctx.alive()) fill(body, errorBox(err, `Cannot load incident ${id}`));
      return;
    }
    if (ctx.alive()) draw();
  };
  const bar = actionsBar(id, refresh);
  const known = h("datalist", { id: "incident-users" });
  get("/users")
    .then((users) => fill(known, ...itemsOf(users, "users").filter((u) => u.active).map((u) => h("option", { value: u.name }))))
    .catch(() => {}); // only suggestions: the API checks the owner in any case
  // Drawn once, from the first read, like the note box: the 5 s redraws do not wipe an edit.
  ctx.main.append(
    head,
    bar,
    known,
    section("Severity and owner", editForm(incident, refresh)),
    body,
    section(incident.postmortem ? "Edit the postmortem" : "Write the postmortem", postmortemForm(incident, refresh)),
  );
  const draw = () => {
    const sla = incident.sla;
    bar.update(incident);
    fill(
      head,
      h("h1", {}, `Incident #${incident.id} `, h("span", { class: `badge sev-${incident.severity.toLowerCase()}` }, incident.severity), " ",
        h("span", { class: `badge incident-${incident.state}` }, incident.state), " ", flappingBadge(incident)),
      h("p", { class: "incident-title" }, incident.title),
    );
    fill(
      body,
      section(
        "Summary",
        h("dl", { class: "facts" },
          h("dt", {}, "Source"), h("dd", {}, incident.source),
          h("dt", {}, "Owner"), h("dd", {}, incident.owner || "—"),
          h("dt", {}, "Affects"), h("dd", {}, links(incident)),
          h("dt", {}, "Opened"), h("dd", {}, timeEl(incident.opened_at)),
          h("dt", {}, "Fired"), h("dd", {}, `${incident.fire_count} time${incident.fire_count === 1 ? "" : "s"}`),
          ...(incident.flapping
            ? [h("dt", {}, "Flapping"), h("dd", {}, "began ", timeEl(incident.flapping_since), ": its reopens page nobody until it is quiet")]
            : []),
          h("dt", {}, "Ack in"), h("dd", {}, countdown(sla.ack_remaining_s, sla.ack_breached)),
          h("dt", {}, "Mitigate in"), h("dd", {}, countdown(sla.mitigate_remaining_s, sla.mitigate_breached))),
      ),
      section(
        "Timeline",
        table(
          [
            { label: "When", cell: (e) => timeEl(e.at) },
            { label: "What", cell: (e) => e.kind },
            { label: "", cell: (e) => e.text },
            { label: "Who", cell: (e) => e.actor || "" },
          ],
          incident.timeline,
          { class: "incident-timeline" },
        ),
      ),
      postmortem(incident),
    );
  };
  draw();
  ctx.every(5000, refresh);
}

// A refusal next to the field its 422 `loc` names (action_items.2.owner: the action items), else
// on the form's own line.
function showRefusal(err, fields, formError) {
  const placed = err instanceof ApiError ? err.fieldErrors.filter((e) => fields[e.loc[0]]) : [];
  for (const e of placed) fields[e.loc[0]].show(e.loc.length > 1 ? `${e.loc.slice(1).join(".")}: ${e.msg}` : e.msg);
  if (placed.length) return;
  formError.textContent = err.message;
  formError.hidden = false;
}

function submitButton(label) {
  return h("button", { type: "submit", class: "button primary" }, label);
}

// PATCH /incidents/{id} (the SDK's edit_incident; no CLI command): an empty owner clears it. Only
// what was changed is sent: the API records each field it is given as a change (an empty owner
// sent for an incident without one would read "owner (none) set" in the timeline).
function editForm(incident, refresh) {
  const saved = { severity: incident.severity, owner: incident.owner || "" };
  const severity = field(
    "Severity",
    h("select", { id: "incident-edit-severity" }, SEVERITIES.map((v) => h("option", { value: v, selected: v === incident.severity }, v))),
  );
  const owner = field(
    "Owner (a user's name; empty: none)",
    h("input", { id: "incident-edit-owner", value: incident.owner || "", autocomplete: "off", list: "incident-users" }),
  );
  const formError = h("p", { class: "field-error", id: "incident-edit-error", role: "alert", hidden: true });
  const form = h("form", { id: "incident-edit", class: "inline-form", novalidate: true }, severity.wrap, owner.wrap, formError, submitButton("Save"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    severity.clear();
    owner.clear();
    formError.hidden = true;
    const changes = {};
    if (severity.input.value !== saved.severity) changes.severity = severity.input.value;
    if (owner.input.value.trim() !== saved.owner) changes.owner = owner.input.value.trim();
    if (!Object.keys(changes).length) {
      formError.textContent = "Nothing to save: the severity and the owner are as they were.";
      formError.hidden = false;
      return;
    }
    try {
      await api("PATCH", `/incidents/${incident.id}`, { json: changes });
    } catch (err) {
      showRefusal(err, { severity, owner }, formError);
      return;
    }
    Object.assign(saved, changes);
    toast(`incident ${incident.id}: ${Object.keys(changes).join(" and ")} saved`, "success");
    await refresh();
  });
  return form;
}

// "WHAT;OWNER;YYYY-MM-DD" per line, as `corral incident postmortem --action` takes them.
function actionItemsText(items) {
  return (items || []).map((a) => `${a.what};${a.owner};${a.due}`).join("\n");
}

function parseActionItems(text) {
  const items = [];
  const lines = text.split("\n").map((l) => l.trim());
  for (const [i, line] of lines.entries()) {
    if (!line) continue;
    const parts = line.split(";").map((p) => p.trim());
    if (parts.length !== 3 || parts.some((p) => !p)) throw new Error(`line ${i + 1}: expected WHAT;OWNER;YYYY-MM-DD`);
    if (!/^\d{4}-\d{2}-\d{2}$/.test(parts[2])) throw new Error(`line ${i + 1}: the due date must be YYYY-MM-DD`);
    items.push({ what: parts[0], owner: parts[1], due: parts[2] });
  }
  return items;
}

// PUT /incidents/{id}/postmortem (corral incident postmortem): written, or replaced when edited.
function postmortemForm(incident, refresh) {
  const pm = incident.postmortem || {};
  const area = (id, value) => h("textarea", { id, rows: 3 }, value || "");
  const fields = {
    summary: field("Summary", area("postmortem-summary", pm.summary)),
    impact: field("Impact", area("postmortem-impact", pm.impact)),
    root_cause: field("Root cause", area("postmortem-root-cause", pm.root_cause)),
    action_items: field("Action items, one per line: WHAT;OWNER;YYYY-MM-DD", area("postmortem-actions", actionItemsText(pm.action_items))),
  };
  const formError = h("p", { class: "field-error", id: "postmortem-error", role: "alert", hidden: true });
  const form = h("form", { id: "postmortem-form", novalidate: true }, Object.values(fields).map((f) => f.wrap), formError, submitButton("Save postmortem"));
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    for (const f of Object.values(fields)) f.clear();
    formError.hidden = true;
    const body = {};
    for (const key of ["summary", "impact", "root_cause"]) {
      body[key] = fields[key].input.value.trim();
      if (!body[key]) return fields[key].show("Required.");
    }
    try {
      body.action_items = parseActionItems(fields.action_items.input.value);
    } catch (err) {
      return fields.action_items.show(err.message);
    }
    try {
      await api("PUT", `/incidents/${incident.id}/postmortem`, { json: body });
    } catch (err) {
      showRefusal(err, fields, formError);
      return;
    }
    toast(`incident ${incident.id}: postmortem saved`, "success");
    await refresh();
  });
  return form;
}

export async function render(ctx) {
  const id = ctx.params && ctx.params[0];
  if (id) await renderDetail(ctx, id);
  else await renderList(ctx);
}
