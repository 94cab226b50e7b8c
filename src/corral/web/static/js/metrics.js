// GPU use from the API (`GET /api/v1/gpus`, signed in): each GPU's latest reading, with the job
// and group holding it where the caller may see them (a job id only for a job the caller may see,
// a group only to its members). Not `/metrics`: that needs the scrape token where one is set
// (always on Slurm). The portal keeps no history of its own beyond the samples it has seen while a
// page is open. One request serves every caller of the same moment (the dashboard asks twice).

import { get } from "./api.js";

let pending = null;

function usage() {
  if (!pending) {
    pending = get("/gpus").finally(() => {
      pending = null;
    });
  }
  return pending;
}

// GPUs held now per group and GPU model: Map group -> {model: n}, for the groups the caller is in.
export async function gpusInUseByGroup() {
  const counts = new Map();
  for (const g of (await usage()).gpus) {
    if (!g.allocated || !g.group) continue;
    if (!counts.has(g.group)) counts.set(g.group, {});
    const byModel = counts.get(g.group);
    byModel[g.model || "*"] = (byModel[g.model || "*"] || 0) + 1;
  }
  return counts;
}

// [{node, gpu, job_id, value}]: every GPU with a reading; job_id "" when free or not the caller's to see.
export async function gpuUtilization() {
  return (await usage()).gpus
    .filter((g) => g.utilization_percent !== null)
    .map((g) => ({
      node: g.node,
      gpu: String(g.gpu),
      job_id: g.job_id === null ? "" : String(g.job_id),
      value: g.utilization_percent,
    }));
}

// GPU-hours that idle stops reclaimed from workspaces, all groups.
export async function gpuHoursReclaimed() {
  return (await usage()).workspace_gpu_hours_reclaimed;
}

export function mean(values) {
  return values.length ? values.reduce((a, b) => a + b, 0) / values.length : null;
}

// Mean utilization per job id over the GPUs it holds.
export function utilizationByJob(samples) {
  const byJob = new Map();
  for (const s of samples) {
    if (!s.job_id) continue;
    if (!byJob.has(s.job_id)) byJob.set(s.job_id, []);
    byJob.get(s.job_id).push(s.value);
  }
  return new Map(Array.from(byJob, ([job, values]) => [job, mean(values)]));
}
