"""Trace loading: Corral's generic trace format and converters for the shipped public traces.

Generic format (a CSV file with a header row, documented in docs/simulator.md):
required columns `submit_time` (seconds from trace start), `duration` (run seconds when given the
requested GPUs), `num_gpus` (total over all instances), `group`; optional `job_id`, `user`,
`gpu_model`, `instances`, `cpus`, `memory_mib`, `priority`, `stop_grace_s`, `name`,
`max_runtime_s` (cpus and memory are per instance; an empty `stop_grace_s` means the simulator's
default grace; `name` is the job name the runtime history keys on, `max_runtime_s` the user's own
limit, used as an estimate).

Every malformed row stops the load with an error naming the file, the line and the column.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import lzma
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import IO, Any

from corral.scheduler.types import Priority
from corral.sim.errors import TraceError

REQUIRED_COLUMNS = ("submit_time", "duration", "num_gpus", "group")
OPTIONAL_COLUMNS = (
    "job_id",
    "user",
    "gpu_model",
    "instances",
    "cpus",
    "memory_mib",
    "priority",
    "stop_grace_s",
    "name",
    "max_runtime_s",
)
# What GET /admin/sim-export observed besides the format's columns: known, not read by the replay.
OBSERVED_COLUMNS = ("wait_s", "first_wait_s", "attempts", "state", "censored", "mixed_tasks")
SHIPPED_TRACES = ("philly", "openb", "openb-gpuspec33")
PHILLY_GPUS_PER_NODE = 8  # Philly servers had 8 GPUs; larger jobs ran as several 8-GPU instances


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One job of a trace in the generic format (cpus and memory are per instance)."""

    job_id: str
    submit_time: float
    duration: float
    num_gpus: int
    group: str
    user: str = "user"
    gpu_model: str | None = None
    instances: int = 1
    cpus: float = 1.0
    memory_mib: int = 1024
    priority: Priority = Priority.NORMAL
    stop_grace_s: float | None = None  # SIGTERM-to-kill time when preempted; None: the default
    name: str = ""  # the job name (history of the same user and name estimates its runtime)
    max_runtime_s: float | None = None  # the user's limit: what a user tells the scheduler

    @property
    def gpus_per_instance(self) -> int:
        return self.num_gpus // self.instances


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    jobs: tuple[TraceJob, ...]  # sorted by submit_time
    notes: tuple[str, ...] = ()  # what the conversion did (rounded fractional GPUs, ...)


def _data_file(name: str) -> Path:
    return Path(str(resources.files("corral").joinpath("data", "traces", name)))


def _open_text(path: Path) -> IO[str]:
    # utf-8-sig: a byte-order mark (a CSV saved by a spreadsheet) is not part of the first column
    if path.suffix == ".xz":
        return io.TextIOWrapper(lzma.open(path, "rb"), encoding="utf-8-sig", newline="")
    return path.open("r", encoding="utf-8-sig", newline="")


class _Row:
    """Field access that turns bad values into TraceErrors naming file, line and column."""

    def __init__(self, source: str, line: int, header: list[str], values: list[str]) -> None:
        self.source, self.line = source, line
        if len(values) != len(header):
            raise TraceError(
                f"{source}: line {line}: expected {len(header)} columns, found {len(values)}"
                + (f" (column {header[len(values)]!r} is missing)" if len(values) < len(header) else "")
            )
        self.fields = dict(zip(header, values, strict=True))

    def fail(self, column: str, problem: str) -> TraceError:
        return TraceError(f"{self.source}: line {self.line}: column {column!r}: {problem}")

    def text(self, column: str, default: str | None = None) -> str:
        value = self.fields.get(column, "").strip()
        if value:
            return value
        if default is not None:
            return default
        raise self.fail(column, "value is missing")

    def number(self, column: str, default: float | None = None, minimum: float = 0.0) -> float:
        raw = self.fields.get(column, "").strip()
        if not raw:
            if default is not None:
                return default
            raise self.fail(column, "value is missing")
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(column, f"{raw!r} is not a number")
        if not math.isfinite(value):
            raise self.fail(column, f"{raw!r} is not a finite number")
        if value < minimum:
            raise self.fail(column, f"{raw} is below the minimum {minimum:g}")
        return value

    def integer(self, column: str, default: int | None = None, minimum: int = 0) -> int:
        raw = self.fields.get(column, "").strip()
        value = self.number(column, None if default is None else float(default), float(minimum))
        if value != int(value):
            raise self.fail(column, f"{raw!r} is not a whole number")
        return int(value)


def _rows(handle: IO[str], source: str, required: Iterable[str]) -> Iterator[_Row]:
    reader = csv.reader(handle)
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{source}: the trace is empty (no header row)")
    header = [h.strip() for h in header]
    twice = sorted({h for h in header if h and header.count(h) > 1})
    if twice:  # the row's later value would silently win
        raise TraceError(f"{source}: line 1: column(s) {', '.join(twice)} appear more than once")
    missing = [c for c in required if c not in header]
    if missing:
        raise TraceError(f"{source}: line 1: missing required column(s) {', '.join(missing)}")
    for values in reader:
        if not values or all(not v.strip() for v in values):
            continue
        yield _Row(source, reader.line_num, header, values)


def _generic_job(row: _Row, index: int) -> TraceJob:
    num_gpus = row.integer("num_gpus")
    instances = row.integer("instances", default=1, minimum=1)
    if num_gpus % instances:
        raise row.fail("instances", f"num_gpus {num_gpus} is not divisible by {instances} instances")
    priority_raw = row.text("priority", "normal")
    try:
        priority = Priority.parse(int(priority_raw) if priority_raw.isdigit() else priority_raw)
    except ValueError as exc:
        raise row.fail("priority", str(exc))
    return TraceJob(
        job_id=row.text("job_id", f"job-{index}"),
        submit_time=row.number("submit_time"),
        duration=row.number("duration"),
        num_gpus=num_gpus,
        group=row.text("group"),
        user=row.text("user", "user"),
        gpu_model=row.text("gpu_model", "") or None,
        instances=instances,
        cpus=row.number("cpus", default=1.0),
        memory_mib=row.integer("memory_mib", default=1024),
        priority=priority,
        stop_grace_s=row.number("stop_grace_s") if row.fields.get("stop_grace_s", "").strip() else None,
        name=row.text("name", ""),
        max_runtime_s=(row.number("max_runtime_s") if row.fields.get("max_runtime_s", "").strip() else None),
    )


def _finish(name: str, jobs: list[TraceJob], source: str, notes: tuple[str, ...] = ()) -> Trace:
    if not jobs:
        raise TraceError(f"{source}: the trace has a header but no jobs")
    seen: set[str] = set()
    for job in jobs:
        if job.job_id in seen:
            raise TraceError(f"{source}: job_id {job.job_id!r} appears more than once")
        seen.add(job.job_id)
    jobs.sort(key=lambda j: j.submit_time)
    return Trace(name=name, jobs=tuple(jobs), notes=notes)


def load_generic_csv(path: str | Path) -> Trace:
    """Load a CSV in the generic format; raises TraceError on the first malformed row."""
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    jobs: list[TraceJob] = []
    line_of: dict[str, int] = {}  # job_id -> the line that first used it
    header: list[str] = []
    with _open_text(path) as handle:
        for i, row in enumerate(_rows(handle, str(path), REQUIRED_COLUMNS)):
            header = header or list(row.fields)
            job = _generic_job(row, i)
            first = line_of.setdefault(job.job_id, row.line)
            if first != row.line:
                given = row.fields.get("job_id", "").strip()  # empty: the default job-<row index>
                mine = repr(job.job_id) if given else f"no job_id given, and its default {job.job_id!r}"
                raise row.fail("job_id", f"{mine} is already the job_id of line {first}")
            jobs.append(job)
    known = REQUIRED_COLUMNS + OPTIONAL_COLUMNS + OBSERVED_COLUMNS
    unread = [c for c in header if c not in known]  # a misspelt optional column was silently lost
    optional = ", ".join(OPTIONAL_COLUMNS)
    notes = (f"column(s) not read: {', '.join(unread)} (the format's optional columns: {optional})",)
    return _finish(path.name, jobs, str(path), notes if unread else ())


def trace_from_rows(name: str, rows: Iterable[Mapping[str, Any]]) -> Trace:
    """A trace from rows in the generic format given as mappings (e.g. the JSON of
    `GET /admin/sim-export`): the same checks as a CSV file, a bad row named by its index."""
    jobs: list[TraceJob] = []
    columns = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
    for i, raw in enumerate(rows):
        values = ["" if raw.get(c) is None else str(raw.get(c)) for c in columns]
        jobs.append(_generic_job(_Row(name, i + 1, list(columns), values), i))
    return _finish(name, jobs, name)


def load_philly(path: Path | None = None) -> Trace:
    """Microsoft Philly per-job table -> generic format. Jobs over 8 GPUs become several
    instances of at most 8 GPUs each (12 GPUs -> 2 x 6, 32 GPUs -> 4 x 8)."""
    path = path or _data_file("philly_jobs.csv.xz")
    source = str(path)
    parsed: list[tuple[float, _Row]] = []
    with _open_text(path) as handle:
        for row in _rows(handle, source, ("timestamp", "duration", "num_gpus", "cluster")):
            try:
                stamp = datetime.fromisoformat(row.text("timestamp")).replace(tzinfo=UTC).timestamp()
            except ValueError:
                raise row.fail("timestamp", f"{row.fields['timestamp']!r} is not a date-time")
            parsed.append((stamp, row))
    if not parsed:
        raise TraceError(f"{source}: the trace has a header but no jobs")
    start = min(stamp for stamp, _ in parsed)
    jobs = []
    for index, (stamp, row) in enumerate(parsed):
        gpus = row.integer("num_gpus", minimum=1)
        instances = max(1, math.ceil(gpus / PHILLY_GPUS_PER_NODE))
        if gpus % instances:
            raise row.fail("num_gpus", f"{gpus} GPUs cannot be split evenly into {instances} nodes")
        jobs.append(
            TraceJob(
                job_id=f"philly-{index}",
                submit_time=stamp - start,
                duration=row.number("duration"),
                num_gpus=gpus,
                group=row.text("cluster"),
                instances=instances,
            )
        )
    return _finish("philly", jobs, source, ("jobs over 8 GPUs split into instances of <= 8 GPUs",))


def load_openb(path: Path | None = None, name: str = "openb") -> Trace:
    """Alibaba OpenB pods -> generic format. A fractional GPU (gpu_milli < 1000) is rounded up to
    one whole GPU because Corral allocates whole GPUs; `gpu_spec` becomes the GPU-model
    constraint; `qos` (LS, BE, Burstable, Guaranteed) becomes the group; CPU-only pods are left
    out (and counted in the trace notes). Duration is
    deletion - scheduled time (deletion - creation for pods the original cluster never placed)."""
    path = path or _data_file("openb_pods.csv.xz")
    source = str(path)
    jobs: list[TraceJob] = []
    fractional = cpu_only = 0
    required = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "creation_time", "deletion_time")
    with _open_text(path) as handle:
        for row in _rows(handle, source, required):
            created = row.number("creation_time")
            scheduled = row.number("scheduled_time", default=-1.0, minimum=-1.0)
            deleted = row.number("deletion_time")
            began = scheduled if scheduled >= 0 else created
            if deleted < began:
                raise row.fail("deletion_time", f"{deleted:g} is before the start {began:g}")
            gpus = row.integer("num_gpu")
            if gpus == 0:
                cpu_only += 1
                continue
            if 0 < row.integer("gpu_milli", minimum=0) < 1000 and gpus == 1:
                fractional += 1
            jobs.append(
                TraceJob(
                    job_id=row.text("name"),
                    submit_time=created,
                    duration=deleted - began,
                    num_gpus=gpus,
                    group=row.text("qos", "default"),
                    gpu_model=row.text("gpu_spec", "") or None,
                    cpus=row.number("cpu_milli") / 1000.0,
                    memory_mib=row.integer("memory_mib"),
                )
            )
    notes = (
        f"{fractional} fractional-GPU pods (gpu_milli < 1000) rounded up to 1 whole GPU",
        f"{cpu_only} CPU-only pods (num_gpu 0) left out: the replay studies GPU scheduling",
    )
    return _finish(name, jobs, source, notes)


def load_trace(name_or_path: str) -> Trace:
    """`philly`, `openb`, `openb-gpuspec33` (the shipped traces) or a path to a generic CSV."""
    if name_or_path == "philly":
        return load_philly()
    if name_or_path == "openb":
        return load_openb()
    if name_or_path == "openb-gpuspec33":
        return load_openb(_data_file("openb_pods_gpuspec33.csv.xz"), "openb-gpuspec33")
    path = Path(name_or_path)
    if not path.exists():
        raise TraceError(
            f"trace {name_or_path!r}: not a shipped trace ({', '.join(SHIPPED_TRACES)}) and no such file"
        )
    return load_generic_csv(path)


def first_jobs(trace: Trace, count: int) -> Trace:
    """The first `count` jobs by submit time (a shorter replay of the same workload)."""
    if count >= len(trace.jobs):
        return trace
    return Trace(trace.name, trace.jobs[:count], (*trace.notes, f"only the first {count:,} jobs replayed"))


def speed_up_arrivals(trace: Trace, factor: float) -> Trace:
    """Submit times divided by `factor` (durations unchanged): `factor` times the offered load."""
    if not (factor > 0 and math.isfinite(factor)):  # nan submit times would never be reached
        raise TraceError(f"arrival speed-up (--arrival-speedup) must be positive and finite, got {factor:g}")
    if factor == 1:
        return trace
    jobs = tuple(dataclasses.replace(j, submit_time=j.submit_time / factor) for j in trace.jobs)
    return Trace(
        trace.name, jobs, (*trace.notes, f"arrivals sped up {factor:g}x (submit times / {factor:g})")
    )


def write_generic_csv(jobs: Iterable[TraceJob], path: str | Path) -> None:
    """Write jobs in the generic format (all columns)."""
    columns = REQUIRED_COLUMNS + OPTIONAL_COLUMNS
    with Path(path).open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(columns)
        for j in jobs:
            required = [j.submit_time, j.duration, j.num_gpus, j.group]
            optional = [j.job_id, j.user, j.gpu_model or "", j.instances, j.cpus, j.memory_mib]
            grace = "" if j.stop_grace_s is None else j.stop_grace_s
            limit = "" if j.max_runtime_s is None else j.max_runtime_s
            writer.writerow([*required, *optional, j.priority.name.lower(), grace, j.name, limit])
