// Dashboard: GPUs by model, cluster utilization, GPU-hours reclaimed from idle workspaces, jobs by
// state, my running and waiting jobs, firing alerts, and for admins the "abnormal" jobs (running very
// long, or holding GPUs at low utilization).

import { get, itemsOf } from "../api.js";
import { currentUser, isAdmin } from "../app.js";
import {
  ALL_STATES,
  WAITING_STATES,
  fill,
  emptyState,
  errorBox,
  fmtDuration,
  h,
  jobGpus,
  link,
  section,
  stateBadge,
  table,
  timeEl,
  toDate,
  usageBar,
} from "../ui.js";
import { gpuHoursReclaimed, gpuUtilization, mean, utilizationByJob } from "../metrics.js";
import { alertRows, isFiring } from "./alerts.js";

const LONG_RUNNING_S = 24 * 3600;
const LOW_UTILIZATION = 10; // percent

export async function render(ctx) {
  const root = h("div", { class: "dashboard" });
  ctx.main.append(h("h1", {}, "Dashboard"), root);
  await refresh(root);
  ctx.every(5000, () => refresh(root));
}

async function refresh(root) {
  const me = currentUser();
  const settle = (promise) => promise.then((v) => ({ ok: v }), (err) => ({ err }));
  const [summary, util, reclaimed, running, waiting, alerts, abnormal] = await Promise.all([
    settle(get("/cluster/summary")),
    settle(gpuUtilization()),
    settle(gpuHoursReclaimed()),
    settle(get("/jobs", { user: me.name, state: "running", limit: 20, sort: "id", order: "desc" })),
    settle(get("/jobs", { user: me.name, state: WAITING_STATES.join(","), limit: 20, sort: "id", order: "asc" })),
    settle(get("/alerts", { status: "firing", limit: 50 })),
    isAdmin() ? settle(get("/jobs", { state: "running", limit: 200, sort: "id", order: "asc" })) : null,
  ]);
  const blocks = [
    h("div", { class: "grid-2" }, gpuBlock(summary, util.ok || [], reclaimed.ok ?? null), jobsByStateBlock(summary)),
    h("div", { class: "grid-2" }, myJobsBlock("My running jobs", running), myJobsBlock("My waiting jobs", waiting)),
    alertsBlock(alerts),
  ];
  if (abnormal) blocks.push(abnormalBlock(abnormal, utilizationByJob(util.ok || [])));
  fill(root, ...blocks);
}

function gpuRows(summary) {
  // Accept {gpus: {model: {total, allocated, free}}} or {gpus: [{model, total, allocated, free}]}.
  // or the API's {gpus: {total, allocated, free, by_model: {model: {...}}}}.
  let gpus = summary.gpus || summary.gpus_by_model || {};
  if (gpus.by_model) gpus = gpus.by_model;
  const rows = Array.isArray(gpus) ? gpus : Object.entries(gpus).map(([model, v]) => ({ model, ...v }));
  return rows.map((r) => {
    const allocated = Number(r.allocated ?? r.used ?? 0);
    const unhealthy = Number(r.unhealthy ?? r.unavailable ?? 0);
    const total = Number(r.total ?? allocated + Number(r.free ?? 0) + unhealthy);
    return { model: r.model, allocated, total, unhealthy, free: Number(r.free ?? total - allocated - unhealthy) };
  });
}

function gpuBlock(result, samples, reclaimedGpuHours) {
  if (result.err) return section("GPUs", errorBox(result.err, "Cannot load the cluster summary"));
  const summary = result.ok || {};
  const rows = gpuRows(summary);
  const util = mean(samples.map((s) => s.value));
  const total = rows.reduce((a, r) => a + r.total, 0);
  const allocated = rows.reduce((a, r) => a + r.allocated, 0);
  return section(
    "GPUs",
    h(
      "div",
      { class: "stats" },
      stat("Allocated", `${allocated} / ${total}`, "gpus-allocated"),
      stat("Free", String(rows.reduce((a, r) => a + r.free, 0)), "gpus-free"),
      stat("Utilization", util === undefined || util === null ? "n/a" : `${util.toFixed(0)}%`, "gpu-utilization"),
      // Idle workspaces stopped by the idle-GPU policy: the GPU-hours they had held unused.
      stat(
        "GPU-hours reclaimed from idle workspaces",
        reclaimedGpuHours === null ? "n/a" : reclaimedGpuHours.toFixed(1),
        "gpu-hours-reclaimed",
      ),
    ),
    rows.length
      ? table(
          [
            { label: "Model", cell: (r) => r.model },
            { label: "Allocated", cell: (r) => `${r.allocated} / ${r.total}`, class: "num" },
            { label: "Free", cell: (r) => String(r.free), class: "num" },
            { label: "Usage", cell: (r) => usageBar(r.allocated, r.total, `${r.model} GPUs allocated`) },
          ],
          rows,
          { class: "gpu-models" },
        )
      : emptyState("No GPUs are registered."),
  );
}

function stat(label, value, id) {
  return h("div", { class: "stat", id }, h("div", { class: "stat-value" }, value), h("div", { class: "stat-label" }, label));
}

function jobsByStateBlock(result) {
  if (result.err) return section("Jobs by state", errorBox(result.err, "Cannot load the cluster summary"));
  const counts = (result.ok || {}).jobs_by_state || (result.ok || {}).jobs || {};
  return section(
    "Jobs by state",
    h(
      "ul",
      { class: "state-counts" },
      ALL_STATES.map((s) =>
        h("li", {}, link(`/jobs?state=${s}`, stateBadge(s), h("span", { class: "count" }, String(counts[s] ?? 0)))),
      ),
    ),
  );
}

function jobLinkCell(job) {
  return link(`/jobs/${job.id}`, `#${job.id} ${job.name || ""}`);
}

function myJobsBlock(title, result) {
  if (result.err) return section(title, errorBox(result.err));
  const jobs = itemsOf(result.ok);
  if (!jobs.length) return section(title, emptyState("None."));
  return section(
    title,
    table(
      [
        { label: "Job", cell: jobLinkCell },
        { label: "State", cell: (j) => stateBadge(j.state) },
        { label: "GPUs", cell: (j) => String(jobGpus(j) ?? "—"), class: "num" },
        {
          label: "Queue",
          cell: (j) => (j.diagnosis && j.diagnosis.queue_position != null ? `#${j.diagnosis.queue_position}` : "—"),
        },
        { label: "Since", cell: (j) => timeEl(j.updated_at) },
      ],
      jobs,
    ),
  );
}

function alertsBlock(result) {
  if (result.err) return section("Firing alerts", errorBox(result.err, "Cannot load alerts"));
  const firing = itemsOf(result.ok, "alerts").filter(isFiring);
  return section(
    "Firing alerts",
    firing.length ? alertRows(firing.slice(0, 10)) : emptyState("No alerts are firing."),
    firing.length > 10 ? link("/alerts", `All ${firing.length} firing alerts`) : null,
  );
}

// Abnormal: running longer than a day, or holding GPUs at low utilization (where metrics exist).
function abnormalBlock(result, perJobUtil) {
  if (result.err) return section("Abnormal jobs", errorBox(result.err));
  const now = Date.now() / 1000;
  const rows = [];
  for (const job of itemsOf(result.ok)) {
    const attempts = job.attempts || [];
    const last = attempts[attempts.length - 1];
    const since = toDate((last && last.started_at) ?? job.updated_at);
    const runtime = since ? now - since.getTime() / 1000 : null;
    const util = perJobUtil.get(String(job.id));
    const reasons = [];
    if (runtime !== null && runtime > LONG_RUNNING_S) reasons.push(`running ${fmtDuration(runtime)}`);
    if (util !== undefined && util !== null && (jobGpus(job) || 0) > 0 && Number(util) < LOW_UTILIZATION) {
      reasons.push(`GPU utilization ${Number(util).toFixed(0)}%`);
    }
    if (reasons.length) rows.push({ job, runtime, reasons });
  }
  return section(
    "Abnormal jobs",
    h("p", { class: "muted" }, "Running more than a day, or holding GPUs below 10% utilization."),
    rows.length
      ? table(
          [
            { label: "Job", cell: (r) => jobLinkCell(r.job) },
            { label: "User", cell: (r) => r.job.user },
            { label: "GPUs", cell: (r) => String(jobGpus(r.job) ?? "—"), class: "num" },
            { label: "Why", cell: (r) => r.reasons.join("; ") },
          ],
          rows,
          { class: "abnormal" },
        )
      : emptyState("No abnormal jobs."),
  );
}
