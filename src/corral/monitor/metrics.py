"""Process-level metrics other parts of Corral report into, in Corral's own registry.

The control loops report the scheduler through `record_scheduler_cycle(seconds, placements)` (or
the objects directly: `SCHEDULER_CYCLE_SECONDS.observe(s)`, `PLACEMENTS_TOTAL.inc(n)`) and each
engine launch's time (`ENGINE_LAUNCH_SECONDS`, server.dispatch); the API
middleware (corral.monitor.middleware) reports requests. Everything derived from the database
(nodes, GPUs, jobs, queues, quotas) is rendered by corral.monitor.collector at scrape time instead.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

SCHEDULER_CYCLE_SECONDS = Histogram(
    "corral_scheduler_cycle_seconds",
    "Wall time of one scheduling cycle (snapshot, schedule, apply).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)
PLACEMENTS_TOTAL = Counter(
    "corral_scheduler_placements",
    "Jobs placed by the scheduler (one per job and attempt).",
    registry=REGISTRY,
)
PREEMPTIONS_TOTAL = Counter(
    "corral_scheduler_preemptions",
    "Jobs preempted by the scheduler.",
    registry=REGISTRY,
)
SCHEDULER_LAST_CYCLE = Gauge(
    "corral_scheduler_last_cycle_timestamp_seconds",
    "Unix time the last scheduling cycle of this process finished (0: none yet).",
    registry=REGISTRY,
)

ENGINE_LAUNCH_SECONDS = Histogram(
    "corral_engine_launch_duration_seconds",
    "Wall time of one engine launch call (one attempt handed to the engine: the local engine "
    "starting its processes, Slurm's sbatch), by engine; refused and failed calls included.",
    ["engine"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=REGISTRY,
)

API_REQUEST_SECONDS = Histogram(
    "corral_api_request_duration_seconds",
    "Latency of API requests by method and route template.",
    ["method", "route"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)
API_REQUESTS_TOTAL = Counter(
    "corral_api_requests",
    "API requests by method, route template and status code.",
    ["method", "route", "status"],
    registry=REGISTRY,
)
API_ERRORS_TOTAL = Counter(
    "corral_api_request_errors",
    "API requests that failed on the server side (status 5xx, or an unhandled exception).",
    ["method", "route", "status"],
    registry=REGISTRY,
)

JOB_FAILURES_TOTAL = Counter(
    "corral_job_failures",
    "Attempts that ended badly, by the exit-spec's reason and the failing rank's node "
    "(corral.diagnosis; this process's count since it started).",
    ["reason", "node"],
    registry=REGISTRY,
)

METRICS_RENDER_SECONDS = Gauge(
    "corral_metrics_render_seconds",
    "Time the previous /metrics scrape took to read the database and render.",
    registry=REGISTRY,
)


def record_scheduler_cycle(seconds: float, placements: int = 0, preemptions: int = 0) -> None:
    """One call per finished scheduling cycle (the schedule loop calls this)."""
    SCHEDULER_CYCLE_SECONDS.observe(seconds)
    if placements:
        PLACEMENTS_TOTAL.inc(placements)
    if preemptions:
        PREEMPTIONS_TOTAL.inc(preemptions)
    SCHEDULER_LAST_CYCLE.set(time.time())
