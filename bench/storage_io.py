"""Storage I/O through a job's bind mount vs the host path, the cost of mounting a dataset of many
files, and dataset upload throughput vs `cp`, all measured in one run.

1. I/O (same worker program both sides, median of --runs interleaved runs, order alternating):
   the worker runs on the host against DIR, and inside the local engine's sandbox (the very
   `bwrap_argv` a job gets, with DIR bound read-write at /data/bench, as a dataset or group dir
   is) against /data/bench. Per run: --small-files 10 KB files written (create+write+close), then
   all flushed (sync) and dropped from the page cache (POSIX_FADV_DONTNEED per file) so both sides
   read them back cold; then one --large-mb file written sequentially in 1 MiB blocks (+fsync),
   dropped from the cache, read back. Figures: small-file write and read IOPS, large write and
   read MB/s, and sandbox/host ratios (target: within 10%, i.e. ratio >= 0.90).
2. Mount: a dataset version of --mount-files files, registered in a database; time of
   `resolve_dataset_ref` (no scan: a row lookup) + starting a sandbox with the version bound
   read-only that lists the mount's top (`ls -f | head`) and exits, vs the same sandbox with an
   empty dir bound. Median of 5.
3. Upload: a --upload-mb dataset (16 files) pushed to a real server (SDK, chunked, checksummed)
   vs `cp -r` of the same directory on the same filesystem; MB/s and the ratio.

    python bench/storage_io.py [--runs 5] [--small-files 2000] [--large-mb 1024]
                               [--mount-files 1000000] [--upload-mb 1024] [--dir DIR]

Last line: one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKER = r"""
import json, os, sys, time
top, small, large_mb, tag = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
work = os.path.join(top, tag)
os.makedirs(work, exist_ok=True)
payload = os.urandom(10 * 1024)
names = [os.path.join(work, f"s{i}") for i in range(small)]
t = time.perf_counter()
for n in names:
    with open(n, "wb") as fh:
        fh.write(payload)
small_write = small / (time.perf_counter() - t)
os.sync()
for n in names:
    fd = os.open(n, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
t = time.perf_counter()
for n in names:
    with open(n, "rb") as fh:
        fh.read()
small_read = small / (time.perf_counter() - t)
big = os.path.join(work, "big")
block = os.urandom(1024 * 1024)
t = time.perf_counter()
with open(big, "wb") as fh:
    for _ in range(large_mb):
        fh.write(block)
    fh.flush(); os.fsync(fh.fileno())
large_write = large_mb / (time.perf_counter() - t)
fd = os.open(big, os.O_RDONLY); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)
t = time.perf_counter()
with open(big, "rb", buffering=0) as fh:
    while fh.read(1024 * 1024):
        pass
large_read = large_mb / (time.perf_counter() - t)
for n in names:
    os.unlink(n)
os.unlink(big)
print(json.dumps({"small_write_iops": small_write, "small_read_iops": small_read,
                  "large_write_mbs": large_write, "large_read_mbs": large_read}))
"""


def sandbox_argv(work: Path, mounts: list[tuple[str, str, bool]], command: str) -> list[str]:
    """What the local engine runs for a job (engine/isolation/sandbox.py), with `mounts` bound."""
    from corral.engine.isolation.sandbox import SandboxSpec, bwrap_argv, write_etc

    etc = write_etc(work / "etc", "bench", os.getuid())
    spec = SandboxSpec(
        command=command,
        work_dir=str(work / "job"),
        uid=os.getuid(),
        etc_files=etc,
        env_paths=sorted({sys.prefix, sys.base_prefix}),
        mounts=mounts,
    )
    (work / "job").mkdir(exist_ok=True)
    return bwrap_argv(shutil.which("bwrap") or "bwrap", shutil.which("setpriv"), spec)


def io_runs(base: Path, args: argparse.Namespace) -> dict[str, float]:
    data = base / "data"
    data.mkdir()
    worker = base / "job-worker.py"
    worker.write_text(WORKER)
    sandbox_work = base / "sandbox"
    sandbox_work.mkdir()
    shutil.copy(worker, sandbox_work / "worker.py")
    host_cmd = [sys.executable, str(worker), str(data), str(args.small_files), str(args.large_mb), "host"]
    inner = f"{sys.executable} /job/worker.py /data/bench {args.small_files} {args.large_mb} sandbox"
    (sandbox_work / "job").mkdir()
    shutil.copy(worker, sandbox_work / "job" / "worker.py")
    box_cmd = sandbox_argv(sandbox_work, [(str(data), "/data/bench", False)], inner)
    results: dict[str, list[dict[str, float]]] = {"host": [], "sandbox": []}
    for run in range(args.runs):
        order = ("host", "sandbox") if run % 2 == 0 else ("sandbox", "host")
        for side in order:
            out = subprocess.run(
                host_cmd if side == "host" else box_cmd, capture_output=True, text=True, check=False
            )
            if out.returncode != 0:
                raise SystemExit(f"{side} worker failed: {out.stderr[-2000:]}")
            results[side].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(
            f"run {run + 1}: host {results['host'][-1]}\n       sandbox {results['sandbox'][-1]}", flush=True
        )
    figures: dict[str, float] = {}
    for key in results["host"][0]:
        host = statistics.median(r[key] for r in results["host"])
        box = statistics.median(r[key] for r in results["sandbox"])
        figures[f"host_{key}"], figures[f"sandbox_{key}"], figures[f"ratio_{key}"] = host, box, box / host
    return figures


def mount_runs(base: Path, files: int) -> dict[str, float]:
    """A version of `files` files registered like a published one, then mounted."""
    from corral.datasets import service
    from corral.datasets.models import Dataset, DatasetVersion
    from corral.datasets.store import Store
    from corral.db.models import User
    from corral.db.session import init_db, make_engine, make_session_factory

    store = Store(base / "storage")
    version_dir = store.version_dir(1, 1)
    version_dir.mkdir(parents=True)
    t = time.perf_counter()
    for i in range(files):
        os.close(os.open(version_dir / f"f{i:07d}", os.O_CREAT | os.O_WRONLY, 0o444))
    print(f"made {files} files in {time.perf_counter() - t:.1f} s (not part of any figure)", flush=True)
    url = f"sqlite:///{base / 'bench.db'}"
    init_db(url)
    factory = make_session_factory(make_engine(url))
    with factory() as db:
        db.add(User(name="u", is_admin=False, created_at=time.time(), active=True))
        db.flush()
        db.add(
            Dataset(name="many", owner_user_id=1, public=False, description="", created_at=0, created_by="u")
        )
        db.flush()
        db.add(DatasetVersion(dataset_id=1, version=1, bytes=0, files=files, digest="0" * 64, source="import",
                              created_at=0, created_by="u"))  # fmt: skip
        db.commit()
    empty = base / "empty"
    empty.mkdir()
    work = base / "mount-sandbox"
    work.mkdir()
    timings: dict[str, list[float]] = {"resolve": [], "mount": [], "empty": []}
    for _ in range(5):
        t = time.perf_counter()
        with factory() as db:
            path, _ = service.resolve_dataset_ref(db, "u", set(), "data/many", store=store)
        timings["resolve"].append(time.perf_counter() - t)
        for key, source in (("mount", path), ("empty", str(empty))):
            argv = sandbox_argv(work, [(source, "/data/many", True)], "ls -f /data/many | head -3 >/dev/null")
            t = time.perf_counter()
            subprocess.run(argv, check=True)
            timings[key].append(time.perf_counter() - t)
    return {
        "mount_files": files,
        "resolve_ms": statistics.median(timings["resolve"]) * 1000,
        "sandbox_with_dataset_ms": statistics.median(timings["mount"]) * 1000,
        "sandbox_with_empty_dir_ms": statistics.median(timings["empty"]) * 1000,
    }


def upload_runs(base: Path, megabytes: int) -> dict[str, float]:
    from corral.sdk import Client
    from tests.server_harness import start_server

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
    t = time.perf_counter()
    subprocess.run(["cp", "-r", str(source), str(base / "cp-dst")], check=True)
    cp_s = time.perf_counter() - t
    server = start_server(
        base / "server-home", extra_env={"CORRAL_STORAGE_ROOT": str(base / "server-storage")}
    )
    try:
        with Client(server.url, server.token, timeout=120) as client:
            t = time.perf_counter()
            client.push_dataset("bench", source)
            push_s = time.perf_counter() - t
    finally:
        server.stop()
    return {
        "upload_mb": total_mb,
        "cp_mbs": total_mb / cp_s,
        "push_mbs": total_mb / push_s,
        "push_vs_cp": cp_s / push_s,
    }


def subdir(base: Path, name: str) -> Path:
    path = base / name
    path.mkdir()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--small-files", type=int, default=2000)
    parser.add_argument("--large-mb", type=int, default=1024)
    parser.add_argument("--mount-files", type=int, default=1_000_000)
    parser.add_argument("--upload-mb", type=int, default=1024)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to work (default: a temp dir under /var/tmp)"
    )
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="corral-storage-bench-", dir=args.dir or "/var/tmp"))
    os.chmod(base, 0o755)
    try:
        figures: dict[str, float] = {"loadavg_1m_at_start": os.getloadavg()[0]}
        figures |= io_runs(subdir(base, "io"), args)
        for key in ("small_write_iops", "small_read_iops", "large_write_mbs", "large_read_mbs"):
            print(f"{key:18} host {figures['host_' + key]:10.1f}  sandbox {figures['sandbox_' + key]:10.1f}  "
                  f"ratio {figures['ratio_' + key]:.3f}", flush=True)  # fmt: skip
        figures |= mount_runs(subdir(base, "mount"), args.mount_files)
        print(f"mount {args.mount_files} files: resolve {figures['resolve_ms']:.2f} ms, sandbox with it "
              f"{figures['sandbox_with_dataset_ms']:.1f} ms vs with an empty dir "
              f"{figures['sandbox_with_empty_dir_ms']:.1f} ms", flush=True)  # fmt: skip
        figures |= upload_runs(subdir(base, "up"), args.upload_mb)
        push, cp = figures["push_mbs"], figures["cp_mbs"]
        print(f"upload {figures['upload_mb']:.0f} MB: push {push:.1f} MB/s, cp {cp:.1f} MB/s "
              f"(push/cp {figures['push_vs_cp']:.3f})", flush=True)  # fmt: skip
        # A shared machine: the load says how far the host/sandbox ratios can be trusted.
        figures["loadavg_1m_at_end"] = os.getloadavg()[0]
        print(f"load average (1 min) at start {figures['loadavg_1m_at_start']:.2f}, "
              f"at end {figures['loadavg_1m_at_end']:.2f}", flush=True)  # fmt: skip
        print(json.dumps({k: round(v, 4) for k, v in figures.items()}))
    finally:
        from corral.datasets.store import remove_tree

        remove_tree(base)


if __name__ == "__main__":
    main()
