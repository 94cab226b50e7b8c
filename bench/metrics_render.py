"""Benchmark: /metrics render time over a large cluster's state.

Seeds SQLite with 1,000 nodes / 8,000 GPUs (with readings) / 10,000 jobs (1,000 running on 4 GPUs
each, 2,500 queued), then times the whole /metrics handler (an in-process HTTP request through
FastAPI: DB read + rendering) and, separately, the read and the render. Baseline measured in the
same run: prometheus-client's own `generate_latest` over the same data through the
`DbStateCollector` (the standard custom-Collector path). Target: under 200 ms per scrape.

    .venv/bin/python bench/metrics_render.py [--nodes 1000 --gpus-per-node 8 --jobs 10000 --repeat 5]
Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the synthetic cluster is test code, under tests/
    sys.path.insert(0, str(ROOT))

from fastapi.testclient import TestClient  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.core import Metric  # noqa: E402

from corral.api.app import create_app  # noqa: E402
from corral.config import Settings  # noqa: E402
from corral.db.session import init_db, make_engine, make_session_factory  # noqa: E402
from corral.monitor.collector import DbStateCollector, read_families, render_text  # noqa: E402
from tests.monitor.synthetic import ClusterShape, seed_cluster  # noqa: E402

TARGET_MS = 200.0


CPU_MS: dict[str, float] = {}


def timed(fn, repeat: int, name: str = "") -> tuple[float, object]:  # type: ignore[no-untyped-def]
    """Median wall ms; the median CPU ms of this process goes to CPU_MS[name] (the dev machine is
    shared, and CPU time is what a scrape costs whatever else runs)."""
    times, cpu, result = [], [], None
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        result = fn()
        times.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - cpu_started) * 1000)
    CPU_MS[name] = statistics.median(cpu)
    return statistics.median(times), result


class _Static:
    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Metric]:
        return self.metrics


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="corral-bench-metrics-"))
    url = f"sqlite:///{tmp / 'corral.db'}"
    init_db(url)
    engine = make_engine(url)
    factory = make_session_factory(engine)
    shape = ClusterShape(
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, jobs=args.jobs, groups=20, users=200
    )
    started = time.perf_counter()
    with factory() as session:
        counts = seed_cluster(session, shape, time.time())
    print(f"seeded {counts} in {time.perf_counter() - started:.1f} s; load average {os.getloadavg()[0]:.1f}")

    app = create_app(Settings(home=tmp, database_url=url), db_engine=engine)
    with TestClient(app) as client:
        client.get("/metrics")  # warm caches and imports
        scrape_ms, response = timed(lambda: client.get("/metrics"), args.repeat, "scrape")
    body = response.text  # type: ignore[attr-defined]

    def read() -> object:
        with factory() as session:
            return read_families(session, time.time(), tmp)

    read_ms, families = timed(read, args.repeat, "read")
    render_ms, _ = timed(lambda: render_text(families), args.repeat, "render")  # type: ignore[arg-type]
    # Baseline: the same samples as prometheus-client Metric objects rendered by generate_latest
    # (the conventional custom-Collector path), timing only the rendering, like render_ms.
    parsed = list(DbStateCollector(factory, tmp).collect())
    registry = CollectorRegistry()
    registry.register(_Static(parsed))
    baseline_ms, _ = timed(lambda: generate_latest(registry), args.repeat, "baseline")

    samples = sum(1 for line in body.splitlines() if line and not line.startswith("#"))
    print(f"/metrics: {len(body) / 1e6:.1f} MB, {samples} samples")
    print(
        f"scrape (HTTP: read + render): {scrape_ms:.0f} ms, median of {args.repeat}; target {TARGET_MS:.0f}"
    )
    print(f"  DB read: {read_ms:.0f} ms, text render: {render_ms:.0f} ms")
    print(
        f"CPU per scrape: {CPU_MS['scrape']:.0f} ms (read {CPU_MS['read']:.0f} render {CPU_MS['render']:.0f})"
    )
    print(
        f"baseline: prometheus-client generate_latest of the same samples: {baseline_ms:.0f} ms (render only)"
    )
    print(f"render speed-up vs baseline: {baseline_ms / render_ms:.1f}x")
    engine.dispose()
    print(
        json.dumps(
            {
                "bench": "metrics_render",
                "nodes": counts["nodes"],
                "gpus": counts["gpus"],
                "jobs": counts["jobs"],
                "samples": samples,
                "bytes": len(body),
                "scrape_ms": round(scrape_ms, 1),
                "scrape_cpu_ms": round(CPU_MS["scrape"], 1),
                "read_ms": round(read_ms, 1),
                "render_ms": round(render_ms, 1),
                "baseline_generate_latest_ms": round(baseline_ms, 1),
                "render_speedup": round(baseline_ms / render_ms, 2),
                "target_ms": TARGET_MS,
                "load_average": round(os.getloadavg()[0], 1),
                "meets_target": scrape_ms < TARGET_MS,
                "cpu_meets_target": CPU_MS["scrape"] < TARGET_MS,
            }
        )
    )


if __name__ == "__main__":
    main()
