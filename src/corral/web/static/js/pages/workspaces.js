// Workspaces: your interactive workspaces (GET /workspaces), a create form, Open JupyterLab
// (this portal's /ws/<id>/lab, which hands the owner over to the workspaces' own origin, where
// Corral's proxy serves it), start/stop/remove,
// and how to connect with ssh or VS Code Remote-SSH through the SSH gateway.

import { api, get } from "../api.js";
import { emptyState, errorBox, fill, fmtTime, h, stateBadge, table, toast } from "../ui.js";

export function sshConfig(ws, host) {
  return [
    `Host corral-${ws.name}`,
    `  HostName ${host}`,
    `  Port ${ws.ssh_port}`,
    `  User ${ws.ssh_user}`,
    "  IdentityFile ~/.ssh/id_ed25519",
    "",
  ].join("\n");
}

function field(label, input) {
  return h("div", { class: "field" }, h("label", { for: input.id }, label), input);
}

function createForm(onCreated) {
  const name = h("input", { id: "ws-name", name: "name", placeholder: "workspace" });
  const gpus = h("input", { id: "ws-gpus", name: "gpus", type: "number", min: "0", value: "0" });
  const gpuModel = h("input", { id: "ws-gpu-model", name: "gpu_model", placeholder: "any" });
  const cpus = h("input", { id: "ws-cpus", name: "cpus", type: "number", min: "0.5", step: "0.5", value: "1" });
  const memory = h("input", { id: "ws-memory", name: "memory", value: "4GiB" });
  const idle = h("input", { id: "ws-idle", name: "idle_timeout", placeholder: "group default" });
  const message = h("div", { id: "ws-error", class: "error-box", role: "alert", hidden: true });
  const submit = h("button", { type: "submit", class: "button primary" }, "Create workspace");
  const form = h(
    "form",
    { class: "card ws-form", id: "ws-create" },
    h("h2", {}, "New workspace"),
    message,
    h("div", { class: "toolbar" }, field("Name", name), field("GPUs", gpus), field("GPU model", gpuModel)),
    h("div", { class: "toolbar" }, field("CPUs", cpus), field("Memory", memory), field("Idle timeout", idle)),
    submit,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    message.hidden = true;
    const body = { gpus: Number(gpus.value), cpus: Number(cpus.value), memory: memory.value.trim() };
    if (name.value.trim()) body.name = name.value.trim();
    if (gpuModel.value.trim()) body.gpu_model = gpuModel.value.trim();
    if (idle.value.trim()) body.idle_timeout = idle.value.trim();
    submit.disabled = true;
    try {
      const ws = await api("POST", "/workspaces", { json: body });
      toast(`Workspace ${ws.name} created`);
      name.value = "";
      await onCreated();
    } catch (err) {
      message.textContent = err.message;
      message.hidden = false;
    } finally {
      submit.disabled = false;
    }
  });
  return form;
}

function actions(ws, refresh) {
  const act = (label, method, path) => {
    const button = h("button", { type: "button", class: "button subtle", "data-action": label.toLowerCase() }, label);
    button.addEventListener("click", async () => {
      if (label === "Remove" && !window.confirm(`Remove workspace ${ws.name}? Your files stay in your home.`)) return;
      button.disabled = true;
      try {
        await api(method, path);
        await refresh();
      } catch (err) {
        toast(err.message, "error");
        button.disabled = false;
      }
    });
    return button;
  };
  const base = `/workspaces/${encodeURIComponent(ws.name)}`;
  // A link only while it is running: before that (or once stopped or failed) the proxy has no
  // JupyterLab to reach, and a link that looks live opened a tab with an error page.
  const up = ws.state === "running";
  const open = h(
    "a",
    {
      class: "button primary ws-open",
      href: up ? ws.url : undefined,
      target: up ? "_blank" : undefined,
      rel: up ? "noopener" : undefined,
      "aria-disabled": up ? undefined : "true",
      title: up ? undefined : `JupyterLab opens once the workspace is running (it is ${ws.state})`,
    },
    "Open JupyterLab",
  );
  const running = ["pending", "starting", "running"].includes(ws.state);
  return h(
    "span",
    { class: "ws-actions" },
    open,
    running ? act("Stop", "POST", `${base}/stop`) : act("Start", "POST", `${base}/start`),
    act("Remove", "DELETE", base),
  );
}

function whyCell(ws) {
  if (ws.failure) return h("span", { class: "ws-failure bad" }, `failed: ${ws.failure}`);
  return ws.waiting ? ws.waiting.message : "";
}

function sshHelp(rows) {
  const host = window.location.hostname;
  const first = rows[0];
  if (!first.ssh_port) {
    // CORRAL_SSH_GATEWAY_PORT=0: this server runs no SSH gateway, so there is nothing to connect to.
    return h("section", { class: "card", id: "ws-ssh" }, h("h2", {}, "SSH and VS Code"),
      h("p", {}, "The SSH gateway is off on this server; JupyterLab is the way in."));
  }
  const snippet = sshConfig(first, host);
  const pre = h("pre", { id: "ws-ssh-config", class: "code" }, snippet);
  const copy = h("button", { type: "button", class: "button subtle", id: "ws-copy-ssh" }, "Copy");
  copy.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(snippet);
      toast("ssh_config snippet copied");
    } catch {
      toast("Select the text and copy it", "error");
    }
  });
  return h(
    "section",
    { class: "card", id: "ws-ssh" },
    h("h2", {}, "SSH and VS Code"),
    h("p", {}, "Register your public key on the Profile page (or `corral key add ~/.ssh/id_ed25519.pub`), then:"),
    h("pre", { class: "code" }, `ssh -p ${first.ssh_port} ${first.ssh_user}@${host}`),
    h("p", {}, "For VS Code Remote-SSH or JetBrains Gateway, add this to ~/.ssh/config and connect to ", h("code", {}, `corral-${first.name}`), ":"),
    pre,
    copy,
  );
}

export async function render(ctx) {
  const list = h("div", { id: "ws-list" });
  const help = h("div", { id: "ws-help" });
  const refresh = async () => {
    let rows;
    try {
      rows = await get("/workspaces");
    } catch (err) {
      fill(list, errorBox(err, "Cannot load workspaces"));
      return;
    }
    if (!ctx.alive()) return;
    if (!rows.length) {
      fill(list, emptyState("No workspaces yet: create one below."));
      fill(help);
      return;
    }
    fill(
      list,
      table(
        [
          { label: "Name", cell: (w) => w.name },
          { label: "State", cell: (w) => stateBadge(w.state) },
          { label: "Resources", cell: (w) => `${w.gpus} GPU${w.gpus === 1 ? "" : "s"}${w.gpu_model ? ` (${w.gpu_model})` : ""}, ${w.cpus} CPUs, ${w.memory_mib} MiB` },
          // A failed one says why (its job's reason, as `corral ws show` prints it): the list
          // said "stopped" and nothing else, and the job page was the only place to find out.
          { label: "Why", cell: whyCell },
          { label: "Created", cell: (w) => fmtTime(w.created_at) },
          { label: "", cell: (w) => actions(w, refresh) },
        ],
        rows,
        { class: "workspaces" },
      ),
    );
    fill(help, sshHelp(rows));
  };
  ctx.main.append(h("h1", {}, "Workspaces"), list, createForm(refresh), help);
  await refresh();
  ctx.every(3000, refresh);
}
