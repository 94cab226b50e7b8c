// Job detail: labels, state timeline (events), attempts, why pending, live log tail (polling the
// logs endpoint with offsets), the metrics the job reported (metrics.jsonl), GPU utilization chart
// where monitoring has readings, and cancel / hold / release / clone / download / delete.
// A missing job shows the 404 page, and so does a job the user may not see (the API answers it
// exactly as a missing one), raised by the first GET.

import { ApiError, api, get } from "../api.js";
import { navigate } from "../app.js";
import { gpuUtilization, mean } from "../metrics.js";
import {
  clear,
  fill,
  downloadText,
  emptyState,
  errorBox,
  fmtDuration,
  fmtNumber,
  fmtRelative,
  fmtTime,
  h,
  isTerminal,
  labelChips,
  lineChart,
  messageBox,
  section,
  stateBadge,
  table,
  timeEl,
  toYaml,
  toast,
} from "../ui.js";

const MAX_LOG_CHARS = 256 * 1024; // keep the tail: a chatty job must not slow the page down

export async function render(ctx) {
  const id = ctx.params[0];
  let job = await firstLoad(id); // a 404 becomes the error page (app.js)
  const head = h("div", { class: "page-head" });
  // A refused cancel, hold, release or delete: under the head, which is redrawn every 2 s.
  const message = messageBox("job-message");
  const summary = h("div", {});
  const pending = h("div", {});
  const timeline = h("div", {});
  const attempts = h("div", {});
  const chart = utilizationChart(id);
  const logs = logPanel(ctx, id);
  const outputs = outputsPanel(id);
  const metrics = metricsPanel(id);
  ctx.main.append(head, message.element, summary, pending, h("div", { class: "grid-2" }, timeline, attempts), logs.element, metrics.element, outputs.element, chart.element);

  const draw = () => {
    drawHead(head, job, ctx, message);
    drawSummary(summary, job);
    drawPending(pending, job);
    drawTimeline(timeline, job);
    drawAttempts(attempts, job);
    logs.setAttempts(job);
  };
  draw();
  await Promise.all([logs.poll(), outputs.load(), metrics.load(job.updated_at), isTerminal(job.state) ? null : chart.sample()]);
  ctx.every(2000, async () => {
    const wasTerminal = isTerminal(job.state);
    job = await get(`/jobs/${id}`);
    if (!ctx.alive()) return;
    draw();
    if (!wasTerminal) await Promise.all([logs.poll(), outputs.load()]);
  });
  // The metrics while it runs, and once more after it ended (its last lines).
  ctx.every(5000, () => (isTerminal(job.state) && metrics.loadedAfter(job.updated_at) ? null : metrics.load(job.updated_at)));
  ctx.every(1500, () => (isTerminal(job.state) && logs.done() ? null : logs.poll()));
  ctx.every(3000, () => (isTerminal(job.state) ? null : chart.sample()));
}

// An id no job can have (0, or past the API's 32-bit ids) is a missing job: the 404 page, not the
// API's 422 about the path parameter on the generic error page.
async function firstLoad(id) {
  try {
    return await get(`/jobs/${id}`);
  } catch (err) {
    if (err instanceof ApiError && err.status === 422) throw new ApiError(404, `no job with id ${id}`, err.path);
    throw err;
  }
}

// The head's actions report a refusal in `message` (ui.js messageBox), which the redraw leaves be.
function drawHead(head, job, ctx, message) {
  const cancel = h("button", { type: "button", class: "button danger", id: "cancel-job" }, "Cancel job");
  cancel.addEventListener("click", async () => {
    if (!window.confirm(`Cancel job #${job.id} (${job.name})?`)) return;
    cancel.disabled = true;
    message.clear();
    try {
      await api("POST", `/jobs/${job.id}/cancel`, { json: {} });
      toast(`Job #${job.id} is being cancelled.`, "success");
      const fresh = await get(`/jobs/${job.id}`);
      if (ctx.alive()) Object.assign(job, fresh);
      drawHead(head, job, ctx, message);
    } catch (err) {
      message.show(`Job #${job.id} was not cancelled: ${err.message}`);
      cancel.disabled = false;
    }
  });
  const holding = job.state === "queued" && !job.cancel_requested ? holdButton(head, job, ctx, message) : null;
  const download = h("button", { type: "button", class: "button", id: "download-spec" }, "Download spec");
  download.addEventListener("click", () => downloadText(`job-${job.id}.yaml`, toYaml(job.spec || {}) + "\n"));
  fill(head, 
    h("h1", {}, `#${job.id} ${job.name || ""} `, stateBadge(job.state), job.hold ? h("span", { class: "badge held", id: "held-badge", title: holdTitle(job.hold) }, "held") : null),
    h(
      "div",
      { class: "actions" },
      isTerminal(job.state) || job.cancel_requested ? null : cancel,
      holding,
      h("a", { href: `/submit?clone=${job.id}`, class: "button", id: "clone-job" }, "Clone"),
      download,
      deleteButton(job, ctx, message),
    ),
  );
}

// Hold / Release of a queued job (POST /jobs/{id}/hold|release), as Cancel: the answer's message
// says what was done (or that it already was), and the head is drawn again from a fresh read; a
// refusal (an admin's hold released by its owner, a job placed meanwhile) stays in `message`.
function holdButton(head, job, ctx, message) {
  const release = Boolean(job.hold);
  const label = release ? "Release" : "Hold";
  const button = h("button", { type: "button", class: "button", id: release ? "release-job" : "hold-job" }, label);
  button.addEventListener("click", async () => {
    button.disabled = true;
    message.clear();
    try {
      const done = await api("POST", `/jobs/${job.id}/${release ? "release" : "hold"}`, { json: {} });
      toast(done.message, "success");
      const fresh = await get(`/jobs/${job.id}`);
      if (ctx.alive()) Object.assign(job, fresh);
      drawHead(head, job, ctx, message);
    } catch (err) {
      message.show(`Job #${job.id} was not ${release ? "released" : "held"}: ${err.message}`);
      button.disabled = false;
    }
  });
  return button;
}

// Delete the job and its logs (DELETE /jobs/{id}, as `corral rm`), after a confirmation. Shown for
// live jobs too: the API's refusal (a job that has not ended, one kept for a model, someone else's
// job seen by a group admin) says what to do instead, rather than a button that is just missing.
function deleteButton(job, ctx, message) {
  const button = h("button", { type: "button", class: "button danger", id: "delete-job" }, "Delete");
  button.addEventListener("click", async () => {
    if (!window.confirm(`Delete job #${job.id} (${job.name}) and its logs and outputs? This cannot be undone.`)) return;
    button.disabled = true;
    message.clear();
    try {
      await api("DELETE", `/jobs/${job.id}`);
      toast(`Job #${job.id} deleted.`, "success");
      if (ctx.alive()) navigate("/jobs");
    } catch (err) {
      message.show(`Job #${job.id} was not deleted: ${err.message}`);
      button.disabled = false;
    }
  });
  return button;
}

function holdTitle(hold) {
  return `held by ${hold.by} since ${fmtTime(hold.at)}` + (hold.admin ? " (an admin hold: only an admin can release it)" : "");
}

function drawSummary(root, job) {
  const items = [
    ["User", job.user],
    ["Group", job.group],
    ["Priority", { 0: "low", 1: "normal", 2: "high" }[job.priority] ?? job.priority],
    ["Submitted", fmtTime(job.created_at ?? job.submitted_at)],
    ["Updated", fmtTime(job.updated_at)],
    ["Retries", `${job.retries ?? 0}`],
  ];
  if (job.reason) items.push(["Reason", job.reason]);
  // The spec's `notify`: what was sent is in the timeline ("notify" events) and /notifications.
  const notify = job.spec && job.spec.notify;
  if (notify) items.push(["Notify", `${(notify.on || []).join(", ")} to ${(notify.to || []).join(", ") || "all the owner's contacts"}`]);
  const labels = ["Labels", labelChips(job.labels, (text) => `/jobs?label=${encodeURIComponent(text)}`)];
  fill(root, 
    h(
      "dl",
      { class: "summary card" },
      [...items, labels].map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", { id: k === "Labels" ? "job-labels" : undefined }, v instanceof Node ? v : String(v ?? "—")))),
    ),
  );
}

function drawPending(root, job) {
  const d = job.diagnosis;
  if (!d || isTerminal(job.state) || job.state === "running") {
    clear(root);
    return;
  }
  const reasons = d.reasons || [];
  fill(root, 
    section(
      "Why is it waiting?",
      h(
        "dl",
        { class: "summary", id: "why-pending" },
        h("div", {}, h("dt", {}, "Queue position"), h("dd", { title: "in the order the scheduler takes waiting jobs, fair share included" }, d.queue_position == null ? "—" : `#${d.queue_position}`)),
        h("div", {}, h("dt", {}, "Estimated start"), h("dd", { id: "estimated-start" }, startCell(d))),
        job.runtime_estimate ? h("div", {}, h("dt", {}, "Assumed runtime"), h("dd", {}, runtimeText(job.runtime_estimate))) : null,
        d.unschedulable ? h("div", {}, h("dt", {}, "Schedulable"), h("dd", { class: "bad" }, "no: it cannot fit the cluster as it is")) : null,
      ),
      reasons.length
        ? h("ul", { class: "reasons" }, reasons.map(reasonItem))
        : emptyState("No reason recorded yet; the scheduler looks at it on its next cycle."),
    ),
  );
}

// The scheduler's reason in words, as `corral why` prints it; its code and source (which filter or
// limit said so) only as the tooltip, for whoever reports it. A reason without a message shows its code.
function reasonItem(r) {
  const code = [r.code, r.source].filter(Boolean).join(", ");
  return h("li", { title: code || undefined, "data-code": r.code }, r.message || r.code || "reason");
}

// The estimated start with its uncertainty, or why there is none: `held` (no time by design) is a job
// on hold (reason on_hold) or one held back by its quota or cap; its reasons say which.
function startCell(d) {
  if (d.unschedulable) return "never, as the cluster stands";
  if (d.held && (d.reasons || []).some((r) => r.code === "on_hold")) return h("span", { class: "muted" }, "none while it is held (see below)");
  if (d.held) return h("span", { class: "muted" }, "none while it is held back by its quota or cap (see below)");
  if (d.estimated_start == null) return "unknown";
  const r = d.start_range;
  if (!r || r[1] - r[0] < 60) return timeEl(d.estimated_start);
  return h("span", {}, timeEl(d.estimated_start), h("span", { class: "muted" }, ` (likely ${fmtRelative(r[0])} to ${fmtRelative(r[1])})`));
}

const BASIS = {
  name: "this job name's earlier runs",
  user_size: "the user's jobs of this size",
  group: "the group's jobs",
  cluster: "the cluster's jobs",
  limit: "its max_runtime; no history yet",
};

function runtimeText(e) {
  const spread = e.low_s != null && e.high_s != null && e.high_s > e.low_s ? `, likely ${fmtDuration(e.low_s)} to ${fmtDuration(e.high_s)}` : "";
  return `~${fmtDuration(e.seconds)}${spread} (from ${BASIS[e.basis] || "history"})`;
}

function drawTimeline(root, job) {
  const events = job.events || [];
  // the job's newest events only: a long history (label edits, requeues) says what it leaves out
  const earlier = job.earlier_events || 0;
  fill(root, 
    section(
      "Timeline",
      earlier
        ? h("p", { class: "muted earlier-events" }, `${earlier} earlier event${earlier === 1 ? "" : "s"} not shown: corral events ${job.id} --before ${events[0].id}`)
        : null,
      events.length
        ? h(
            "ol",
            { class: "timeline" },
            events.map((e) =>
              h(
                "li",
                { class: `ev-${e.kind || "event"}` },
                h("time", { datetime: fmtTime(e.at) }, fmtTime(e.at)),
                " ",
                e.to_state ? stateBadge(e.to_state) : h("span", { class: "badge" }, e.kind || "event"),
                e.message ? h("span", { class: "ev-msg" }, ` ${e.message}`) : null,
              ),
            ),
          )
        : emptyState("No events yet."),
    ),
  );
}

function placementNodes(a) {
  if (Array.isArray(a.nodes)) return a.nodes.join(", ");
  return a.node || "—";
}

// [{node, index}] -> "node-a: 0,1 · node-b: 2"
function placementGpus(a) {
  if (!Array.isArray(a.gpus) || !a.gpus.length) return "—";
  const byNode = new Map();
  for (const g of a.gpus) {
    if (!byNode.has(g.node)) byNode.set(g.node, []);
    byNode.get(g.node).push(g.index);
  }
  return Array.from(byNode, ([node, indices]) => `${node}: ${indices.join(",")}`).join(" · ");
}

// The exit-spec's verdict (docs/diagnosis.md): reason code, category, message and the fix.
function attemptReason(a) {
  const f = a.failure;
  if (!f) return [a.reason || "", a.message ? h("div", { class: "muted" }, a.message) : null];
  return [
    h("code", {}, f.reason), h("span", { class: "muted" }, ` (${f.category})`),
    h("div", { class: "failure-message" }, f.message),
    f.evidence ? h("div", { class: "muted failure-evidence" }, h("code", {}, f.evidence)) : null,
    h("div", { class: "failure-fix" }, h("strong", {}, "Fix: "), f.fix),
  ];
}

function drawWatch(job) {
  const w = job.watch;
  if (!w || (!w.suspected_hang && !w.stragglers)) return null;
  return h(
    "div",
    { class: "card watch" },
    w.suspected_hang ? h("p", {}, h("strong", {}, "Suspected hang: "), w.suspected_hang, w.action ? ` (on_hang: ${w.action})` : "") : null,
    w.stragglers ? h("p", {}, h("strong", {}, "Stragglers: "), w.stragglers) : null,
  );
}

function drawAttempts(root, job) {
  const attempts = job.attempts || [];
  fill(root, 
    section(
      "Attempts",
      attempts.length
        ? table(
            [
              { label: "#", cell: (a) => String(a.number) },
              { label: "State", cell: (a) => stateBadge(a.state) },
              { label: "Nodes", cell: placementNodes },
              { label: "GPUs", cell: placementGpus },
              { label: "Started", cell: (a) => timeEl(a.started_at) },
              { label: "Ended", cell: (a) => timeEl(a.ended_at) },
              { label: "Exit", cell: (a) => (a.exit_code == null ? "—" : String(a.exit_code)) },
              { label: "Reason", cell: attemptReason },
            ],
            attempts,
            { class: "attempts" },
          )
        : emptyState("Not started yet."),
    ),
    drawWatch(job),
  );
}

// ---- outputs: the files the job wrote to /outputs (kept after it ends), each a download link ---------

function outputsPanel(jobId) {
  const body = h("div", {});
  const element = section("Outputs", body);
  async function load() {
    let items;
    try {
      items = (await get(`/jobs/${jobId}/outputs`)).items;
    } catch (err) {
      fill(body, errorBox(err, "Outputs unavailable"));
      return;
    }
    const href = (o) => `/api/v1/jobs/${jobId}/outputs/file?path=${encodeURIComponent(o.path)}`;
    fill(
      body,
      items.length
        ? table(
            [
              { label: "File", cell: (o) => h("a", { href: href(o), download: o.path.split("/").pop() }, o.path) },
              { label: "Size", cell: (o) => `${o.size} B` },
              { label: "Modified", cell: (o) => timeEl(o.modified_at) },
            ],
            items,
            { class: "outputs" },
          )
        : emptyState("No files in /outputs yet."),
    );
  }
  return { element, load };
}

// ---- metrics: what the job appended to $CORRAL_OUTPUTS/metrics.jsonl (GET /jobs/{id}/metrics) ------

// One chart per name, over the points' `step` (or, where some point has none, their order).
function metricsPanel(jobId) {
  const body = h("div", { id: "job-metrics" });
  const element = section("Metrics", body);
  let seenFor = null; // the job's updated_at when last read: one more read once it has ended
  async function load(updatedAt) {
    let view;
    try {
      view = await get(`/jobs/${jobId}/metrics`);
    } catch (err) {
      fill(body, errorBox(err, "Metrics unavailable"));
      return;
    }
    seenFor = updatedAt ?? seenFor;
    drawMetrics(body, view);
  }
  return { element, load, loadedAfter: (updatedAt) => seenFor !== null && seenFor === updatedAt };
}

function drawMetrics(body, view) {
  const points = view.points || [];
  if (!points.length) {
    const how = `No metrics reported. A job reports them by appending lines such as {"step": 1, "loss": 0.42} to $CORRAL_OUTPUTS/${view.file || "metrics.jsonl"}.`;
    fill(body, emptyState(how));
    return;
  }
  const bySteps = points.every((p) => p.step !== null && p.step !== undefined);
  const series = new Map(); // name -> [[x, value], ...]
  points.forEach((p, i) => {
    for (const [name, value] of Object.entries(p.values || {})) {
      if (typeof value !== "number" || !Number.isFinite(value)) continue;
      if (!series.has(name)) series.set(name, []);
      series.get(name).push([bySteps ? p.step : i + 1, value]);
    }
  });
  const names = Array.from(series.keys()).sort();
  const notes = [
    view.truncated ? `Only the latest ${points.length} points of a long file.` : null,
    view.skipped ? `${view.skipped} line${view.skipped === 1 ? "" : "s"} skipped (not an object of names to numbers).` : null,
  ].filter(Boolean);
  fill(
    body,
    notes.length ? h("p", { class: "muted", id: "metrics-notes" }, notes.join(" ")) : null,
    h(
      "div",
      { class: "metric-charts" },
      names.map((name) => {
        const line = series.get(name);
        const latest = line[line.length - 1][1];
        return h(
          "figure",
          { class: "metric-chart", "data-metric": name },
          h("h3", {}, `${name} `, h("span", { class: "muted" }, fmtNumber(latest))),
          lineChart([{ name, points: line }], { x: "steps", xLabel: bySteps ? "step" : "point", width: 440, height: 180, label: `${name} of job ${view.job_id}` }),
        );
      }),
    ),
  );
}

// ---- logs -----------------------------------------------------------------------------------------

function logPanel(ctx, jobId) {
  const pre = h("pre", { class: "log", id: "log-output", tabindex: 0, "aria-label": "Log output" });
  const status = h("span", { class: "muted", id: "log-status" }, "");
  const attemptSelect = h("select", { id: "log-attempt" });
  const rankInput = h("input", { id: "log-rank", type: "number", min: 0, value: 0 });
  const follow = h("input", { id: "log-follow", type: "checkbox", checked: true });
  let offset = 0;
  let eof = false;
  let busy = false;
  // Bumped whenever the attempt or rank shown changes. A reply to a request made before that is
  // dropped and the log read again: applied, it would set the new rank's offset and end-of-log
  // from the old one (a finished job's log then stayed empty after a change of rank).
  let generation = 0;
  const restart = () => {
    generation += 1;
    offset = 0;
    eof = false;
    pre.textContent = "";
  };
  const reset = () => {
    restart();
    poll();
  };
  attemptSelect.addEventListener("change", reset);
  rankInput.addEventListener("change", reset);

  async function poll() {
    if (busy || !attemptSelect.value) {
      if (!attemptSelect.value) status.textContent = "No attempt has started yet.";
      return;
    }
    busy = true;
    const asked = generation;
    try {
      const chunk = await get(`/jobs/${jobId}/logs`, { attempt: attemptSelect.value, rank: rankInput.value || 0, offset });
      if (!ctx.alive() || asked !== generation) return;
      if (chunk.data) {
        const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 24;
        let text = pre.textContent + chunk.data;
        if (text.length > MAX_LOG_CHARS) text = "…\n" + text.slice(text.length - MAX_LOG_CHARS);
        pre.textContent = text;
        if (follow.checked && atBottom) pre.scrollTop = pre.scrollHeight;
      }
      offset = chunk.next_offset ?? offset;
      eof = Boolean(chunk.eof);
      status.textContent = eof ? "End of log." : "Following…";
    } catch (err) {
      if (asked !== generation) return;
      if (err instanceof ApiError && err.status === 404) status.textContent = "No log for this attempt and rank yet.";
      else status.textContent = `Cannot read the log: ${err.message}`;
    } finally {
      busy = false;
      if (asked !== generation && ctx.alive()) poll(); // the reset's own read found us busy
    }
  }

  function setAttempts(job) {
    const numbers = (job.attempts || []).map((a) => String(a.number));
    const current = Array.from(attemptSelect.options).map((o) => o.value);
    if (numbers.join(",") === current.join(",")) return;
    const wasLatest = !attemptSelect.value || attemptSelect.value === current[current.length - 1];
    fill(attemptSelect, ...numbers.map((n) => h("option", { value: n }, `attempt ${n}`)));
    if (wasLatest && numbers.length) {
      attemptSelect.value = numbers[numbers.length - 1];
      restart();
    }
  }

  const element = section(
    "Log",
    h(
      "div",
      { class: "toolbar" },
      h("label", { for: "log-attempt" }, "Attempt"),
      attemptSelect,
      h("label", { for: "log-rank" }, "Rank"),
      rankInput,
      h("span", { class: "checkbox" }, follow, h("label", { for: "log-follow" }, "Follow")),
      status,
    ),
    pre,
  );
  return { element, poll, setAttempts, done: () => eof };
}

// ---- GPU utilization chart ----------------------------------------------------------------------

// Samples the job's GPUs from GET /api/v1/gpus while the page is open (each GPU names its job) and draws
// one line per GPU. Monitoring keeps only the latest reading, so the chart starts with the page.
const MAX_POINTS = 360;

function utilizationChart(jobId) {
  const element = h("div", {});
  const series = new Map(); // "node:gpu" -> [[t, value], ...]
  async function sample() {
    let samples = [];
    try {
      samples = (await gpuUtilization()).filter((s) => s.job_id === String(jobId));
    } catch (err) {
      fill(element, section("GPU utilization", errorBox(err, "Cannot read GPU metrics")));
      return;
    }
    const now = Date.now() / 1000;
    for (const s of samples) {
      const key = `${s.node}:${s.gpu}`;
      if (!series.has(key)) series.set(key, []);
      const points = series.get(key);
      points.push([now, s.value]);
      if (points.length > MAX_POINTS) points.shift();
    }
    draw(samples);
  }
  function draw(current) {
    const lines = Array.from(series, ([name, points]) => ({ name: `GPU ${name}`, points }));
    const latest = mean(current.map((s) => s.value));
    fill(element, 
      section(
        "GPU utilization",
        lines.length
          ? [
              h("p", { class: "muted", id: "gpu-util-now" }, latest === null ? "Not holding GPUs now." : `Now: ${latest.toFixed(0)}% mean over ${current.length} GPU${current.length === 1 ? "" : "s"}; sampled while this page is open.`),
              lineChart(lines, { label: `GPU utilization of job ${jobId}` }),
              h("ul", { class: "legend" }, lines.map((s, i) => h("li", { class: `series-${i % 6}` }, s.name))),
            ]
          : emptyState("No GPU metrics for this job: it holds no GPUs right now."),
      ),
    );
  }
  draw([]);
  return { element, sample };
}
