"""Sustained API load: job submissions and reads against a real uvicorn server.

    .venv/bin/python -m bench.api_load                       # SQLite under a temp dir
    .venv/bin/python -m bench.api_load --database-url postgresql://user@host:5432/db
    .venv/bin/python -m bench.api_load --postgres      # a throwaway PostgreSQL started here

Open loop: requests are fired on a fixed schedule (not "send the next when the last returned"),
so a slow server shows up as latency instead of silently lowering the offered rate. Latency is
measured from each request's scheduled time, so client-side lag is counted too.

Phases, same server, same run:
1. baseline: `GET /api/v1/me` (routing + token auth + one small query) at the submission rate;
2. load: `POST /api/v1/jobs` at --rate per second, plus reads (`GET /api/v1/jobs` page and
   `GET /api/v1/jobs/{id}`) at --read-rate per second.
Prints per-kind p50/p99 and the ratio to the baseline; the last line is one JSON object with
`requests_per_s` and `p99_ms` (all load-phase requests).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # `python bench/api_load.py` as well as `python -m bench.api_load`
    sys.path.insert(0, str(ROOT))
JOB = {"name": "load", "command": "true", "resources": {"cpus": 0.1, "memory": "64MiB"}}


def app_factory():  # type: ignore[no-untyped-def]  # uvicorn --factory entry point
    from corral.api.app import create_app
    from corral.config import Settings
    from corral.server.run import tune_gc

    app = create_app(Settings())
    tune_gc()  # as `corral up` does (corral.server.run.serve)
    return app


def prepare_database(url: str, home: Path) -> str:
    """Migrate, bootstrap the admin, and register one node (so the fit check really runs)."""
    from corral.config import Settings
    from corral.db.models import Gpu, Node
    from corral.db.session import init_db, make_engine, make_session_factory
    from corral.services.auth import bootstrap_admin

    init_db(url)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    with factory() as db:
        token = bootstrap_admin(db, Settings(home=home, database_url=url))
        if token is None:
            raise SystemExit("the database already has users; give an empty database")

        def bench_node(name: str, gpus: int) -> Node:
            return Node(
                name=name,
                cpus=64,
                memory_mib=512 * 1024,
                state="ready",
                admin_state="none",
                address="127.0.0.1",
                labels={},
                engine="local",
                last_heartbeat=time.time(),
                message="",
                gpus=[
                    Gpu(index=i, uuid=f"GPU-{name}-{i}", model="VGPU", memory_mib=0, healthy=True)
                    for i in range(gpus)
                ],
            )

        node, cpu = bench_node("bench-node", 8), bench_node("bench-cpu", 0)
        db.add_all([node, cpu])
        db.commit()
    engine.dispose()
    return token


@dataclass
class Samples:
    by_kind: dict[str, list[float]] = field(default_factory=dict)
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, kind: str, seconds: float, ok: bool) -> None:
        self.by_kind.setdefault(kind, []).append(seconds * 1000)
        if not ok:
            self.errors[kind] = self.errors.get(kind, 0) + 1

    def all(self) -> list[float]:
        return [x for v in self.by_kind.values() for x in v]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def fire(
    client: aiohttp.ClientSession,
    samples: Samples,
    kind: str,
    scheduled: float,
    method: str,
    url: str,
    **kwargs: Any,
) -> Any:
    """One request; returns the decoded JSON body of a success, else None."""
    body: Any = None
    try:
        async with client.request(method, url, **kwargs) as response:
            ok = response.status < 400
            body = await response.json() if ok else await response.read()
    except (aiohttp.ClientError, TimeoutError):
        ok = False
    samples.add(kind, time.perf_counter() - scheduled, ok)
    return body if ok else None


async def run_phase(base: str, token: str, duration_s: float, plan: list[tuple[str, float]]) -> Samples:
    """`plan`: (kind, rate per second). Each kind gets its own fixed schedule."""
    samples = Samples()
    job_ids: list[int] = []
    # aiohttp, not httpx: at 250 requests/s httpx's async client used most of a core by itself
    # on this 2-core machine, so the measured latency was the client's, not the server's.
    async with aiohttp.ClientSession(
        base_url=base,
        headers={"Authorization": f"Bearer {token}"},
        connector=aiohttp.TCPConnector(limit=256),
        timeout=aiohttp.ClientTimeout(total=30),
    ) as client:
        events = sorted((i / rate, kind) for kind, rate in plan for i in range(int(duration_s * rate)))
        tasks = []
        start = time.perf_counter()
        for offset, kind in events:
            scheduled = start + offset
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, samples, kind, scheduled, job_ids)))
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - start
    samples.by_kind["_elapsed"] = [elapsed]
    return samples


async def one(
    client: aiohttp.ClientSession, samples: Samples, kind: str, scheduled: float, job_ids: list[int]
) -> None:
    if kind == "submit":
        created = await fire(client, samples, kind, scheduled, "POST", "/api/v1/jobs", json=JOB)
        if created is not None:
            job_ids.append(int(created["id"]))
    elif kind == "list":
        await fire(client, samples, kind, scheduled, "GET", "/api/v1/jobs", params={"limit": 50})
    elif kind == "show":
        if not job_ids:  # nothing submitted yet: read the list instead
            await fire(client, samples, kind, scheduled, "GET", "/api/v1/jobs", params={"limit": 1})
            return
        job_id = job_ids[-1]
        await fire(client, samples, kind, scheduled, "GET", f"/api/v1/jobs/{job_id}")
    else:
        await fire(client, samples, kind, scheduled, "GET", "/api/v1/me")


def start_server(url: str, home: Path, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "CORRAL_DATABASE_URL": url, "CORRAL_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env["CORRAL_RATE_SUBMIT_PER_MIN"] = "0"  # one token submits at --rate: measure the API, not the limit
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.api_load:app_factory",
            "--factory",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
            *os.environ.get("BENCH_UVICORN_ARGS", "").split(),
        ],
        cwd=ROOT,
        env=env,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/openapi.json", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the server did not start within 30 s")


def report(name: str, samples: Samples, baseline_p99: float | None) -> None:
    for kind, values in sorted(samples.by_kind.items()):
        if kind.startswith("_"):
            continue
        ratio = f"  ({pct(values, 99) / baseline_p99:.1f}x baseline p99)" if baseline_p99 else ""
        print(
            f"  {name:8} {kind:7} n={len(values):5d}  p50 {pct(values, 50):7.1f} ms"
            f"  p99 {pct(values, 99):7.1f} ms"
            f"  max {max(values):7.1f} ms  errors {samples.errors.get(kind, 0)}{ratio}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--database-url", help="PostgreSQL URL (an empty database); default: SQLite in a temp dir"
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="start a throwaway PostgreSQL server here (Debian's postgresql) and load that",
    )
    parser.add_argument("--rate", type=float, default=200.0, help="job submissions per second")
    parser.add_argument(
        "--read-rate", type=float, default=50.0, help="reads per second (list and show, half each)"
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of load")
    parser.add_argument("--baseline-duration", type=float, default=5.0)
    args = parser.parse_args()

    from tests.support import free_port

    postgres = None
    if args.postgres:
        from tests.pg import PostgresServer, find_pg_bin

        pg_bin = find_pg_bin()
        if pg_bin is None:
            raise SystemExit("--postgres: no PostgreSQL binaries found (apt install postgresql)")
        postgres = PostgresServer(pg_bin)
        postgres.start()
        args.database_url = postgres.create_database()
    try:
        run_load(args, free_port())
    finally:
        if postgres is not None:
            postgres.stop()


def run_load(args: argparse.Namespace, port: int) -> None:
    with tempfile.TemporaryDirectory(prefix="corral-api-load-") as tmp:
        home = Path(tmp)
        url = args.database_url or f"sqlite:///{home / 'corral.db'}"
        token = prepare_database(url, home)
        server = start_server(url, home, port)
        base = f"http://127.0.0.1:{port}"
        proc = psutil.Process(server.pid)
        try:
            asyncio.run(
                run_phase(base, token, 3.0, [("me", 100.0), ("list", 10.0)])
            )  # warm-up: pools, caches
            cpu0 = proc.cpu_times()
            baseline = asyncio.run(run_phase(base, token, args.baseline_duration, [("me", args.rate)]))
            cpu1 = proc.cpu_times()
            client_cpu0 = time.process_time()
            load = asyncio.run(
                run_phase(
                    base,
                    token,
                    args.duration,
                    [("submit", args.rate), ("list", args.read_rate / 2), ("show", args.read_rate / 2)],
                )
            )
            cpu2 = proc.cpu_times()
            client_cpu_s = time.process_time() - client_cpu0
        finally:
            server.terminate()
            server.wait(timeout=10)
    database = "postgresql" if args.database_url else "sqlite"
    load_n = sum(len(v) for k, v in load.by_kind.items() if not k.startswith("_"))
    # Server CPU per request does not depend on how busy the machine is; latency does.
    cpu_base_ms = 1000 * (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / len(baseline.by_kind["me"])
    cpu_load_ms = 1000 * (cpu2.user + cpu2.system - cpu1.user - cpu1.system) / load_n
    baseline_p99 = pct(baseline.by_kind["me"], 99)
    print(
        f"API load on {database}: {args.rate:g} submissions/s + {args.read_rate:g} reads/s "
        f"for {args.duration:g} s"
    )
    report("baseline", baseline, None)
    report("load", load, baseline_p99)
    print(
        f"  server CPU per request: baseline {cpu_base_ms:.2f} ms, load {cpu_load_ms:.2f} ms "
        f"(one core's ceiling: {1000 / cpu_load_ms:.0f} requests/s)  load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} CPUs"
    )
    print(f"  load generator CPU per request: {1000 * client_cpu_s / load_n:.2f} ms")
    values = [v for k, vs in load.by_kind.items() if not k.startswith("_") for v in vs]
    elapsed = load.by_kind["_elapsed"][0]
    submits = load.by_kind.get("submit", [])
    result = {
        "database": database,
        "requests_per_s": round(len(values) / elapsed, 1),
        "submissions_per_s": round(len(submits) / elapsed, 1),
        "target_submissions_per_s": args.rate,
        "p50_ms": round(statistics.median(values), 2),
        "p99_ms": round(pct(values, 99), 2),
        "submit_p99_ms": round(pct(submits, 99), 2),
        "read_p99_ms": round(pct(load.by_kind.get("list", []) + load.by_kind.get("show", []), 99), 2),
        "errors": sum(load.errors.values()),
        "baseline_p99_ms": round(baseline_p99, 2),
        "p99_vs_baseline": round(pct(values, 99) / baseline_p99, 2),
        "target_p99_ms": 50,
        "server_cpu_ms_per_request": round(cpu_load_ms, 2),
        "baseline_server_cpu_ms_per_request": round(cpu_base_ms, 2),
        "client_cpu_ms_per_request": round(1000 * client_cpu_s / load_n, 2),
        "loadavg_1m": round(os.getloadavg()[0], 1),
        "cpus": os.cpu_count(),
    }
    print(
        f"requests/s {result['requests_per_s']}  p99 {result['p99_ms']} ms (target < 50 ms)  "
        f"baseline p99 {result['baseline_p99_ms']} ms"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
