// Environments: the catalogue of Python environments jobs run in (`environment: NAME[@VERSION]`),
// each version's build state, lock and build job (its log), and a form that queues a new build
// from a requirements text (docs/catalogues.md, "Environments").

import { del, get, post } from "../api.js";
import { currentUser } from "../app.js";
import { emptyState, errorBox, fill, fmtTime, h, section, table, toast } from "../ui.js";

// A version's state in the job states' colours: ready like succeeded, building like running.
const BADGE_STYLE = { ready: "succeeded", failed: "failed", building: "running" };
const versionBadge = (state) => h("span", { class: `badge state-${BADGE_STYLE[state] || "unknown"}` }, state);

const visibility = (e) => (e.visibility === "group" ? `group ${e.group}` : e.visibility);

function versionsTable(env, refresh) {
  return table(
    [
      { label: "Version", cell: (v) => h("code", {}, v.ref) },
      { label: "State", cell: (v) => versionBadge(v.state) },
      { label: "Lock", cell: (v) => (v.cache_key ? h("code", { title: v.lock || "" }, v.cache_key.slice(0, 12)) : "—") },
      { label: "Cache hit", cell: (v) => (v.state === "ready" ? (v.cache_hit ? "yes" : "no") : "—") },
      { label: "Python", cell: (v) => h("code", { title: v.interpreter || "the server's base interpreter" }, v.python) },
      { label: "Build job", cell: (v) => (v.build_job_id ? h("a", { href: `/jobs/${v.build_job_id}` }, `#${v.build_job_id}`) : "—") },
      { label: "Created", cell: (v) => `${fmtTime(v.created_at)} by ${v.created_by}` },
      { label: "Error", cell: (v) => (v.error ? h("pre", { class: "log" }, v.error) : "") },
      {
        label: "",
        cell: (v) =>
          h(
            "button",
            {
              type: "button",
              class: "button subtle",
              onclick: async () => {
                try {
                  await del(`/environments/${encodeURIComponent(env.name)}?version=${v.version}`);
                  toast(`Deleted ${v.ref}`);
                  refresh();
                } catch (err) {
                  toast(err.message, "error");
                }
              },
            },
            "Delete",
          ),
      },
    ],
    env.versions,
  );
}

function createForm(onDone) {
  const me = currentUser() || {};
  const groups = (me.groups || []).map((g) => g.name);
  const status = h("p", { class: "muted", id: "env-status", role: "status" });
  // A refusal is shown as an error (and announced), not in the grey of a progress note.
  const setStatus = (text, failed) => {
    status.textContent = text;
    status.className = failed ? "field-error" : "muted";
    status.setAttribute("role", failed ? "alert" : "status");
  };
  const form = h(
    "form",
    { class: "form", id: "env-form" },
    // The "-" escaped: Chromium compiles a pattern with the v flag, where a bare "-" at a class's
    // end is a syntax error and the whole pattern was ignored (with a console error).
    h("label", {}, "Name ", h("input", {
      name: "name",
      required: true,
      pattern: "[A-Za-z0-9][A-Za-z0-9._\\-]{0,63}",
      title: "Letters, digits, '.', '_' or '-', starting with a letter or digit (64 at most)",
    })),
    h("label", {}, "requirements.txt ", h("textarea", { name: "source", required: true, rows: 4, placeholder: "numpy==2.4.6\nscikit-learn" })),
    h(
      "label",
      {},
      "Visibility ",
      h("select", { name: "visibility" }, ["private", "group", "public"].map((v) => h("option", { value: v }, v))),
    ),
    h("label", {}, "Group ", h("select", { name: "group" }, h("option", { value: "" }, "—"), groups.map((g) => h("option", { value: g }, g)))),
    h("button", { type: "submit", class: "button" }, "Build"),
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    try {
      const v = await post("/environments", {
        name: String(data.get("name")),
        source: String(data.get("source")),
        visibility: String(data.get("visibility")),
        group: String(data.get("group")) || null,
      });
      setStatus(`${v.ref}: building (job #${v.build_job_id})`, false);
      toast(`Building ${v.ref}`);
      onDone();
    } catch (err) {
      setStatus(`refused: ${err.message}`, true);
    }
  });
  return section(
    "Build an environment or a new version",
    h("p", { class: "muted" }, "A build job runs as you (your group's quota) and resolves the packages from the admin's package index; identical locks share one copy."),
    form,
  );
}

export async function render(ctx) {
  const list = h("div", { id: "environments-list" });
  const detail = h("div", { id: "environment-detail" });
  const selected = () => new URLSearchParams(window.location.search).get("name");
  const refresh = async () => {
    try {
      const rows = await get("/environments");
      if (!ctx.alive()) return;
      const columns = [
        { label: "Name", cell: (e) => h("a", { href: `/environments?name=${encodeURIComponent(e.name)}` }, e.name) },
        { label: "", cell: (e) => (e.official ? h("span", { class: "badge" }, "official") : "") },
        { label: "Ready", cell: (e) => (e.latest_ready ? `@${e.latest_ready}` : "—") },
        { label: "Versions", cell: (e) => String(e.versions.length) },
        { label: "Visibility", cell: visibility },
        { label: "Owner", cell: (e) => e.owner },
        { label: "Description", cell: (e) => e.description },
      ];
      fill(list, rows.length ? table(columns, rows) : emptyState("No environments yet: jobs run in the server's own (default)."));
      const name = selected();
      const env = rows.find((e) => e.name === name);
      fill(
        detail,
        env
          ? section(
              `Environment ${env.name}`,
              h("p", { class: "muted" }, `In a job: environment: ${env.name} (newest ready) or ${env.name}@N`),
              versionsTable(env, refresh),
            )
          : // A link to one that is gone (or not shared with the user) says so, not nothing.
            name
            ? errorBox(new Error(`no environment named '${name}' that you may use`), `Cannot show environment ${name}`)
            : "",
      );
    } catch (err) {
      if (ctx.alive()) fill(list, errorBox(err, "Cannot load environments"));
    }
  };
  ctx.main.append(h("h1", {}, "Environments"), list, detail, createForm(refresh));
  await refresh();
  ctx.every(5000, refresh);
}
