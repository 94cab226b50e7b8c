// GPU utilization from Corral's Prometheus exposition (`GET /metrics`, a public endpoint of the
// server): the GPU gauges carry node, gpu, model, job_id, user and group labels. The portal keeps
// no history of its own beyond the samples it has seen while a page is open.

const SAMPLE_RE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+\d+)?$/;
const LABEL_RE = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

export function parseExposition(text, wanted) {
  const samples = [];
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#") || !line.startsWith(wanted)) continue;
    const m = SAMPLE_RE.exec(line.trim());
    if (!m || m[1] !== wanted) continue;
    const labels = {};
    for (const lm of (m[3] || "").matchAll(LABEL_RE)) labels[lm[1]] = lm[2].replace(/\\(.)/g, "$1");
    const value = Number(m[4]);
    if (Number.isFinite(value)) samples.push({ labels, value });
  }
  return samples;
}

async function exposition() {
  const response = await fetch("/metrics", { credentials: "same-origin", headers: { Accept: "text/plain" } });
  return response.ok ? response.text() : "";
}

// GPUs held now per group and GPU model, from corral_gpu_allocated{group, model}: Map group -> {model: n}.
export async function gpusInUseByGroup() {
  const usage = new Map();
  for (const s of parseExposition(await exposition(), "corral_gpu_allocated")) {
    if (s.value <= 0 || !s.labels.group) continue;
    if (!usage.has(s.labels.group)) usage.set(s.labels.group, {});
    const byModel = usage.get(s.labels.group);
    byModel[s.labels.model || "*"] = (byModel[s.labels.model || "*"] || 0) + 1;
  }
  return usage;
}

// [{node, gpu, job_id, value}] of corral_gpu_utilization_percent, or [] when not exported.
export async function gpuUtilization() {
  return parseExposition(await exposition(), "corral_gpu_utilization_percent").map((s) => ({
    node: s.labels.node,
    gpu: s.labels.gpu,
    job_id: s.labels.job_id || "",
    value: s.value,
  }));
}

// GPU-hours that idle stops reclaimed from workspaces (corral_workspace_gpu_hours_reclaimed_total,
// one counter per group), summed over the groups; null when the server does not export it.
export async function gpuHoursReclaimed() {
  const samples = parseExposition(await exposition(), "corral_workspace_gpu_hours_reclaimed_total");
  return samples.length ? samples.reduce((a, s) => a + s.value, 0) : null;
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
