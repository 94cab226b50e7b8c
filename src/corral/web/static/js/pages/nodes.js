// Nodes grid: each node with its GPUs shown free, allocated (linked to the job) or unhealthy;
// admins cordon, uncordon and drain from here. Polled so allocations appear without reloads.

import { get, itemsOf, post } from "../api.js";
import { isAdmin } from "../app.js";
import { fill, emptyState, errorBox, h, timeEl, toast } from "../ui.js";

export async function render(ctx) {
  const grid = h("div", { id: "nodes-grid" });
  ctx.main.append(
    h("h1", {}, "Nodes"),
    h(
      "ul",
      { class: "legend gpu-legend", "aria-label": "Legend" },
      h("li", {}, h("span", { class: "gpu gpu-free", "aria-hidden": "true" }), "free"),
      h("li", {}, h("span", { class: "gpu gpu-allocated", "aria-hidden": "true" }), "allocated"),
      h("li", {}, h("span", { class: "gpu gpu-unhealthy", "aria-hidden": "true" }), "unhealthy"),
    ),
    grid,
  );
  const refresh = async () => {
    try {
      const nodes = itemsOf(await get("/nodes"), "nodes");
      if (ctx.alive()) drawGrid(grid, nodes, refresh);
    } catch (err) {
      if (ctx.alive()) fill(grid, errorBox(err, "Cannot load nodes"));
    }
  };
  await refresh();
  ctx.every(5000, refresh);
}

function gpuState(gpu) {
  if (gpu.healthy === false || gpu.state === "unhealthy") return "unhealthy";
  if (gpu.job_id !== null && gpu.job_id !== undefined) return "allocated";
  return "free";
}

function gpuCell(node, gpu) {
  const st = gpuState(gpu);
  const label = `GPU ${gpu.index} ${gpu.model || ""}: ${st}${st === "allocated" ? ` to job ${gpu.job_id}` : ""}`;
  const inner = [h("span", { class: "gpu-index" }, String(gpu.index)), h("span", { class: "gpu-model" }, gpu.model || "")];
  if (st === "allocated") {
    return h("li", {}, h("a", { href: `/jobs/${gpu.job_id}`, class: "gpu gpu-allocated", title: label, "aria-label": label }, inner, h("span", { class: "gpu-job" }, `#${gpu.job_id}`)));
  }
  return h("li", {}, h("span", { class: `gpu gpu-${st}`, title: label, role: "img", "aria-label": label }, inner));
}

function drawGrid(grid, nodes, refresh) {
  if (!nodes.length) {
    fill(grid, emptyState("No nodes have registered yet."));
    return;
  }
  fill(grid, h("div", { class: "node-grid" }, nodes.map((n) => nodeCard(n, refresh))));
}

function nodeCard(node, refresh) {
  const gpus = node.gpus || [];
  const counts = { free: 0, allocated: 0, unhealthy: 0 };
  for (const g of gpus) counts[gpuState(g)]++;
  const state = String(node.state || "unknown");
  return h(
    "article",
    { class: `card node node-${state}`, "data-node": node.name, "aria-label": `Node ${node.name}` },
    h("header", {}, h("h2", {}, node.name), h("span", { class: `badge node-state-${state}` }, state)),
    h(
      "p",
      { class: "muted node-facts" },
      `${node.cpus ?? "?"} CPUs · ${node.memory_mib ? Math.round(node.memory_mib / 1024) + " GiB" : "? GiB"} · `,
      gpus.length ? `${counts.free} of ${gpus.length} GPUs free` : "no GPUs",
      counts.unhealthy ? ` · ${counts.unhealthy} unhealthy` : "",
    ),
    gpus.length ? h("ul", { class: "gpus", "aria-label": `GPUs of ${node.name}` }, gpus.map((g) => gpuCell(node, g))) : null,
    node.message ? h("p", { class: "node-message" }, node.message) : null,
    ...(node.flags || []).map((f) => h("p", { class: "node-flag" }, h("strong", {}, "Flagged: "), f)),
    node.last_heartbeat ? h("p", { class: "muted small" }, "heartbeat ", timeEl(node.last_heartbeat)) : null,
    isAdmin() ? adminActions(node, refresh) : null,
  );
}

function adminActions(node, refresh) {
  const admin = String(node.admin_state || (["cordoned", "draining"].includes(node.state) ? node.state : "none"));
  const act = (verb, question) => async (event) => {
    if (question && !window.confirm(question)) return;
    event.target.disabled = true;
    try {
      await post(`/nodes/${encodeURIComponent(node.name)}/${verb}`);
      toast(`${node.name}: ${verb} done.`, "success");
      await refresh();
    } catch (err) {
      toast(`${node.name}: ${err.message}`, "error");
      event.target.disabled = false;
    }
  };
  return h(
    "div",
    { class: "actions" },
    admin === "none"
      ? h("button", { type: "button", class: "button", onclick: act("cordon") }, "Cordon")
      : h("button", { type: "button", class: "button", onclick: act("uncordon") }, "Uncordon"),
    admin !== "draining"
      ? h(
          "button",
          { type: "button", class: "button danger", onclick: act("drain", `Drain ${node.name}? Its jobs will be stopped and requeued.`) },
          "Drain",
        )
      : null,
  );
}
