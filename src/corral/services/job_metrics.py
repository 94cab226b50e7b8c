"""A job's reported metrics (GET /jobs/{id}/metrics, SDK `metrics`, `corral metrics`): what the
job appended to `$CORRAL_OUTPUTS/metrics.jsonl`, one JSON object per line,

    {"step": 3, "loss": 0.41, "accuracy": 0.88}

names to numbers, with an optional whole-number `step` (0 to 2**53). The file is in the job's outputs dir on
the storage root, which the server reads on both engines (as `corral job outputs` does; on Slurm
the root is shared by every node), so the metrics are read while the job runs and after it ended,
until the job is deleted. It is opened like any output file (services.storage.open_output: no
symlink followed).

A read costs what `tail` asks, not what the file holds: the file is read backwards from its end
in blocks, and stops once it has `tail` points (and at least LATEST_POINTS, for `latest`), after
at most `window` bytes, or after SKIP_LINES lines that are no point; a line longer than any point
can be is skipped unparsed. A job that reports every step for days, or writes junk on purpose,
still answers at once with its latest points (GET /jobs/metrics, many jobs a page, has its own,
smaller caps). An outputs dir the server cannot read (EACCES, a stale NFS handle) gives that job
an `error`, not a failed request.

Lines that are not such an object are skipped and counted, never an error: a line the job is
still writing (no newline yet) is left for the next read, and a job's stray print must not hide
its other points from the tool that stops the worst trials early."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import TypedDict

from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import Job
from corral.metric_points import MAX_NAMES_PER_POINT, point_problem
from corral.services.auth import Principal
from corral.services.errors import Invalid, NotFound
from corral.services.jobs import JobFilter, list_jobs
from corral.services.storage import open_output

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
MAX_READ_BYTES = 4 << 20
MAX_POINTS = 10_000
LATEST_POINTS = 100  # points read at least, for each name's latest value (`tail=1` too)
SKIP_LINES = 10_000  # lines that are no point read past at most, before giving up on older ones
MAX_LINE_BYTES = 16 << 10  # above any point (64 names, 64 characters each, and their numbers)
BLOCK_BYTES = 64 << 10


class MetricPoint(TypedDict):
    step: int | None
    values: dict[str, float]


class MetricsView(TypedDict):
    job_id: int
    file: str  # where the job writes them, under $CORRAL_OUTPUTS
    points: list[MetricPoint]  # oldest first; at most MAX_POINTS, the latest
    latest: dict[str, float]  # each name's last value among the points read
    skipped: int  # lines that were no object of names to numbers (among those read)
    truncated: bool  # the file holds lines before those given: only its latest points
    error: str | None  # the outputs could not be read (no points then); None: read


def read_metrics(
    settings: Settings,
    job: Job,
    *,
    tail: int = MAX_POINTS,
    window: int = MAX_READ_BYTES,
    skip_lines: int = SKIP_LINES,
) -> MetricsView:
    """The job's reported points so far (none yet: an empty list, not an error): the last
    `tail` points, read backwards from the file's end over at most `window` bytes and past at
    most `skip_lines` lines that are no point; `latest` over the points read (at least
    LATEST_POINTS of them when there are). An unreadable outputs dir: no points and `error`."""
    try:
        fd = open_output(settings, job, METRICS_FILE)
    except NotFound:
        return _view(job.id, [], 0, truncated=False)
    except OSError as exc:
        return _unreadable(job.id, exc)
    want = max(tail, LATEST_POINTS)
    points: list[MetricPoint] = []  # newest first while read
    skipped = 0
    try:
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            lines = _lines_backwards(fh.fileno(), size, window)
            for line in lines:
                point = parse_point(line) if line is not None else None
                if point is not None:
                    points.append(point)
                elif line is None or line.strip():
                    skipped += 1
                if len(points) >= want or skipped > skip_lines:
                    break
            more = next(lines, False) is not False  # older lines left unread
    except OSError as exc:
        return _unreadable(job.id, exc)
    points.reverse()
    latest = _latest(points)  # of every point read, also those before the tail
    truncated = more or size > window or len(points) > tail
    return _view(job.id, points[-tail:], skipped, truncated=truncated, latest=latest)


def _unreadable(job_id: int, exc: OSError) -> MetricsView:
    log.warning("metrics of job %s unreadable: %s", job_id, exc)
    view = _view(job_id, [], 0, truncated=False)
    view["error"] = f"the job's outputs are unreadable: {exc.strerror or exc}"
    return view


def _lines_backwards(fd: int, size: int, window: int) -> Iterator[bytes | None]:
    """The file's whole lines (without their newline), last first, from its last `window`
    bytes; None for a line longer than MAX_LINE_BYTES (not kept: skipped unparsed). The part
    after the last newline is a line still being written: left out. A line is whole when the
    byte before it is a newline or it starts the file: the first line of the window is checked,
    not dropped (a window starting at a line's start keeps that line)."""
    floor = max(0, size - window)
    pos = size
    block = 4 << 10  # small first: `tail=1` of many jobs reads a few KiB of each
    rest = b""  # the bytes after `pos` up to the next newline not yet given (a line's end part)
    overlong = False  # `rest` was dropped: the line it belongs to is over MAX_LINE_BYTES
    seen_newline = False
    while pos > floor:
        count = min(block, pos - floor)
        block = min(2 * block, BLOCK_BYTES)
        pos -= count
        parts = (os.pread(fd, count, pos) + rest).split(b"\n")
        rest = parts[0]
        whole = parts[1:]
        if whole and not seen_newline:
            whole.pop()  # after the file's last newline: empty, or a line still being written
            seen_newline = True
            overlong = False
        for line in reversed(whole):
            yield None if overlong or len(line) > MAX_LINE_BYTES else line
            overlong = False
        if len(rest) > MAX_LINE_BYTES:
            rest, overlong = b"", True
    if seen_newline and (pos == 0 or os.pread(fd, 1, pos - 1) == b"\n"):
        yield None if overlong or len(rest) > MAX_LINE_BYTES else rest


def parse_point(line: bytes) -> MetricPoint | None:
    """One line as a point: a JSON object of metric names to finite numbers (booleans are no
    numbers), with an optional whole-number `step`; None when it is not one."""
    if not line.lstrip().startswith(b"{"):  # no object: not worth a parse
        return None
    try:
        data = json.loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or len(data) > MAX_NAMES_PER_POINT + 1:
        return None
    step = data.pop("step", None)
    if point_problem(step, data) is not None:  # the rules report_metrics writes by
        return None
    return {"step": step, "values": {name: float(value) for name, value in data.items()}}


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
        "error": None,
    }


# Many jobs' metrics in one request (GET /jobs/metrics: the trials of an experiment, compared
# by an early-stopping rule each round): a page of jobs in SQL, each read with smaller caps, so
# that a page's whole work is bounded: at most MANY_MAX_POINTS points (tail x limit, refused
# above), MANY_PAGE_BYTES bytes and MANY_PAGE_SKIP_LINES lines that are no point, shared out
# evenly among its jobs.
MANY_MAX_JOBS = 500
MANY_WINDOW_BYTES = 128 << 10
MANY_PAGE_BYTES = 16 << 20
MANY_PAGE_SKIP_LINES = 100_000
MANY_MAX_POINTS = 100_000
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
    MANY_MAX_JOBS, paged in SQL as GET /jobs is), each its last `tail` points; tail x limit at
    most MANY_MAX_POINTS (422 naming both above)."""
    if tail * flt.limit > MANY_MAX_POINTS:
        raise Invalid(
            f"tail {tail} x limit {flt.limit} is {tail * flt.limit} points; at most {MANY_MAX_POINTS} "
            "a page: ask for fewer jobs a page (limit) or fewer points (tail)",
            ("query", "tail"),
        )
    jobs, total = list_jobs(session, principal, replace(flt, sort="id", order="asc"))
    window = min(MANY_WINDOW_BYTES, MANY_PAGE_BYTES // max(1, len(jobs)))
    skip_lines = min(SKIP_LINES, MANY_PAGE_SKIP_LINES // max(1, len(jobs)))
    items: list[JobMetricsItem] = []
    for job in jobs:
        read = read_metrics(settings, job, tail=tail, window=window, skip_lines=skip_lines)
        items.append({**read, "state": job.state, "labels": job.spec.labels})
    return {"items": items, "total": total, "limit": flt.limit, "offset": flt.offset}
