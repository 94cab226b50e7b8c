// The model registry: the models you may read (latest, production version), a model's versions
// (stage, metrics, source job) and one version's lineage and card; promote a version, and
// "fine-tune from" it (the Templates page with the version prefilled as a read-only mount).

import { get, post } from "../api.js";
import { emptyState, errorBox, fill, fmtTime, h, link, section, table, toast } from "../ui.js";

const STAGES = ["none", "staging", "production", "archived"];
const params = () => new URLSearchParams(window.location.search);
const metricsText = (m) => Object.entries(m).map(([k, v]) => `${k}=${v}`).join(", ") || "—";

function lineageBox(model, v) {
  const lin = v.lineage;
  const datasets = lin.datasets.map((d) => `${d.name}@${d.version}`).join(", ") || "none";
  return section(
    `${model}@${v.version} — lineage`,
    h(
      "dl",
      { class: "lineage", id: "model-lineage" },
      h("dt", {}, "Job"),
      h("dd", {}, link(`/jobs/${lin.job_id}`, `job ${lin.job_id} (${lin.job_name})`), ` by ${lin.user} in ${lin.group}`),
      h("dt", {}, "Files"),
      h("dd", {}, `/outputs/${v.source_path} · ${v.files} files · sha256 ${v.digest.slice(0, 16)}`),
      h("dt", {}, "Datasets"),
      h("dd", {}, datasets),
      h("dt", {}, "Environment"),
      h("dd", {}, lin.environment + (lin.environment_version ? `@${lin.environment_version}` : "")),
      h("dt", {}, "Code"),
      h("dd", {}, `${lin.code_snapshot || "—"} · checksum ${lin.code_checksum || "—"}`),
    ),
    h("h3", {}, "Model card"),
    h("pre", { class: "model-card" }, v.card || "(no card)"),
  );
}

function stageControl(model, v, refresh) {
  const select = h("select", { "aria-label": `stage of v${v.version}` }, STAGES.map((s) => h("option", { value: s, selected: s === v.stage }, s)));
  const button = h("button", { type: "button", class: "button subtle" }, "Move");
  button.addEventListener("click", async () => {
    try {
      await post(`/models/${encodeURIComponent(model)}/versions/${v.version}/stage`, { stage: select.value });
      toast(`${model} v${v.version} is now ${select.value}`);
      refresh();
    } catch (err) {
      toast(err.message, "error");
    }
  });
  return h("span", {}, select, " ", button);
}

export async function render(ctx) {
  const list = h("div", { id: "models-list" });
  const detail = h("div", { id: "model-detail" });
  ctx.main.append(h("h1", {}, "Models"), list, detail);
  const refresh = async () => {
    try {
      const rows = await get("/models");
      if (!ctx.alive()) return;
      const columns = [
        { label: "Name", cell: (m) => h("a", { href: `/models?name=${encodeURIComponent(m.name)}` }, m.name) },
        { label: "Latest", cell: (m) => (m.latest ? `v${m.latest}` : "—") },
        { label: "Production", cell: (m) => (m.production ? `v${m.production}` : "—") },
        { label: "Versions", cell: (m) => String(m.versions_count) },
        { label: "Shared", cell: (m) => m.visibility },
        { label: "Owner", cell: (m) => m.owner },
      ];
      fill(list, rows.length ? table(columns, rows) : emptyState("No models yet. Register one with `corral model register`."));
      const name = params().get("name");
      if (!name) return;
      const model = await get(`/models/${encodeURIComponent(name)}`);
      const chosen = Number(params().get("version") || model.latest || 0);
      const version = chosen ? await get(`/models/${encodeURIComponent(name)}/versions/${chosen}`) : null;
      if (!ctx.alive()) return;
      const vcolumns = [
        { label: "Version", cell: (v) => h("a", { href: `/models?name=${encodeURIComponent(name)}&version=${v.version}` }, `v${v.version}`) },
        { label: "Stage", cell: (v) => stageControl(name, v, refresh) },
        { label: "Framework", cell: (v) => v.framework || "—" },
        { label: "Metrics", cell: (v) => metricsText(v.metrics) },
        { label: "Job", cell: (v) => link(`/jobs/${v.source_job_id}`, String(v.source_job_id)) },
        { label: "Created", cell: (v) => `${fmtTime(v.created_at)} by ${v.created_by}` },
        { label: "", cell: (v) => link(`/templates?model=${encodeURIComponent(`${name}@${v.version}`)}`, "Fine-tune from") },
      ];
      fill(
        detail,
        section(`Model ${model.name}`, h("p", {}, model.description || ""), table(vcolumns, model.versions)),
        version ? lineageBox(name, version) : null,
      );
    } catch (err) {
      if (ctx.alive()) fill(detail, errorBox(err, "Cannot load models"));
    }
  };
  await refresh();
}
