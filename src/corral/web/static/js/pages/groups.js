// Groups and quotas: per group and GPU model, usage (and borrowed GPUs) against guaranteed and
// max; CPUs and memory; warnings when guarantees add up to more than the cluster. Admins create
// groups, set and remove quotas, add users to groups and set a user's default group; a group's admins add
// users to their groups (or change a member's role) and remove members, as the API lets them.

import { ApiError, api, get, itemsOf, post, put } from "../api.js";
import { currentUser, isAdmin } from "../app.js";
import { gpusInUseByGroup } from "../metrics.js";
import { fill, emptyState, errorBox, h, section, table, toast, usageBar } from "../ui.js";

// Quotas as [{model, guaranteed, max, used, borrowed}]: from the group's own `usage` (the API
// computes it from the live attempts, per quota key, with the GPUs held on borrowed quota), else
// from `usage` = {model: GPUs held now}; the "*" quota covers the models that have no quota of
// their own (as the scheduler reads it).
export function quotaRows(group, usage) {
  if (group.usage && Array.isArray(group.usage.gpus)) {
    return group.usage.gpus.map((r) => ({
      model: r.gpu_model,
      guaranteed: Number(r.guaranteed ?? 0),
      max: r.max ?? null,
      used: Number(r.used ?? 0),
      borrowedGpus: Number(r.borrowed ?? 0),
      noQuota: r.guaranteed === 0 && r.max == null && !(group.quotas || []).some((q) => q.gpu_model === r.gpu_model),
    }));
  }
  const quotas = group.quotas || [];
  const own = new Set(quotas.map((q) => q.gpu_model));
  const rows = quotas.map((q) => {
    const model = q.gpu_model ?? "*";
    const used =
      model === "*"
        ? Object.entries(usage).reduce((sum, [m, n]) => sum + (own.has(m) ? 0 : n), 0)
        : Number(usage[model] || 0);
    return { model, guaranteed: Number(q.guaranteed ?? 0), max: q.max ?? null, used };
  });
  if (!own.has("*")) {
    for (const [model, used] of Object.entries(usage)) {
      if (!own.has(model)) rows.push({ model, guaranteed: 0, max: null, used, noQuota: true });
    }
  }
  return rows;
}

// "CPUs 3 used / 16 guaranteed / 32 max · memory 12 / 64 / unlimited GiB"
function cpuMemoryLine(usage) {
  const of = (u, scale) => [u.used, u.guaranteed, u.max].map((v) => (v == null ? "unlimited" : String(Math.round((v / scale) * 10) / 10)));
  const [cu, cg, cm] = of(usage.cpus, 1);
  const [mu, mg, mm] = of(usage.memory_mib, 1024);
  return `CPUs ${cu} used / ${cg} guaranteed / ${cm} max · memory ${mu} / ${mg} / ${mm} GiB`;
}

// The API lists a group's members only to its admins and to administrators, who may also remove
// them; to anyone else it sends none, which is not "no members" (so nothing is shown).
function membersBlock(group, refresh) {
  if (!Array.isArray(group.members)) return null;
  if (!group.members.length) return h("p", { class: "muted members" }, "No members.");
  return h(
    "div",
    { class: "muted members" },
    "Members:",
    h(
      "ul",
      { class: "member-list" },
      group.members.map((m) => {
        const name = typeof m === "string" ? m : m.name ?? m.user;
        const button = h(
          "button",
          { type: "button", class: "button small subtle remove-member", "aria-label": `Remove ${name} from ${group.name}` },
          "Remove",
        );
        button.addEventListener("click", () => removeMember(group.name, name, button, refresh));
        return h("li", { "data-member": name }, h("span", {}, `${name}${m.role === "admin" ? " (admin)" : ""}`), " ", button);
      }),
    ),
  );
}

// DELETE /groups/{name}/members/{user}, after a confirmation. The member's live jobs in the group
// refuse it (409 naming them and the way out, cancel_jobs=true): the user is asked whether to
// cancel them, as `corral user remove-from-group --cancel-jobs` does.
async function removeMember(group, user, button, refresh) {
  if (!window.confirm(`Remove ${user} from ${group}?`)) return;
  const path = `/groups/${encodeURIComponent(group)}/members/${encodeURIComponent(user)}`;
  button.disabled = true;
  try {
    try {
      await api("DELETE", path);
    } catch (err) {
      const liveJobs = err instanceof ApiError && err.status === 409 && err.message.includes("cancel_jobs");
      if (!liveJobs) throw err;
      if (!window.confirm(`${err.message}\n\nCancel those jobs and remove ${user}?`)) return;
      await api("DELETE", path, { query: { cancel_jobs: true } });
    }
    toast(`${user} removed from ${group}.`, "success");
    await refresh();
  } catch (err) {
    toast(`${user} was not removed from ${group}: ${err.message}`, "error");
  } finally {
    button.disabled = false;
  }
}

export async function render(ctx) {
  const list = h("div", { id: "groups-list" });
  const adminBox = h("div", {});
  ctx.main.append(
    h("h1", {}, "Groups and quotas"),
    h("p", { class: "muted" }, "GPUs in use now against each group's guaranteed share (the black mark) and maximum."),
    list,
    adminBox,
  );
  const refresh = async () => {
    try {
      const [groups, usage] = await Promise.all([
        get("/groups").then((payload) => itemsOf(payload, "groups")),
        gpusInUseByGroup().catch(() => new Map()),
      ]);
      if (!ctx.alive()) return;
      drawGroups(list, groups, usage, refresh);
      // Admins get every form; a group's admins the member form for the groups they administer.
      const mine = isAdmin() ? groups : groups.filter((g) => administered().has(g.name));
      if (!adminBox.firstChild && isAdmin()) adminBox.append(adminForms(groups, refresh));
      else if (!adminBox.firstChild && mine.length) adminBox.append(groupAdminForms(mine, refresh));
      else if (adminBox.firstChild) updateGroupOptions(adminBox, mine);
    } catch (err) {
      if (ctx.alive()) fill(list, errorBox(err, "Cannot load groups"));
    }
  };
  await refresh();
  ctx.every(10000, refresh);
}

function drawGroups(root, groups, usage, refresh) {
  if (!groups.length) {
    fill(root, emptyState("No groups yet."));
    return;
  }
  fill(root, 
    h(
      "div",
      { class: "grid-2" },
      groups.map((g) => {
        const rows = quotaRows(g, usage.get(g.name) || {});
        return h(
          "section",
          { class: "card group", "data-group": g.name },
          h("h2", {}, g.name),
          rows.length
            ? table(
                [
                  {
                    label: "GPU model",
                    cell: (r) => [r.model === "*" ? "any model" : r.model, r.noQuota ? h("span", { class: "muted" }, " (no quota: borrowed)") : null],
                  },
                  { label: "Used", cell: (r) => String(r.used), class: "num" },
                  { label: "Borrowed", cell: (r) => (r.borrowedGpus == null ? "-" : String(r.borrowedGpus)), class: "num" },
                  { label: "Guaranteed", cell: (r) => String(r.guaranteed), class: "num quota-guaranteed" },
                  { label: "Max", cell: (r) => (r.max == null ? "unlimited" : String(r.max)), class: "num quota-max" },
                  {
                    label: "Usage",
                    cell: (r) => usageBar(r.used, r.max ?? Math.max(r.guaranteed, r.used, 1), `${g.name} ${r.model} usage`, r.guaranteed),
                  },
                ],
                rows,
                { class: "quotas" },
              )
            : emptyState("No quota: this group can only borrow idle GPUs."),
          g.usage ? h("p", { class: "muted cpu-memory" }, cpuMemoryLine(g.usage)) : null,
          (g.warnings || []).map((w) => h("p", { class: "quota-warning sev-warning", role: "note" }, `Warning: ${w}`)),
          membersBlock(g, refresh),
        );
      }),
    ),
  );
}

// The groups the user is an admin of (from /me, which the portal reads again on navigation).
function administered() {
  const groups = (currentUser() || {}).groups || [];
  return new Set(groups.filter((g) => typeof g === "object" && g.role === "admin").map((g) => g.name));
}

function groupSelect(id, groups) {
  return h("select", { id, required: true, class: "group-select" }, groups.map((g) => h("option", { value: g.name }, g.name)));
}

function updateGroupOptions(box, groups) {
  for (const select of box.querySelectorAll("select.group-select")) {
    const current = select.value;
    const names = groups.map((g) => g.name);
    if (Array.from(select.options).map((o) => o.value).join() === names.join()) continue;
    fill(select, ...names.map((n) => h("option", { value: n, selected: n === current }, n)));
  }
}

// One small admin form: fields + a submit button; errors from the API are shown in the form.
function adminForm(id, title, fields, buttonLabel, action) {
  const error = h("p", { class: "field-error", role: "alert", hidden: true });
  const form = h(
    "form",
    { id, class: "admin-form", novalidate: true },
    h("h3", {}, title),
    fields.map(([label, input]) => h("div", { class: "field" }, h("label", { for: input.id }, label), input)),
    error,
    h("button", { type: "submit", class: "button primary" }, buttonLabel),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    for (const [label, input] of fields) {
      if (input.required && !input.value.trim()) {
        error.textContent = `${label} is required.`;
        error.hidden = false;
        input.focus();
        return;
      }
    }
    try {
      const message = await action();
      if (message) toast(message, "success"); // null: the user thought better of it
    } catch (err) {
      error.textContent =
        err instanceof ApiError && err.fieldErrors.length ? err.fieldErrors.map((e) => `${e.loc.join(".")}: ${e.msg}`).join("; ") : err.message;
      error.hidden = false;
    }
  });
  return form;
}

// Add a user to a group, or change a member's role (POST /groups/{name}/members).
function memberForm(groups, refresh) {
  const mGroup = groupSelect("member-group", groups);
  const mUser = h("input", { id: "member-user", required: true, autocomplete: "off", list: "known-users" });
  const mRole = h("select", { id: "member-role" }, h("option", { value: "member" }, "member"), h("option", { value: "admin" }, "group admin"));
  return adminForm(
    "add-member",
    "Add a user to a group",
    [
      ["Group", mGroup],
      ["User", mUser],
      ["Role", mRole],
    ],
    "Add user",
    async () => {
      await post(`/groups/${encodeURIComponent(mGroup.value)}/members`, { user: mUser.value.trim(), role: mRole.value });
      await refresh();
      return `${mUser.value.trim()} added to ${mGroup.value} as ${mRole.value === "admin" ? "group admin" : "member"}.`;
    },
  );
}

// A group admin's part: members of the groups they administer (their quotas show above).
function groupAdminForms(groups, refresh) {
  return section(
    "Your groups' members",
    h("p", { class: "muted" }, "As a group admin you add users to your groups, change a member's role or remove a member (Remove, next to their name above); quotas are set by an administrator."),
    h("div", { class: "admin-grid" }, memberForm(groups, refresh)),
  );
}

// DELETE /groups/{name}/quota?gpu_model= (corral group quota --clear): the model then falls under
// the group's "*" quota, if any (a quota set to 0 would still be a row of its own).
function removeQuotaForm(groups, refresh) {
  const group = groupSelect("remove-quota-group", groups);
  const model = h("input", { id: "remove-quota-model", value: "*", required: true });
  return adminForm(
    "remove-quota",
    "Remove a quota",
    [
      ["Group", group],
      ["GPU model (* = any)", model],
    ],
    "Remove quota",
    async () => {
      const gpuModel = model.value.trim();
      if (!window.confirm(`Remove the ${gpuModel} GPU quota of ${group.value}?`)) return null;
      await api("DELETE", `/groups/${encodeURIComponent(group.value)}/quota`, { query: { gpu_model: gpuModel } });
      await refresh();
      return `Quota of ${group.value} for ${gpuModel} removed.`;
    },
  );
}

const GROUP_NAME_RE = /^[a-z0-9][a-z0-9._-]{0,63}$/;

function adminForms(groups, refresh) {
  const newName = h("input", { id: "new-group-name", required: true, autocomplete: "off" });
  const qGroup = groupSelect("quota-group", groups);
  const qModel = h("input", { id: "quota-model", value: "*", required: true });
  const qGuaranteed = h("input", { id: "quota-guaranteed", type: "number", min: 0, value: 0, required: true });
  const qMax = h("input", { id: "quota-max", type: "number", min: 0, placeholder: "unlimited" });
  const dUser = h("input", { id: "default-user", required: true, autocomplete: "off", list: "known-users" });
  const dGroup = groupSelect("default-group", groups);
  const users = h("datalist", { id: "known-users" });
  get("/users")
    .then((payload) => users.append(...itemsOf(payload, "users").map((u) => h("option", { value: u.name }))))
    .catch(() => {});

  const nonNegative = (input) => {
    const n = Number(input.value);
    if (!Number.isInteger(n) || n < 0) throw new Error(`${input.id.replace("quota-", "")} must be a whole number of GPUs, 0 or more`);
    return n;
  };
  return section(
    "Administration",
    users,
    h(
      "div",
      { class: "admin-grid" },
      adminForm("create-group", "Create a group", [["Group name", newName]], "Create group", async () => {
        // The API's rule (services/accounts.py NAME_RE), said in words: its 422 quotes the regex.
        if (!GROUP_NAME_RE.test(newName.value.trim())) {
          throw new Error("Use lowercase letters, digits, '.', '_' or '-', starting with a letter or digit (64 at most).");
        }
        await post("/groups", { name: newName.value.trim() });
        const created = newName.value.trim();
        newName.value = "";
        await refresh();
        return `Group ${created} created.`;
      }),
      adminForm(
        "set-quota",
        "Set a quota",
        [
          ["Group", qGroup],
          ["GPU model (* = any)", qModel],
          ["Guaranteed GPUs", qGuaranteed],
          ["Max GPUs (empty = unlimited)", qMax],
        ],
        "Set quota",
        async () => {
          const body = {
            gpu_model: qModel.value.trim() || "*",
            guaranteed: nonNegative(qGuaranteed),
            max: qMax.value.trim() === "" ? null : nonNegative(qMax),
          };
          await put(`/groups/${encodeURIComponent(qGroup.value)}/quota`, body);
          await refresh();
          return `Quota of ${qGroup.value} for ${body.gpu_model} set.`;
        },
      ),
      removeQuotaForm(groups, refresh),
      memberForm(groups, refresh),
      adminForm(
        "set-default-group",
        "Set a user's default group",
        [
          ["User", dUser],
          ["Group", dGroup],
        ],
        "Set default group",
        async () => {
          await put(`/users/${encodeURIComponent(dUser.value.trim())}/default-group`, { group: dGroup.value });
          return `${dUser.value.trim()}'s default group is now ${dGroup.value}.`;
        },
      ),
    ),
  );
}
