"""Submit -> running latency and completed jobs per second, Corral vs plain `subprocess`.

Starts a real Corral server (temp home, SQLite unless --database-url, the local engine), submits
N trivial jobs (`true`, 0.01 CPU, 16 MiB) through the REST API at a steady rate, and measures for
each job the time from just before its POST to the moment its process started (the attempt's
`started_at` reported by the engine), and jobs completed per second (N over first submit to last
finish). Then it starts the same commands with plain `subprocess.Popen` at the same rate: the floor.

    python bench/job_latency.py [--jobs 500] [--rate 60] [--engine local|slurm] [--no-isolation]

The last line is one JSON object: submit_to_running_p50_ms, submit_to_running_p99_ms, jobs_per_s
and the same keys prefixed `baseline_`. Targets: p99 < 300 ms, >= 50 jobs/s completed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

COMMAND = "true"
SPEC = {"cpus": 0.01, "memory": "16MiB", "gpus": 0}


@dataclass
class Result:
    latencies_s: list[float]
    jobs_per_s: float
    wall_s: float
    failed: int = 0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    k = max(0, min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


def paced(n: int, rate: float, fn: Any, workers: int = 8) -> list[Any]:
    """Call fn(i, planned_time) for i in range(n), the i-th at start + i / rate (rate 0: at once)."""
    start = time.time() + 0.05
    with ThreadPoolExecutor(workers) as pool:
        futures = []
        for i in range(n):
            planned = start + (i / rate if rate > 0 else 0.0)
            delay = planned - time.time()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(fn, i, planned))
        return [f.result() for f in futures]


def run_corral(args: argparse.Namespace) -> Result:
    from corral.server.launcher import start_server

    env = {"CORRAL_LOG_LEVEL": "INFO"}
    if args.no_isolation:
        env["CORRAL_ISOLATION"] = "false"
    if args.engine != "local":
        raise SystemExit(f"--engine {args.engine}: not supported by this benchmark yet (use local)")
    home = Path(tempfile.mkdtemp(prefix="corral-bench-"))
    srv = start_server(home / "home", database_url=args.database_url, virtual_gpus=0, extra_env=env)
    try:
        local = threading.local()

        def client() -> httpx.Client:
            if not hasattr(local, "c"):
                local.c = srv.client(timeout=30.0)
            return local.c

        def submit(i: int, _planned: float) -> tuple[int, float]:
            spec = {"name": f"bench-{i}", "tasks": {"main": {"command": COMMAND, "resources": SPEC}}}
            t0 = time.time()
            r = client().post("/api/v1/jobs", json=spec)
            r.raise_for_status()
            return int(r.json()["id"]), t0

        submitted = paced(args.jobs, args.rate, submit)
        first = min(t for _, t in submitted)
        with srv.client(timeout=30.0) as c:
            deadline = time.time() + args.timeout
            while time.time() < deadline:
                r = c.get("/api/v1/jobs", params={"state": "queued,scheduled,starting,running", "limit": 1})
                if r.json()["total"] == 0:
                    break
                time.sleep(0.2)
            jobs = [c.get(f"/api/v1/jobs/{job_id}").json() for job_id, _ in submitted]
        latencies, failed, last_end = [], 0, first
        for (_, t0), job in zip(submitted, jobs, strict=True):
            attempt = job["attempts"][-1] if job["attempts"] else None
            if job["state"] != "succeeded" or attempt is None or attempt["started_at"] is None:
                failed += 1
                continue
            latencies.append(attempt["started_at"] - t0)
            last_end = max(last_end, job["finished_at"] or attempt["ended_at"])
        done = args.jobs - failed
        import psutil

        cpu = psutil.Process(srv.pid).cpu_times()
        print(
            f"corral server process CPU: {cpu.user + cpu.system:.1f} s "
            f"({1000 * (cpu.user + cpu.system) / args.jobs:.1f} ms per job)"
        )
        return Result(latencies, done / max(1e-9, last_end - first), last_end - first, failed)
    finally:
        srv.stop()
        print("\n".join(line.split(": ", 1)[-1] for line in srv.log_text().splitlines() if ": loop " in line))
        shutil.rmtree(home, ignore_errors=True)


def run_baseline(args: argparse.Namespace) -> Result:
    ends: list[float] = []
    lock = threading.Lock()

    def start(_i: int, _planned: float) -> float:
        t0 = time.time()
        proc = subprocess.Popen(["/bin/sh", "-c", COMMAND])
        started = time.time()

        def reap() -> None:
            proc.wait()
            with lock:
                ends.append(time.time())

        threading.Thread(target=reap, daemon=True).start()
        return started - t0

    first = time.time()
    latencies = paced(args.jobs, args.rate, start)
    while len(ends) < args.jobs:
        time.sleep(0.01)
    wall = max(ends) - first
    return Result(latencies, args.jobs / wall, wall)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--rate", type=float, default=60.0, help="submissions per second (0: all at once)")
    parser.add_argument("--engine", choices=("local", "slurm"), default="local")
    parser.add_argument("--no-isolation", action="store_true", help="run jobs without sandbox/cgroups")
    parser.add_argument("--database-url", default=None, help="default: SQLite in a temp home")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for all jobs")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")

    corral = run_corral(args)
    base = run_baseline(args)
    out: dict[str, Any] = {
        "jobs": args.jobs,
        "rate": args.rate,
        "engine": args.engine,
        "isolation": not args.no_isolation,
        "failed": corral.failed,
    }
    for prefix, res in (("", corral), ("baseline_", base)):
        out[f"{prefix}submit_to_running_p50_ms"] = round(1000 * statistics.median(res.latencies_s), 2)
        out[f"{prefix}submit_to_running_p99_ms"] = round(1000 * percentile(res.latencies_s, 99), 2)
        out[f"{prefix}jobs_per_s"] = round(res.jobs_per_s, 2)
    print(f"{'':24}{'corral':>12}{'subprocess':>12}{'ratio':>8}")
    for key, label in (
        ("submit_to_running_p50_ms", "submit->running p50 ms"),
        ("submit_to_running_p99_ms", "submit->running p99 ms"),
        ("jobs_per_s", "jobs/s completed"),
    ):
        a, b = out[key], out[f"baseline_{key}"]
        print(f"{label:24}{a:>12.2f}{b:>12.2f}{(a / b if b else float('nan')):>8.1f}")
    print(
        f"corral: {args.jobs - corral.failed}/{args.jobs} succeeded in {corral.wall_s:.1f} s; "
        f"targets: p99 < 300 ms, >= 50 jobs/s"
    )
    print(json.dumps(out))
    return 0 if corral.failed == 0 else 1


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    sys.exit(main())
