"""Storage I/O through a job's bind mount vs the host path, mounting and listing a dataset of
1,000,000 files, and dataset upload throughput vs `cp`, all measured in one run against a real
Corral server (local engine: bubblewrap, setpriv, cgroups) started by this script.

1. I/O (--parts io). ONE worker program (bench/storage_io_worker.py: same interpreter, same code,
   same sizes) runs the I/O on both sides: on the host against `<storage root>/group/bench`, and
   inside a real job of a member of group `bench` against `/group/bench` (the engine's own bind
   mount of that group dir). The worker times only its I/O loops, never a process start; the host
   side drops to the job's uid, gid and groups first. Page cache: writes are fsynced inside the
   timed region; cold reads start with every file dropped (fsync + POSIX_FADV_DONTNEED) and the
   drop checked with mincore (resident pages reported, must be 0); warm reads re-read the same
   files at once. Each loop is timed by wall clock and by the process's CPU time (the only place a
   bind mount could cost anything is the CPU of the kernel's path walk; CPU time is not inflated
   by waits for the disk or a core on a shared machine). A warm-up pair (full sizes) runs first
   and is not counted; then --runs pairs, interleaved with the order alternating (host, sandbox,
   sandbox, host, ...). For each figure: the median per side, sandbox/host of the medians, and
   the median and range of the per-pair ratios (the two runs of a pair are seconds apart: the
   machine's drift cancels best there).
2. Mount (--parts mount): a dataset `many` whose version 2 is a directory of --mount-files files
   (made in place, registered with its row like a published version: pushing 1,000,000 files is
   not what this measures) and version 1 one file. Median of 5: `GET /datasets` (`corral data
   ls`) and `GET /datasets/many` (`data show`, with its versions), in ms; a job mounting
   `data/many@2` vs one mounting `data/many@1`, each reading the first entry only, submit ->
   succeeded (the request path that would scan, if anything did); and the worker's `list`
   (scandir of the whole directory, dentries warm) in a job vs on the host.
3. Upload (--parts upload): a --upload-mb dataset (16 files) pushed to the server (SDK: chunked,
   checksummed, resumable) vs `cp -r` of the same directory on the same filesystem; MB/s, ratio.

    python bench/storage_io.py [--runs 7] [--small-files 1000] [--large-mb 1024]
                               [--mount-files 1000000] [--upload-mb 1024] [--parts io,mount,upload]
                               [--dir DIR]

Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

if TYPE_CHECKING:
    from corral.sdk import Client
    from tests.server_harness import CorralServer

WORKER = Path(__file__).resolve().with_name("storage_io_worker.py")
GROUP = "bench"
JOB_RESOURCES = {"cpus": 1, "memory": "4GiB"}  # the 1 GiB file's pages fit the job's memory cgroup
IO_FIGURES = (  # rates, wall clock: the sandbox/host ratio must be >= 0.90
    "small_write_iops",
    "small_read_cold_iops",
    "small_read_warm_iops",
    "large_write_mbs",
    "large_read_cold_mbs",
    "large_read_warm_mbs",
)
CPU_FIGURES = (  # the process's CPU time per operation: the sandbox/host ratio must be <= 1.10
    "small_write_cpu_us",
    "small_read_cold_cpu_us",
    "small_read_warm_cpu_us",
    "large_write_cpu_ms_per_gb",
    "large_read_cold_cpu_ms_per_gb",
    "large_read_warm_cpu_ms_per_gb",
)


@dataclass
class Site:
    """The server, a member of group `bench`, and the worker as a `--code` snapshot."""

    server: CorralServer
    user: Client
    code_id: str
    worker_on_host: Path  # the snapshot's own file: the very bytes the job runs from /code
    storage: Path
    drop_to: str = ""  # "uid:gid,groups..." of the job, learnt from the first job

    def in_job(self, args: list[str], mounts: list[dict[str, str]] | None = None) -> dict[str, Any]:
        command = shlex.join([sys.executable, "/code/" + WORKER.name, *args])
        spec: dict[str, Any] = {"name": "storage-io", "command": command, "resources": JOB_RESOURCES}
        if mounts:
            spec["mounts"] = mounts
        job = self.user.submit(spec, code=self.code_id)
        job = self.user.wait(job["id"], timeout_s=900, poll_s=0.1)
        log = self.user.logs(job["id"])["data"]
        if job["state"] != "succeeded":
            raise SystemExit(f"job {job['id']} {job['state']}: {log[-2000:]}")
        result: dict[str, Any] = json.loads(log.strip().splitlines()[-1])
        return result

    def on_host(self, args: list[str]) -> dict[str, Any]:
        argv = [sys.executable, str(self.worker_on_host), *args, "--drop-to", self.drop_to]
        out = subprocess.run(argv, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise SystemExit(f"host worker failed: {out.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        return result


def start_site(base: Path) -> Site:
    from corral.sdk import Client
    from corral.storage.code import snapshot_dir
    from tests.server_harness import start_server

    server = start_server(base / "server-home", allow_unisolated=False)
    admin = Client(server.url, server.token)
    admin.create_group(GROUP)
    admin.create_user("bencher", groups=[GROUP], default_group=GROUP)
    token = admin.create_token("bench", user="bencher")["token"]
    admin.close()
    user = Client(server.url, token, timeout=300)
    code = base / "code"
    code.mkdir()
    shutil.copy(WORKER, code / WORKER.name)
    snapshot = user.upload_code(code)
    storage = server.home / "storage"
    site = Site(server, user, snapshot.id, snapshot_dir(storage, snapshot.id) / WORKER.name, storage)
    first = site.in_job(["list", "/group/" + GROUP])  # the engine makes the group dir at this launch
    site.drop_to = f"{first['uid']}:{','.join(map(str, first['gids']))}"
    return site


def spread(values: list[float]) -> str:
    return f"{min(values):.3f}-{max(values):.3f}"


def io_runs(site: Site, args: argparse.Namespace) -> dict[str, Any]:
    host_top, box_top = str(site.storage / "group" / GROUP), "/group/" + GROUP
    sizes = [str(args.small_files), str(args.large_mb)]
    # Not counted: brings the interpreter, the job path and as much memory as a run needs into use
    # on both sides (on a VM, pages the guest has not touched for a while cost more the first time).
    site.in_job(["io", box_top, "warmup-sandbox", *sizes])
    site.on_host(["io", host_top, "warmup-host", *sizes])
    results: dict[str, list[dict[str, Any]]] = {"host": [], "sandbox": []}
    for run in range(args.runs):
        order = ("host", "sandbox") if run % 2 == 0 else ("sandbox", "host")
        for side in order:
            io = ["io", host_top if side == "host" else box_top, f"{side}-{run}", *sizes]
            results[side].append(site.on_host(io) if side == "host" else site.in_job(io))
        h, s = results["host"][-1], results["sandbox"][-1]
        print(f"run {run + 1} ({order[0]} first), load {os.getloadavg()[0]:.2f}: "
              + ", ".join(f"{k} {h[k]:.0f}/{s[k]:.0f}" for k in IO_FIGURES), flush=True)  # fmt: skip
    return io_figures(results)


def io_figures(results: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    host, box = results["host"], results["sandbox"]
    figures: dict[str, Any] = {
        "host_mount": host[0]["mount"],
        "sandbox_mount": box[0]["mount"],
        "identity_host": [host[0]["uid"], host[0]["gids"]],
        "identity_sandbox": [box[0]["uid"], box[0]["gids"]],
    }
    resident = [
        r[k]
        for r in host + box
        for k in ("small_resident_pages_before_cold_read", "large_resident_pages_before_cold_read")
    ]
    figures["max_resident_pages_before_cold_reads"] = max(resident)  # 0: every cold read was cold
    for key in IO_FIGURES + CPU_FIGURES:
        h = [r[key] for r in host]
        s = [r[key] for r in box]
        pairs = [b / a for a, b in zip(h, s, strict=True)]
        figures[f"host_{key}"] = statistics.median(h)
        figures[f"sandbox_{key}"] = statistics.median(s)
        figures[f"ratio_{key}"] = statistics.median(s) / statistics.median(h)
        figures[f"pair_ratio_median_{key}"] = statistics.median(pairs)
        figures[f"pair_ratio_range_{key}"] = spread(pairs)
        figures[f"host_range_{key}"] = f"{min(h):.4g}-{max(h):.4g}"
        figures[f"sandbox_range_{key}"] = f"{min(s):.4g}-{max(s):.4g}"
    return figures


def print_io(figures: dict[str, Any]) -> None:
    print(f"host side: {figures['host_mount']}, uid/gids {figures['identity_host']}")
    print(f"job side:  {figures['sandbox_mount']}, uid/gids {figures['identity_sandbox']}")
    print(
        "pages resident before any cold read (max over runs):",
        figures["max_resident_pages_before_cold_reads"],
    )
    print(f"{'figure':22} {'host median (range)':>26} {'sandbox median (range)':>26} "
          f"{'ratio':>6} {'pair ratios: median (range)':>28}")  # fmt: skip
    for key in IO_FIGURES + CPU_FIGURES:
        if key == CPU_FIGURES[0]:
            print("CPU time per operation (user + system), cost ratio sandbox/host:")
        h = f"{figures['host_' + key]:.4g} ({figures['host_range_' + key]})"
        s = f"{figures['sandbox_' + key]:.4g} ({figures['sandbox_range_' + key]})"
        pair = f"{figures['pair_ratio_median_' + key]:.3f} ({figures['pair_ratio_range_' + key]})"
        print(f"{key:22} {h:>26} {s:>26} {figures['ratio_' + key]:6.3f} {pair:>28}", flush=True)


def make_many(site: Site, base: Path, files: int) -> Path:
    """Dataset `many`: v1 pushed (one file), v2 a directory of `files` empty files made in place
    and registered with its row, as a published version is (directory 0555, files 0444)."""
    from sqlalchemy import select

    from corral.datasets.models import Dataset, DatasetVersion
    from corral.datasets.store import Store
    from corral.db.session import make_engine, make_session_factory

    one = base / "one"
    one.mkdir()
    (one / "only").write_text("1\n")
    site.user.push_dataset("many", one, group=GROUP)
    factory = make_session_factory(make_engine(site.server.env.get("CORRAL_DATABASE_URL") or
                                               f"sqlite:///{site.server.home / 'corral.db'}"))  # fmt: skip
    with factory() as db:
        dataset = db.scalar(select(Dataset).where(Dataset.name == "many"))
        assert dataset is not None
        version_dir = Store(site.storage).version_dir(dataset.id, 2)
        staged = version_dir.with_name(".bench-v2")
        staged.mkdir()
        t = time.perf_counter()
        for i in range(files):
            os.close(os.open(staged / f"f{i:07d}", os.O_CREAT | os.O_WRONLY, 0o444))
        os.chmod(staged, 0o555)
        staged.rename(version_dir)
        print(f"made {files} files in {time.perf_counter() - t:.1f} s (not part of any figure)", flush=True)
        db.add(DatasetVersion(dataset_id=dataset.id, version=2, bytes=0, files=files, digest="0" * 64,
                              source="import", created_at=time.time(), created_by="bencher"))  # fmt: skip
        db.commit()
    return version_dir


def mount_runs(site: Site, base: Path, files: int) -> dict[str, Any]:
    version_dir = make_many(site, base, files)
    timings: dict[str, list[float]] = {k: [] for k in ("ls", "show", "job_many", "job_one")}
    listing: dict[str, list[dict[str, Any]]] = {"host": [], "sandbox": []}
    for run in range(5):
        for key, path in (
            ("ls", "/datasets"),
            ("show", "/datasets/many"),
        ):
            t = time.perf_counter()
            site.user.request("GET", path)
            timings[key].append(time.perf_counter() - t)
        pair = (
            (("job_many", "2"), ("job_one", "1")) if run % 2 == 0 else (("job_one", "1"), ("job_many", "2"))
        )
        for key, version in pair:
            t = time.perf_counter()
            site.in_job(["peek", "/data/many"], mounts=[{"source": f"data/many@{version}"}])
            timings[key].append(time.perf_counter() - t)
        order = ("host", "sandbox") if run % 2 == 0 else ("sandbox", "host")
        for side in order:
            if side == "host":
                listing[side].append(site.on_host(["list", str(version_dir)]))
            else:
                listing[side].append(site.in_job(["list", "/data/many"], mounts=[{"source": "data/many@2"}]))
    figures: dict[str, Any] = {"mount_files": files}
    figures |= {f"{k}_ms": statistics.median(v) * 1000 for k, v in timings.items()}
    figures |= {f"{k}_range_ms": f"{min(v) * 1000:.0f}-{max(v) * 1000:.0f}" for k, v in timings.items()}
    entries = {r["list_entries"] for r in listing["host"] + listing["sandbox"]}
    assert entries == {files}, f"listed {entries}, made {files}"
    host = [r["list_s"] for r in listing["host"]]
    box = [r["list_s"] for r in listing["sandbox"]]
    figures["host_list_s"], figures["sandbox_list_s"] = statistics.median(host), statistics.median(box)
    figures["ratio_list"] = figures["host_list_s"] / figures["sandbox_list_s"]  # >1 = the job is faster
    figures["pair_ratio_range_list"] = spread([h / b for h, b in zip(host, box, strict=True)])
    host_cpu = [r["list_cpu_s"] for r in listing["host"]]
    box_cpu = [r["list_cpu_s"] for r in listing["sandbox"]]
    figures["host_list_cpu_s"], figures["sandbox_list_cpu_s"] = (
        statistics.median(host_cpu),
        statistics.median(box_cpu),
    )
    return figures


def print_mount(f: dict[str, Any]) -> None:
    print(f"dataset of {f['mount_files']} files: GET /datasets {f['ls_ms']:.1f} ms, /datasets/many "
          f"{f['show_ms']:.1f} ms (with its versions); job submit -> succeeded with "
          f"data/many@2 bound {f['job_many_ms']:.0f} ms ({f['job_many_range_ms']}) vs @1 (one file) "
          f"{f['job_one_ms']:.0f} ms ({f['job_one_range_ms']}); "
          f"scandir of all of it: host {f['host_list_s']:.3f} s, job {f['sandbox_list_s']:.3f} s "
          f"(speed ratio {f['ratio_list']:.3f}, pairs {f['pair_ratio_range_list']}); CPU host "
          f"{f['host_list_cpu_s']:.3f} s, job {f['sandbox_list_cpu_s']:.3f} s", flush=True)  # fmt: skip


def upload_runs(site: Site, base: Path, megabytes: int) -> dict[str, Any]:
    source = base / "upload-src"
    source.mkdir()
    per_file = megabytes * 1024 * 1024 // 16
    block = os.urandom(1024 * 1024)
    for i in range(16):
        with (source / f"part{i:02d}.bin").open("wb") as fh:
            for _ in range(per_file // len(block)):
                fh.write(block)
            fh.write(os.urandom(per_file % len(block)))
    total_mb = sum(p.stat().st_size for p in source.iterdir()) / 1e6
    subprocess.run(["sync"], check=True)  # both start with the source in the page cache, nothing dirty
    t = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(base / "cp-dst")], check=True)
    cp_s = time.perf_counter() - t
    subprocess.run(["sync"], check=True)
    t = time.perf_counter()
    site.user.push_dataset("upload", source, group=GROUP)
    push_s = time.perf_counter() - t
    return {
        "upload_mb": total_mb,
        "cp_mbs": total_mb / cp_s,
        "push_mbs": total_mb / push_s,
        "push_vs_cp": cp_s / push_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="interleaved host/sandbox pairs (>= 5)")
    parser.add_argument("--small-files", type=int, default=1000)
    parser.add_argument("--large-mb", type=int, default=1024, help="MiB of the large file")
    parser.add_argument("--mount-files", type=int, default=1_000_000)
    parser.add_argument("--upload-mb", type=int, default=1024)
    parser.add_argument("--parts", default="io,mount,upload", help="which parts to run (comma-separated)")
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to work (default: a temp dir under /var/tmp)"
    )
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    if parts - {"io", "mount", "upload"}:
        parser.error(f"--parts: unknown {sorted(parts - {'io', 'mount', 'upload'})}; give io, mount, upload")
    base = Path(tempfile.mkdtemp(prefix="corral-storage-bench-", dir=args.dir or "/var/tmp"))
    os.chmod(base, 0o755)
    site = None
    try:
        figures: dict[str, Any] = {"loadavg_at_start": os.getloadavg()}
        site = start_site(base)
        if "io" in parts:
            figures |= io_runs(site, args)
            print_io(figures)
        if "mount" in parts:
            figures |= mount_runs(site, base, args.mount_files)
            print_mount(figures)
        if "upload" in parts:
            figures |= upload_runs(site, base, args.upload_mb)
            push, cp = figures["push_mbs"], figures["cp_mbs"]
            print(f"upload {figures['upload_mb']:.0f} MB: push {push:.1f} MB/s, cp {cp:.1f} MB/s "
                  f"(push/cp {figures['push_vs_cp']:.3f})", flush=True)  # fmt: skip
        # A shared machine: the load says how far the figures can be trusted.
        figures["loadavg_at_end"] = os.getloadavg()
        print(f"load average at start {figures['loadavg_at_start']}, at end {figures['loadavg_at_end']}")
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in figures.items()}))
    finally:
        from corral.datasets.store import remove_tree

        if site is not None:
            site.user.close()
            site.server.stop()
        remove_tree(base)


if __name__ == "__main__":
    main()
