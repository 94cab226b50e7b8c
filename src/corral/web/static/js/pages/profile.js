// Profile: who I am, my API tokens (create — the secret is shown once — and revoke) and my SSH
// public keys (stored now, used by workspaces later).

import { ApiError, del, get, itemsOf, post } from "../api.js";
import { currentUser } from "../app.js";
import { fill, emptyState, errorBox, h, section, table, timeEl, toast } from "../ui.js";

const SSH_KEYS_PATH = "/ssh-keys";

export async function render(ctx) {
  const me = currentUser();
  const tokens = h("div", { id: "tokens" });
  const keys = h("div", { id: "ssh-keys" });
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
  );
  await Promise.all([drawTokens(tokens), drawKeys(keys)]);
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
