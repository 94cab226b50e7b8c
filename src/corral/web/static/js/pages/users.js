// Users (admins): the list with each user's role, groups and whether they may log in; create a
// user, deactivate or activate one and set a password, as `corral user ls|create|deactivate|
// activate|passwd` do (GET/POST /users, POST /users/{name}/deactivate|activate, PUT
// /users/{name}/password). A refusal shows next to the field or the user it is about. Adding a
// user to a group and the default group are on the Groups page.

import { ApiError, api, get, itemsOf, post, put } from "../api.js";
import { isAdmin } from "../app.js";
import { emptyState, errorBox, field, fill, h, section, table, timeEl, toast } from "../ui.js";

// The API's rules (api/schemas.py ACCOUNT_NAME, PASSWORD_MIN), said in words: its 422 quotes the regex.
const USER_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;
const NAME_RULE = "Use lowercase letters, digits, '.', '_' or '-', starting with a letter or digit (64 at most).";
const PASSWORD_MIN = 8;

export async function render(ctx) {
  if (!isAdmin()) throw new ApiError(403, "only an administrator may manage users", "/users");
  const list = h("div", { id: "users-list" });
  const known = h("datalist", { id: "user-names" });
  const refresh = async () => {
    let users;
    try {
      users = itemsOf(await get("/users"), "users");
    } catch (err) {
      if (ctx.alive()) fill(list, errorBox(err, "Cannot load users"));
      return;
    }
    if (!ctx.alive()) return;
    fill(known, ...users.map((u) => h("option", { value: u.name })));
    drawUsers(list, users, refresh);
  };
  const groups = await get("/groups").then((payload) => itemsOf(payload, "groups")).catch(() => []);
  ctx.main.append(
    h("h1", {}, "Users"),
    h("p", { class: "muted" }, "Group memberships and default groups are set on the Groups page."),
    known,
    section("All users", list),
    h("div", { class: "grid-2" }, section("Create a user", createForm(groups, refresh)), section("Set a password", passwordForm())),
  );
  await refresh();
}

function drawUsers(root, users, refresh) {
  if (!users.length) {
    fill(root, emptyState("No users."));
    return;
  }
  fill(
    root,
    table(
      [
        { label: "Name", cell: (u) => u.name },
        { label: "Role", cell: (u) => (u.is_admin ? h("span", { class: "badge role-admin" }, "admin") : u.role || "user") },
        { label: "State", cell: (u) => h("span", { class: `badge user-${u.active ? "active" : "inactive"}` }, u.active ? "active" : "deactivated") },
        { label: "Groups", cell: (u) => (u.groups || []).map((g) => `${g.name}${g.role === "admin" ? " (admin)" : ""}`).join(", ") || "—" },
        { label: "Default group", cell: (u) => u.default_group || "—" },
        { label: "Created", cell: (u) => timeEl(u.created_at) },
        { label: "", header: h("span", { class: "sr-only" }, "Actions"), cell: (u) => activeToggle(u, refresh) },
      ],
      users,
      { class: "users" },
    ),
  );
}

// Deactivate (after a confirmation) or activate; the API's refusal (oneself, the last active
// administrator) shows under the button. Live jobs refuse a deactivation (409 naming them and the
// way out, cancel_jobs=true): the admin is asked whether to cancel them, as `--cancel-jobs` does.
function activeToggle(user, refresh) {
  const deactivate = user.active;
  const error = h("p", { class: "field-error", role: "alert", hidden: true });
  const button = h(
    "button",
    {
      type: "button",
      class: `button small ${deactivate ? "danger" : ""}`,
      "aria-label": `${deactivate ? "Deactivate" : "Activate"} ${user.name}`,
    },
    deactivate ? "Deactivate" : "Activate",
  );
  const path = `/users/${encodeURIComponent(user.name)}/${deactivate ? "deactivate" : "activate"}`;
  button.addEventListener("click", async () => {
    if (deactivate && !window.confirm(`Deactivate ${user.name}? Their logins, tokens and SSH keys stop working at once.`)) return;
    button.disabled = true;
    error.hidden = true;
    try {
      try {
        await post(path);
      } catch (err) {
        const liveJobs = deactivate && err instanceof ApiError && err.status === 409 && err.message.includes("cancel_jobs");
        if (!liveJobs) throw err;
        if (!window.confirm(`${err.message}\n\nCancel those jobs and deactivate ${user.name}?`)) return;
        await api("POST", path, { json: {}, query: { cancel_jobs: true } });
      }
      toast(`${user.name} ${deactivate ? "deactivated" : "activated"}.`, "success");
      await refresh();
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    } finally {
      button.disabled = false;
    }
  });
  return h("div", { class: "user-actions", "data-user": user.name }, button, error);
}

// A refusal goes next to the field it is about: a 422's `loc`, a duplicate name's 409 or an
// unknown user's 404 to the named field; anything else to the form's own line.
function showRefusal(err, fields, fallback, formError) {
  if (err instanceof ApiError && err.fieldErrors.length) {
    let placed = false;
    for (const e of err.fieldErrors) {
      const target = fields[e.loc[0]];
      if (target) {
        target.show(e.loc[0] === "name" && /pattern/.test(e.msg) ? NAME_RULE : e.msg);
        placed = true;
      }
    }
    if (placed) return;
  }
  if (fallback && err instanceof ApiError && (err.status === 409 || err.status === 404)) {
    fallback.show(err.message);
    return;
  }
  formError.textContent = err.message;
  formError.hidden = false;
}

function createForm(groups, refresh) {
  const name = field("Name", h("input", { id: "new-user-name", required: true, autocomplete: "off" }));
  const password = field(
    `Password (${PASSWORD_MIN} characters or more; empty: none yet, set one later here)`,
    h("input", { id: "new-user-password", type: "password", autocomplete: "new-password" }),
  );
  const group = field(
    "Group (optional, becomes the default group)",
    h("select", { id: "new-user-group" }, h("option", { value: "" }, "none"), groups.map((g) => h("option", { value: g.name }, g.name))),
  );
  const admin = field("Administrator", h("input", { id: "new-user-admin", type: "checkbox" }));
  const formError = h("p", { class: "field-error", role: "alert", hidden: true });
  const form = h(
    "form",
    { id: "create-user", class: "admin-form", novalidate: true },
    name.wrap,
    password.wrap,
    group.wrap,
    admin.wrap,
    formError,
    h("div", { class: "actions" }, h("button", { type: "submit", class: "button primary" }, "Create user")),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    for (const f of [name, password, group]) f.clear();
    formError.hidden = true;
    const wanted = name.input.value.trim();
    if (!USER_NAME_RE.test(wanted)) return name.show(wanted ? NAME_RULE : "A name is required.");
    const secret = password.input.value;
    if (secret && secret.length < PASSWORD_MIN) return password.show(`At least ${PASSWORD_MIN} characters.`);
    const body = { name: wanted, password: secret || null, is_admin: admin.input.checked, groups: [], default_group: null };
    if (group.input.value) Object.assign(body, { groups: [group.input.value], default_group: group.input.value });
    try {
      await post("/users", body);
    } catch (err) {
      showRefusal(err, { name, password, groups: group, default_group: group }, name, formError);
      return;
    }
    form.reset();
    toast(`User ${wanted} created.`, "success");
    await refresh();
  });
  return form;
}

// An admin sets (or resets) anyone's password, no current password needed (`corral user passwd NAME`).
function passwordForm() {
  const user = field("User", h("input", { id: "passwd-user", required: true, autocomplete: "off", list: "user-names" }));
  const password = field(`New password (${PASSWORD_MIN} characters or more)`, h("input", { id: "passwd-password", type: "password", autocomplete: "new-password" }));
  const formError = h("p", { class: "field-error", role: "alert", hidden: true });
  const form = h(
    "form",
    { id: "set-password", class: "admin-form", novalidate: true },
    user.wrap,
    password.wrap,
    formError,
    h("div", { class: "actions" }, h("button", { type: "submit", class: "button primary" }, "Set password")),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    for (const f of [user, password]) f.clear();
    formError.hidden = true;
    const who = user.input.value.trim();
    if (!who) return user.show("Which user?");
    if (password.input.value.length < PASSWORD_MIN) return password.show(`At least ${PASSWORD_MIN} characters.`);
    try {
      await put(`/users/${encodeURIComponent(who)}/password`, { password: password.input.value });
    } catch (err) {
      showRefusal(err, { password }, user, formError);
      return;
    }
    form.reset();
    toast(`${who}'s password set.`, "success");
  });
  return form;
}
