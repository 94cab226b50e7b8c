// Datasets: the ones you may read (size, versions, who may read them), a dataset's versions, and
// an upload from the browser: a directory chosen here is checksummed (sha256 per file) and sent in
// chunks over the same resumable protocol as `corral data push` (docs/datasets.md).

import { api, del, get, post } from "../api.js";
import { currentUser } from "../app.js";
import { emptyState, errorBox, fill, fmtTime, h, section, table, toast } from "../ui.js";

export function fmtBytes(n) {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = Number(n || 0);
  let unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0 ? `${value} B` : `${value.toFixed(1)} ${units[unit]}`;
}

const owner = (ds) => (ds.owner.group ? `group ${ds.owner.group}` : `user ${ds.owner.user}`);
const access = (ds) => (ds.public ? "everyone" : ds.shared_with.join(", ") || "—");

async function sha256Hex(blob) {
  const digest = await crypto.subtle.digest("SHA-256", await blob.arrayBuffer());
  return [...new Uint8Array(digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

// The manifest digest (corral.datasets.names.manifest_digest): sha256 of the sorted lines.
async function manifestDigest(entries) {
  const sorted = [...entries].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  const text = sorted.map((e) => `${e.path}\t${e.size}\t${e.sha256}\n`).join("");
  return sha256Hex(new Blob([new TextEncoder().encode(text)]));
}

// The chosen directory's files as {path (without the top folder), size, sha256, file}.
async function scanFiles(fileList, report) {
  const out = [];
  for (const file of fileList) {
    const rel = (file.webkitRelativePath || file.name).split("/").slice(1).join("/") || file.name;
    report(`checksumming ${rel}`);
    out.push({ path: rel, size: file.size, sha256: await sha256Hex(file), file });
  }
  return out;
}

async function upload(name, group, fileList, report) {
  const files = await scanFiles(fileList, report);
  const total = files.reduce((s, f) => s + f.size, 0);
  const digest = await manifestDigest(files);
  const session = await post("/datasets/uploads", { name, group: group || null, bytes: total, files: files.length, digest });
  for (let i = 0; i < files.length; i += 1000) {
    const batch = files.slice(i, i + 1000).map(({ path, size, sha256 }) => ({ path, size, sha256 }));
    await post(`/datasets/uploads/${session.id}/files`, { files: batch });
  }
  const pending = await get(`/datasets/uploads/${session.id}/pending`, { limit: 1000 });
  const byPath = new Map(files.map((f) => [f.path, f]));
  let done = total - pending.reduce((s, p) => s + (p.size - p.received), 0);
  for (const item of pending) {
    const local = byPath.get(item.path);
    for (let offset = item.received; offset < item.size; ) {
      const blob = local.file.slice(offset, offset + session.chunk_bytes);
      await api("PUT", `/datasets/uploads/${session.id}/chunk`, {
        query: { path: item.path, offset },
        text: blob,
        contentType: "application/octet-stream",
      });
      offset += blob.size;
      done += blob.size;
      report(`${fmtBytes(done)} of ${fmtBytes(total)} (${Math.floor((100 * done) / Math.max(total, 1))}%)`, done / Math.max(total, 1));
    }
  }
  return post(`/datasets/uploads/${session.id}/complete`);
}

function uploadForm(onDone) {
  const me = currentUser() || {};
  const status = h("span", { class: "muted", id: "upload-status" });
  const bar = h("progress", { max: 1, value: 0, id: "upload-progress" });
  const groups = (me.groups || []).map((g) => g.name);
  const form = h(
    "form",
    { class: "form", id: "upload-form" },
    h("label", {}, "Name ", h("input", { name: "name", required: true, pattern: "[A-Za-z0-9][A-Za-z0-9._-]{0,63}" })),
    h(
      "label",
      {},
      "Owner ",
      h("select", { name: "group" }, h("option", { value: "" }, "me"), groups.map((g) => h("option", { value: g }, `group ${g}`))),
    ),
    h("label", {}, "Directory ", h("input", { name: "dir", type: "file", webkitdirectory: true, multiple: true, required: true })),
    h("button", { type: "submit", class: "button" }, "Upload"),
    bar,
    status,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const data = new FormData(form);
    const report = (text, fraction) => {
      status.textContent = text;
      if (fraction !== undefined) bar.value = fraction;
    };
    try {
      const version = await upload(String(data.get("name")), String(data.get("group")), form.elements.dir.files, report);
      report(`v${version.version}: ${version.files} files, ${fmtBytes(version.bytes)}`, 1);
      toast(`Dataset ${version.name} v${version.version} uploaded`);
      onDone();
    } catch (err) {
      report(`failed: ${err.message} (upload again: it resumes)`);
    }
  });
  return section("Upload a new dataset or version", h("p", { class: "muted" }, "Checksummed and sent in chunks; an interrupted upload resumes when started again with the same files."), form);
}

function versionsTable(ds, refresh) {
  return table(
    [
      { label: "Version", cell: (v) => `v${v.version}` },
      { label: "Size", cell: (v) => fmtBytes(v.bytes) },
      { label: "Files", cell: (v) => String(v.files) },
      { label: "Digest", cell: (v) => h("code", {}, v.digest.slice(0, 16)) },
      { label: "Created", cell: (v) => `${fmtTime(v.created_at)} by ${v.created_by}` },
      {
        label: "",
        cell: (v) =>
          h(
            "button",
            {
              type: "button",
              class: "button subtle",
              onclick: async () => {
                try {
                  await del(`/datasets/${ds.name}/versions/${v.version}`);
                  toast(`Deleted ${ds.name} v${v.version}`);
                  refresh();
                } catch (err) {
                  toast(err.message, "error");
                }
              },
            },
            "Delete",
          ),
      },
    ],
    ds.versions,
  );
}

export async function render(ctx) {
  const list = h("div", { id: "datasets-list" });
  const detail = h("div", { id: "dataset-detail" });
  const selected = () => new URLSearchParams(window.location.search).get("name");
  const showDetail = async (name) => {
    if (!name) return fill(detail);
    try {
      const ds = await get(`/datasets/${encodeURIComponent(name)}`);
      if (!ctx.alive()) return;
      fill(
        detail,
        section(
          `Dataset ${ds.name}`,
          h("p", {}, `Owner: ${owner(ds)} · readable by: ${access(ds)} · ${fmtBytes(ds.bytes)} in ${ds.versions_count} version${ds.versions_count === 1 ? "" : "s"}`),
          h("p", { class: "muted" }, `In a job: mounts: data/${ds.name} (latest) or data/${ds.name}@N (read-only)`),
          ds.versions.length ? versionsTable(ds, refresh) : emptyState("No versions."),
        ),
      );
    } catch (err) {
      if (ctx.alive()) fill(detail, errorBox(err, `Cannot load dataset ${name}`));
    }
  };
  const refresh = async () => {
    try {
      const rows = await get("/datasets");
      if (!ctx.alive()) return;
      const columns = [
        { label: "Name", cell: (d) => h("a", { href: `/data?name=${encodeURIComponent(d.name)}` }, d.name) },
        { label: "Owner", cell: owner },
        { label: "Latest", cell: (d) => (d.latest ? `v${d.latest}` : "—") },
        { label: "Versions", cell: (d) => String(d.versions_count) },
        { label: "Size", cell: (d) => fmtBytes(d.bytes) },
        { label: "Files", cell: (d) => String(d.files) },
        { label: "Readable by", cell: access },
      ];
      fill(list, rows.length ? table(columns, rows) : emptyState("No datasets you may read yet."));
      await showDetail(selected());
    } catch (err) {
      if (ctx.alive()) fill(list, errorBox(err, "Cannot load datasets"));
    }
  };
  ctx.main.append(h("h1", {}, "Data"), list, detail, uploadForm(refresh));
  await refresh();
  ctx.every(15000, refresh);
}
