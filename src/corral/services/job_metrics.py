"""A job's reported metrics (GET /jobs/{id}/metrics, SDK `metrics`, `corral metrics`): what the
job appended to `$CORRAL_OUTPUTS/metrics.jsonl`, one JSON object per line,

    {"step": 3, "loss": 0.41, "accuracy": 0.88}

names to numbers, with an optional whole-number `step` (0 to 2**53). The file is in the job's outputs dir on
the storage root, which the server reads on both engines (as `corral job outputs` does; on Slurm
the root is shared by every node), so the metrics are read while the job runs and after it ended,
until the job is deleted. It is opened like any output file (services.storage.open_output: no
symlink followed). Only the last MAX_READ_BYTES are read: a job that reports every step for days
still answers at once, with its latest points.

Lines that are not such an object are skipped and counted, never an error: a line the job is
still writing (no newline yet) is left for the next read, and a job's stray print must not hide
its other points from the tool that stops the worst trials early."""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from typing import TypedDict

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import Job
from corral.services.auth import Principal
from corral.services.errors import NotFound
from corral.services.jobs import JobFilter, matching_ids
from corral.services.storage import open_output

METRICS_FILE = "metrics.jsonl"
MAX_READ_BYTES = 4 << 20
MAX_POINTS = 10_000
MAX_NAMES_PER_POINT = 64
MAX_STEP = 2**53  # exact in every JSON reader
METRIC_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_./-]{0,63}$")


class MetricPoint(TypedDict):
    step: int | None
    values: dict[str, float]


class MetricsView(TypedDict):
    job_id: int
    file: str  # where the job writes them, under $CORRAL_OUTPUTS
    points: list[MetricPoint]  # oldest first; at most MAX_POINTS, the latest
    latest: dict[str, float]  # each name's last value
    skipped: int  # lines that were no object of names to numbers
    truncated: bool  # the file was longer than what was read: only its latest points


def read_metrics(
    settings: Settings, job: Job, *, tail: int = MAX_POINTS, window: int = MAX_READ_BYTES
) -> MetricsView:
    """The job's reported points so far (none yet: an empty list, not an error): the last
    `tail` points of the file's last `window` bytes; `latest` over those bytes."""
    try:
        fd = open_output(settings, job, METRICS_FILE)
    except NotFound:
        return _view(job.id, [], 0, truncated=False)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - window)
        fh.seek(start)
        data = fh.read(window)
    lines = data.split(b"\n")
    lines.pop()  # after the last newline: empty, or a line still being written
    if start > 0 and lines:
        lines.pop(0)  # cut by the seek
    points: list[MetricPoint] = []
    skipped = 0
    for line in lines:
        if not line.strip():
            continue
        point = parse_point(line)
        if point is None:
            skipped += 1
        else:
            points.append(point)
    latest = _latest(points)  # of every point read, also those before the tail
    truncated = start > 0 or len(points) > tail
    return _view(job.id, points[-tail:], skipped, truncated=truncated, latest=latest)


def parse_point(line: bytes) -> MetricPoint | None:
    """One line as a point: a JSON object of metric names to finite numbers (booleans are no
    numbers), with an optional whole-number `step`; None when it is not one."""
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or len(data) > MAX_NAMES_PER_POINT + 1:
        return None
    step = data.pop("step", None)
    whole = isinstance(step, int) and not isinstance(step, bool)
    if step is not None and not (whole and 0 <= step <= MAX_STEP):
        return None
    values: dict[str, float] = {}
    for name, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not METRIC_NAME_RE.match(name):
            return None
        if not math.isfinite(value):
            return None
        values[name] = float(value)
    if not values:
        return None
    return {"step": step, "values": values}


def _latest(points: list[MetricPoint]) -> dict[str, float]:
    latest: dict[str, float] = {}
    for point in points:
        latest.update(point["values"])
    return latest


def _view(
    job_id: int,
    points: list[MetricPoint],
    skipped: int,
    *,
    truncated: bool,
    latest: dict[str, float] | None = None,
) -> MetricsView:
    return {
        "job_id": job_id,
        "file": METRICS_FILE,
        "points": points,
        "latest": _latest(points) if latest is None else latest,
        "skipped": skipped,
        "truncated": truncated,
    }


# Many jobs' metrics in one request (GET /jobs/metrics: the trials of an experiment, compared
# by an early-stopping rule each round): a page of jobs, each read over a smaller window.
MANY_MAX_JOBS = 500
MANY_WINDOW_BYTES = 128 << 10
MANY_DEFAULT_TAIL = 100


class JobMetricsItem(MetricsView):
    state: str
    labels: Mapping[str, str]


class ManyMetricsView(TypedDict):
    items: list[JobMetricsItem]
    total: int
    limit: int
    offset: int


def read_many(
    session: Session, principal: Principal, settings: Settings, flt: JobFilter, tail: int
) -> ManyMetricsView:
    """The metrics of a page of the visible jobs under `flt` (by id, oldest first; at most
    MANY_MAX_JOBS), each its last `tail` points from the last MANY_WINDOW_BYTES of its file."""
    ids = matching_ids(session, principal, flt)
    page = ids[flt.offset : flt.offset + flt.limit]
    rows = session.scalars(select(Job).where(Job.id.in_(page)).order_by(Job.id)).all() if page else []
    items: list[JobMetricsItem] = []
    for job in rows:
        read = read_metrics(settings, job, tail=tail, window=MANY_WINDOW_BYTES)
        items.append({**read, "state": job.state, "labels": job.spec.labels})
    return {"items": items, "total": len(ids), "limit": flt.limit, "offset": flt.offset}
