// Usage: GPU-hours and CPU-hours per user or group over a period (GET /usage), as a bar chart
// drawn in inline SVG and a table; CSV download. The API decides who sees what (members their
// own usage, group admins their groups', admins everyone's).

import { get } from "../api.js";
import { downloadText, emptyState, errorBox, fill, fmtTime, h, svgEl, table } from "../ui.js";

const PERIODS = [
  ["7", "Last 7 days"],
  ["30", "Last 30 days"],
  ["90", "Last 90 days"],
];

// Few digits for big numbers, enough for short test jobs (a one-second job is 0.0003 h).
export function fmtHours(value) {
  if (value >= 100) return value.toFixed(0);
  if (value >= 1) return value.toFixed(2);
  return value.toPrecision(2);
}

// Horizontal bars, one per row: GPU-hours, and CPU-hours in a thinner bar below it.
export function usageChart(rows, by) {
  const width = 900;
  const labelW = 160;
  const valueW = 150;
  const rowH = 34;
  const height = Math.max(1, rows.length) * rowH + 24;
  const svg = svgEl("svg", {
    viewBox: `0 0 ${width} ${height}`,
    class: "chart usage-chart",
    role: "img",
    "aria-label": `GPU-hours and CPU-hours per ${by}`,
  });
  const maxGpu = Math.max(0, ...rows.map((r) => r.gpu_hours));
  const maxCpu = Math.max(0, ...rows.map((r) => r.cpu_hours));
  const span = width - labelW - valueW;
  rows.forEach((row, i) => {
    const y = 8 + i * rowH;
    const gpuW = maxGpu > 0 ? (row.gpu_hours / maxGpu) * span : 0;
    const cpuW = maxCpu > 0 ? (row.cpu_hours / maxCpu) * span : 0;
    svg.append(svgEl("text", { x: labelW - 8, y: y + 14, class: "axis", "text-anchor": "end" }, row.name));
    const gpuBar = svgEl("rect", {
      x: labelW, y, width: gpuW.toFixed(1), height: 16, class: "bar-gpu", "data-name": row.name,
      "data-gpu-hours": row.gpu_hours,
    });
    gpuBar.append(svgEl("title", {}, `${row.name}: ${fmtHours(row.gpu_hours)} GPU-hours`));
    const cpuBar = svgEl("rect", {
      x: labelW, y: y + 18, width: cpuW.toFixed(1), height: 6, class: "bar-cpu", "data-name": row.name,
      "data-cpu-hours": row.cpu_hours,
    });
    cpuBar.append(svgEl("title", {}, `${row.name}: ${fmtHours(row.cpu_hours)} CPU-hours`));
    svg.append(gpuBar, cpuBar);
    svg.append(
      svgEl("text", { x: labelW + gpuW + 6, y: y + 13, class: "axis" }, `${fmtHours(row.gpu_hours)} GPU-h`),
    );
  });
  const legendY = height - 6;
  svg.append(svgEl("rect", { x: labelW, y: legendY - 9, width: 12, height: 9, class: "bar-gpu" }));
  svg.append(svgEl("text", { x: labelW + 16, y: legendY, class: "axis" }, "GPU-hours"));
  svg.append(svgEl("rect", { x: labelW + 100, y: legendY - 6, width: 12, height: 6, class: "bar-cpu" }));
  svg.append(svgEl("text", { x: labelW + 116, y: legendY, class: "axis" }, "CPU-hours"));
  return svg;
}

export function toCsv(report) {
  const lines = [[report.by, "gpu_hours", "cpu_hours", "jobs", "attempts"].join(",")];
  for (const r of report.rows) {
    const name = /[",\n]/.test(r.name) ? `"${r.name.replaceAll('"', '""')}"` : r.name;
    lines.push([name, r.gpu_hours.toFixed(4), r.cpu_hours.toFixed(4), r.jobs, r.attempts].join(","));
  }
  return lines.join("\n") + "\n";
}

export async function render(ctx) {
  const period = h("select", { id: "usage-period" }, PERIODS.map(([v, label]) => h("option", { value: v }, label)));
  period.value = ctx.query.get("days") || "30";
  if (!period.value) period.value = "30"; // ?days=abc matched no option: the period was 0 days
  const by = h("select", { id: "usage-by" }, h("option", { value: "user" }, "Users"), h("option", { value: "group" }, "Groups"));
  by.value = ctx.query.get("by") === "group" ? "group" : "user";
  const csvButton = h("button", { type: "button", class: "button subtle", id: "usage-csv", disabled: true }, "Download CSV");
  const body = h("div", { id: "usage-body" });
  ctx.main.append(
    h("h1", {}, "Usage"),
    h(
      "div",
      { class: "toolbar" },
      h("label", { for: "usage-period" }, "Period"),
      period,
      h("label", { for: "usage-by" }, "Per"),
      by,
      csvButton,
    ),
    body,
  );
  let report = null;
  csvButton.addEventListener("click", () => {
    if (report) downloadText(`corral-usage-by-${report.by}.csv`, toCsv(report), "text/csv");
  });
  const refresh = async () => {
    const until = Date.now() / 1000;
    try {
      report = await get("/usage", { since: until - Number(period.value) * 86400, until, by: by.value });
    } catch (err) {
      fill(body, errorBox(err, "Cannot load usage"));
      return;
    }
    if (!ctx.alive()) return;
    csvButton.disabled = !report.rows.length;
    if (!report.rows.length) {
      fill(body, emptyState("No GPU or CPU time was used in this period."));
      return;
    }
    fill(
      body,
      h("p", { class: "muted" }, `From ${fmtTime(report.since)} to ${fmtTime(report.until)}; running jobs count up to now.`),
      usageChart(report.rows, report.by),
      table(
        [
          { label: report.by === "group" ? "Group" : "User", cell: (r) => r.name },
          { label: "GPU-hours", cell: (r) => fmtHours(r.gpu_hours) },
          { label: "CPU-hours", cell: (r) => fmtHours(r.cpu_hours) },
          { label: "Jobs", cell: (r) => String(r.jobs) },
          { label: "Attempts", cell: (r) => String(r.attempts) },
        ],
        [...report.rows, report.total],
        { class: "usage" },
      ),
    );
  };
  period.addEventListener("change", refresh);
  by.addEventListener("change", refresh);
  await refresh();
  ctx.every(30000, refresh);
}
