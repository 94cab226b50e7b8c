// Profile: who I am, my API tokens (create — the secret is shown once — and revoke), my SSH
// public keys (stored now, used by workspaces later) and my secrets for jobs (set, list, delete:
// values are write-only, the page never shows or receives one back).

import { ApiError, del, get, itemsOf, post, put } from "../api.js";
import { currentUser } from "../app.js";
import { fill, emptyState, errorBox, h, section, table, timeEl, toast } from "../ui.js";

const SSH_KEYS_PATH = "/ssh-keys";

export async function render(ctx) {
  const me = currentUser();
  const tokens = h("div", { id: "tokens" });
  const keys = h("div", { id: "ssh-keys" });
  const secrets = h("div", { id: "secrets" });
  const groups = (me.groups || []).map((g) => (typeof g === "string" ? g : `${g.name}${g.role === "admin" ? " (admin)" : ""}`));
  ctx.main.append(
    h("h1", {}, "Profile"),
    h(
      "dl",
      { class: "summary card" },
      h("div", {}, h("dt", {}, "User"), h("dd", {}, me.name)),
      h("div", {}, h("dt", {}, "Role"), h("dd", {}, me.role || "user")),
      h("div", {}, h("dt", {}, "Default group"), h("dd", {}, me.default_group || "—")),
      h("div", {}, h("dt", {}, "Groups"), h("dd", {}, groups.join(", ") || "—")),
    ),
    section("API tokens", tokenForm(() => drawTokens(tokens)), tokens),
    section("SSH public keys", keyForm(() => drawKeys(keys)), keys),
    section("Secrets for jobs", secretForm(me, () => drawSecrets(secrets)), secrets),
  );
  await Promise.all([drawTokens(tokens), drawKeys(keys), drawSecrets(secrets)]);
}

async function drawTokens(root) {
  let list;
  try {
    list = itemsOf(await get("/tokens"), "tokens");
  } catch (err) {
    fill(root, errorBox(err, "Cannot load tokens"));
    return;
  }
  const live = list.filter((t) => !t.revoked_at);
  fill(root, 
    live.length
      ? table(
          [
            { label: "Name", cell: (t) => t.name },
            { label: "Starts with", cell: (t) => h("code", {}, `${t.prefix || ""}…`) },
            { label: "Created", cell: (t) => timeEl(t.created_at) },
            { label: "Last used", cell: (t) => timeEl(t.last_used_at) },
            { label: "Expires", cell: (t) => (t.expires_at ? timeEl(t.expires_at) : "never") },
            {
              label: "",
              header: h("span", { class: "sr-only" }, "Actions"),
              cell: (t) =>
                deleteButton({
                  text: "Revoke",
                  label: `Revoke token ${t.name}`,
                  question: `Revoke the token ${t.name}? Programs using it stop working.`,
                  path: `/tokens/${t.id}`,
                  done: `Token ${t.name} revoked.`,
                  redraw: () => drawTokens(root),
                }),
            },
          ],
          live,
          { class: "tokens" },
        )
      : emptyState("No API tokens. Create one for the CLI or SDK."),
  );
}

function tokenForm(onChange) {
  const name = h("input", { id: "token-name", required: true, autocomplete: "off", placeholder: "laptop-cli" });
  const error = h("p", { class: "field-error", id: "token-name-error", role: "alert", hidden: true });
  const secret = h("div", { id: "new-token", hidden: true });
  const form = h(
    "form",
    { id: "token-form", class: "inline-form", novalidate: true },
    h("div", { class: "field" }, h("label", { for: "token-name" }, "New token name"), name, error),
    h("button", { type: "submit", class: "button primary" }, "Create token"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    if (!name.value.trim()) {
      error.textContent = "Give the token a name.";
      error.hidden = false;
      name.focus();
      return;
    }
    try {
      const created = await post("/tokens", { name: name.value.trim() });
      const value = created.token || created.secret || created.value || "";
      fill(secret, 
        h("p", {}, "Copy this token now; it is not shown again:"),
        h("code", { class: "secret", tabindex: 0 }, value),
      );
      secret.hidden = false;
      name.value = "";
      await onChange();
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    }
  });
  return h("div", {}, form, secret);
}

async function drawKeys(root) {
  let list;
  try {
    list = itemsOf(await get(SSH_KEYS_PATH), "keys", "ssh_keys");
  } catch (err) {
    if (err instanceof ApiError && err.status === 404) {
      fill(root, emptyState("This server does not offer SSH keys yet."));
    } else {
      fill(root, errorBox(err, "Cannot load SSH keys"));
    }
    return;
  }
  fill(root, 
    list.length
      ? table(
          [
            { label: "Name", cell: (k) => k.name },
            { label: "Fingerprint", cell: (k) => h("code", {}, k.fingerprint || "") },
            { label: "Added", cell: (k) => timeEl(k.created_at) },
            {
              label: "",
              header: h("span", { class: "sr-only" }, "Actions"),
              cell: (k) =>
                deleteButton({
                  text: "Remove",
                  label: `Remove key ${k.name}`,
                  question: `Remove the SSH key ${k.name}?`,
                  path: `${SSH_KEYS_PATH}/${k.id}`,
                  redraw: () => drawKeys(root),
                }),
            },
          ],
          list,
          { class: "ssh-keys" },
        )
      : emptyState("No SSH keys."),
  );
}

// A row's delete button: asks first, deletes `path`, then says `done` (if given) and redraws.
function deleteButton({ text, label, question, path, done, redraw }) {
  return h(
    "button",
    {
      type: "button",
      class: "button danger small",
      "aria-label": label,
      onclick: async () => {
        if (!window.confirm(question)) return;
        try {
          await del(path);
          if (done) toast(done, "success");
          await redraw();
        } catch (err) {
          toast(err.message, "error");
        }
      },
    },
    text,
  );
}

function keyForm(onChange) {
  const name = h("input", { id: "key-name", required: true, autocomplete: "off", placeholder: "laptop" });
  const key = h("textarea", { id: "key-text", rows: 3, required: true, spellcheck: "false", placeholder: "ssh-ed25519 AAAA… me@laptop" });
  const error = h("p", { class: "field-error", role: "alert", hidden: true });
  const form = h(
    "form",
    { id: "key-form", class: "stack-form", novalidate: true },
    h("div", { class: "field" }, h("label", { for: "key-name" }, "Key name"), name),
    h("div", { class: "field" }, h("label", { for: "key-text" }, "Public key"), key),
    error,
    h("button", { type: "submit", class: "button primary" }, "Add key"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    const text = key.value.trim();
    let problem = "";
    if (!name.value.trim()) problem = "Give the key a name.";
    else if (!/^(ssh-(ed25519|rsa|dss)|ecdsa-sha2-nistp\d+|sk-[a-z0-9@.-]+) [A-Za-z0-9+/=]+( .*)?$/.test(text)) {
      problem = "Paste a public key such as 'ssh-ed25519 AAAA… me@laptop' (never the private key).";
    }
    if (problem) {
      error.textContent = problem;
      error.hidden = false;
      return;
    }
    try {
      await post(SSH_KEYS_PATH, { name: name.value.trim(), public_key: text });
      name.value = "";
      key.value = "";
      toast("SSH key added.", "success");
      await onChange();
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    }
  });
  return form;
}

// --- secrets for jobs: names only; a job gets one when its spec lists it under `secrets:` ---------

function secretPath(s) {
  const name = `/secrets/${encodeURIComponent(s.name)}`;
  return s.group ? `${name}?group=${encodeURIComponent(s.group)}` : name;
}

async function drawSecrets(root) {
  let list;
  try {
    list = itemsOf(await get("/secrets"), "secrets");
  } catch (err) {
    fill(root, errorBox(err, "Cannot load secrets"));
    return;
  }
  fill(root,
    list.length
      ? table(
          [
            { label: "Name", cell: (s) => h("code", {}, s.name) },
            { label: "Scope", cell: (s) => (s.scope === "group" ? `group ${s.group}` : "mine") },
            { label: "Updated", cell: (s) => timeEl(s.updated_at) },
            { label: "By", cell: (s) => s.updated_by },
            {
              label: "",
              header: h("span", { class: "sr-only" }, "Actions"),
              cell: (s) =>
                deleteButton({
                  text: "Delete",
                  label: `Delete secret ${s.name}`,
                  question: `Delete the secret ${s.name}? Jobs naming it that have not started will fail.`,
                  path: secretPath(s),
                  done: `Secret ${s.name} deleted.`,
                  redraw: () => drawSecrets(root),
                }),
            },
          ],
          list,
          { class: "secrets" },
        )
      : emptyState("No secrets. A job gets one only when its spec names it under 'secrets:'."),
  );
}

function secretForm(me, onChange) {
  const name = h("input", { id: "secret-name", required: true, autocomplete: "off", placeholder: "wandb" });
  // The value field is a password input: never echoed, never filled back in.
  const value = h("input", { id: "secret-value", type: "password", autocomplete: "new-password" });
  const scope = h("select", { id: "secret-scope" }, h("option", { value: "" }, "mine"));
  for (const g of me.groups || []) {
    if (typeof g === "object" && (g.role === "admin" || me.role === "admin")) {
      scope.append(h("option", { value: g.name }, `group ${g.name}`));
    }
  }
  const error = h("p", { class: "field-error", id: "secret-error", role: "alert", hidden: true });
  const form = h(
    "form",
    { id: "secret-form", class: "inline-form", novalidate: true },
    h("div", { class: "field" }, h("label", { for: "secret-name" }, "Secret name"), name),
    h("div", { class: "field" }, h("label", { for: "secret-value" }, "Value"), value),
    h("div", { class: "field" }, h("label", { for: "secret-scope" }, "For"), scope),
    h("button", { type: "submit", class: "button primary" }, "Set secret"),
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    const problem = !name.value.trim() ? "Give the secret a name." : !value.value ? "Give it a value." : "";
    if (problem) {
      error.textContent = problem;
      error.hidden = false;
      return;
    }
    try {
      const target = secretPath({ name: name.value.trim(), group: scope.value });
      await put(target, { value: value.value });
      toast(`Secret ${name.value.trim()} set.`, "success");
      name.value = "";
      value.value = "";
      await onChange();
    } catch (err) {
      error.textContent = err.message;
      error.hidden = false;
    }
  });
  return h("div", {}, form, error);
}
