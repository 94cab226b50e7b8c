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
from typing import TypedDict

from corral.config import Settings
from corral.db.models import Job
from corral.services.errors import NotFound
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


def read_metrics(settings: Settings, job: Job) -> MetricsView:
    """The job's reported points so far (none yet: an empty list, not an error)."""
    try:
        fd = open_output(settings, job, METRICS_FILE)
    except NotFound:
        return _view(job.id, [], 0, truncated=False)
    with os.fdopen(fd, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        start = max(0, size - MAX_READ_BYTES)
        fh.seek(start)
        data = fh.read(MAX_READ_BYTES)
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
    truncated = start > 0 or len(points) > MAX_POINTS
    return _view(job.id, points[-MAX_POINTS:], skipped, truncated=truncated)


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


def _view(job_id: int, points: list[MetricPoint], skipped: int, *, truncated: bool) -> MetricsView:
    latest: dict[str, float] = {}
    for point in points:
        latest.update(point["values"])
    return {
        "job_id": job_id,
        "file": METRICS_FILE,
        "points": points,
        "latest": latest,
        "skipped": skipped,
        "truncated": truncated,
    }
