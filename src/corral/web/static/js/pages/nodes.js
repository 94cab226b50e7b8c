// Nodes grid: each node with its GPUs shown free, allocated (linked to the job) or unhealthy
// (failing, quarantined or lost); admins cordon, uncordon and drain from here, quarantine a
// GPU or return it to service, and remove a decommissioned node. Polled so allocations appear without reloads.
// Each card shows the anomaly detector's failure risk (GET /nodes/risk), and nodes at risk are
// listed above the grid with the reasons, worst first.

import { del, get, itemsOf, post } from "../api.js";
import { isAdmin } from "../app.js";
import { fill, emptyState, errorBox, h, messageBox, timeEl, toast } from "../ui.js";

export async function render(ctx) {
  const grid = h("div", { id: "nodes-grid" });
  const risky = h("section", { id: "risky-nodes", "aria-label": "Risky nodes" });
  // An admin action's refusal: above the grid, which is redrawn every 5 s (ui.js messageBox).
  const message = messageBox("nodes-message");
  ctx.main.append(
    h("h1", {}, "Nodes"),
    message.element,
    h(
      "ul",
      { class: "legend gpu-legend", "aria-label": "Legend" },
      h("li", {}, h("span", { class: "gpu gpu-free", "aria-hidden": "true" }), "free"),
      h("li", {}, h("span", { class: "gpu gpu-allocated", "aria-hidden": "true" }), "allocated"),
      h("li", {}, h("span", { class: "gpu gpu-unhealthy", "aria-hidden": "true" }), "unhealthy or quarantined"),
    ),
    risky,
    grid,
  );
  const refresh = async () => {
    try {
      const [nodes, risk] = await Promise.all([get("/nodes"), get("/nodes/risk").catch(() => ({ nodes: [] }))]);
      const byNode = new Map((risk.nodes || []).map((r) => [r.node, r]));
      if (!ctx.alive()) return;
      drawRisky(risky, risk.nodes || []);
      drawGrid(grid, itemsOf(nodes, "nodes"), { refresh, message }, byNode);
    } catch (err) {
      if (ctx.alive()) fill(grid, errorBox(err, "Cannot load nodes"));
    }
  };
  await refresh();
  ctx.every(5000, refresh);
}

// `healthy` is the monitor's reading, `health` the placement verdict: a GPU quarantined (by an
// admin or on ECC/Xid faults) or lost takes no job even while it reads healthy.
function outOfService(gpu) {
  return Boolean(gpu.health) && gpu.health !== "healthy";
}

function gpuState(gpu) {
  if (gpu.healthy === false || gpu.state === "unhealthy" || outOfService(gpu)) return "unhealthy";
  if (gpu.allocated || (gpu.job_id !== null && gpu.job_id !== undefined)) return "allocated";
  return "free";
}

function gpuCell(node, gpu) {
  const st = gpuState(gpu);
  const why = outOfService(gpu) ? gpu.health : st;
  // A job the caller may not see is not named (job_id null): the GPU shows held, without a link.
  const seen = gpu.job_id !== null && gpu.job_id !== undefined;
  const holder = st === "allocated" ? (seen ? ` to job ${gpu.job_id}` : " to another user's job") : "";
  const label = `GPU ${gpu.index} ${gpu.model || ""}: ${why}${holder}`;
  const inner = [h("span", { class: "gpu-index" }, String(gpu.index)), h("span", { class: "gpu-model" }, gpu.model || "")];
  if (st === "allocated" && seen) {
    return h("li", {}, h("a", { href: `/jobs/${gpu.job_id}`, class: "gpu gpu-allocated", title: label, "aria-label": label }, inner, h("span", { class: "gpu-job" }, `#${gpu.job_id}`)));
  }
  return h("li", {}, h("span", { class: `gpu gpu-${st}`, title: label, role: "img", "aria-label": label }, inner));
}

const RISK_WARN = 0.3; // shown in the list from here; CorralNodeFailureRisk alerts above 0.6
const RISK_ALERT = 0.6;

function riskLevel(risk) {
  return risk >= RISK_ALERT ? "high" : risk >= RISK_WARN ? "elevated" : "low";
}

function drawRisky(section, risks) {
  const shown = risks.filter((r) => r.risk >= RISK_WARN);
  if (!shown.length) {
    fill(section);
    return;
  }
  fill(
    section,
    h("h2", {}, "Risky nodes"),
    h(
      "table",
      { class: "risky-nodes" },
      h("thead", {}, h("tr", {}, h("th", {}, "Node"), h("th", {}, "Risk"), h("th", {}, "Why"))),
      h(
        "tbody",
        {},
        shown.map((r) =>
          h(
            "tr",
            { "data-node": r.node },
            h("td", { "data-label": "Node" }, r.node),
            h("td", { "data-label": "Risk" }, h("span", { class: `badge risk-${riskLevel(r.risk)}` }, r.risk.toFixed(2))),
            h("td", { "data-label": "Why" }, (r.reasons || []).slice(0, 3).join("; ") || "-"),
          ),
        ),
      ),
    ),
  );
}

// `page`: {refresh, message}: the grid's reload, and the line an admin action's refusal goes to.
function drawGrid(grid, nodes, page, risks) {
  if (!nodes.length) {
    fill(grid, emptyState("No nodes have registered yet."));
    return;
  }
  fill(grid, h("div", { class: "node-grid" }, nodes.map((n) => nodeCard(n, page, risks.get(n.name)))));
}

function nodeCard(node, page, risk) {
  const gpus = node.gpus || [];
  const counts = { free: 0, allocated: 0, unhealthy: 0 };
  for (const g of gpus) counts[gpuState(g)]++;
  const state = String(node.state || "unknown");
  return h(
    "article",
    { class: `card node node-${state}`, "data-node": node.name, "aria-label": `Node ${node.name}` },
    h(
      "header",
      {},
      h("h2", {}, node.name),
      h("span", { class: `badge node-state-${state}` }, state),
      risk
        ? h(
            "span",
            { class: `badge node-risk risk-${riskLevel(risk.risk)}`, title: (risk.reasons || []).join("\n") || "no anomalies" },
            `risk ${risk.risk.toFixed(2)}`,
          )
        : null,
    ),
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
    isAdmin() ? adminActions(node, page) : null,
  );
}

function adminActions(node, page) {
  const { refresh, message } = page;
  const admin = String(node.admin_state || (["cordoned", "draining"].includes(node.state) ? node.state : "none"));
  const send = async (button, path, done) => {
    button.disabled = true;
    message.clear();
    try {
      await post(`/nodes/${encodeURIComponent(node.name)}/${path}`);
      toast(`${node.name}: ${done}.`, "success");
      await refresh();
    } catch (err) {
      message.show(`${node.name}: ${err.message}`);
      button.disabled = false;
    }
  };
  const act = (verb, question) => (event) => {
    if (question && !window.confirm(question)) return;
    send(event.target, verb, `${verb} done`);
  };
  // The index is asked for when clicked (not a select in the card): the card is redrawn every 5 s,
  // which would put a select back on its first GPU between choosing and clicking.
  const quarantine = (event) => {
    const answer = window.prompt(`Quarantine which GPU of ${node.name}? Its index (0 to ${node.gpus.length - 1}):`);
    if (answer === null) return;
    const index = Number(answer.trim());
    if (answer.trim() === "" || !node.gpus.some((g) => g.index === index)) {
      message.show(`${node.name} has no GPU '${answer.trim()}': give one of ${node.gpus.map((g) => g.index).join(", ")}.`);
      return;
    }
    send(event.target, `gpus/${index}/quarantine`, `GPU ${index} quarantined`);
  };
  const returns = (node.gpus || []).filter(outOfService).map((g) =>
    h(
      "button",
      { type: "button", class: "button", "data-gpu": g.index, onclick: (event) => send(event.target, `gpus/${g.index}/return`, `GPU ${g.index} back in service`) },
      `Return GPU ${g.index}`,
    ),
  );
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
    (node.gpus || []).length ? h("button", { type: "button", class: "button", onclick: quarantine }, "Quarantine GPU…") : null,
    returns,
    h("button", { type: "button", class: "button danger remove-node", onclick: (event) => removeNode(node, event.target, page) }, "Remove"),
  );
}

// DELETE /nodes/{name} (corral node remove), after a confirmation. Offered on every node: the
// API's refusal (not cordoned, drained or down; jobs still placed there) says what to do first.
async function removeNode(node, button, page) {
  const question = `Remove ${node.name} from the cluster? Only a cordoned, drained or down node with no jobs on it can be removed; if its agent still reports, it comes back cordoned.`;
  if (!window.confirm(question)) return;
  button.disabled = true;
  page.message.clear();
  try {
    await del(`/nodes/${encodeURIComponent(node.name)}`);
    toast(`${node.name} removed.`, "success");
    await page.refresh();
  } catch (err) {
    page.message.show(`${node.name} was not removed: ${err.message}`);
    button.disabled = false;
  }
}
