"""What bench/chaos_soak.py reads to judge its invariants: read-only snapshots of the database
(jobs, attempts, GPU claims and GPU health) and the local engine's records of each attempt
(supervisor.json, status.json, the processes in its cgroups, its logs). Nothing here writes."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.engine.isolation import cgroupfs
from corral.engine.local.supervisor import proc_start, read_spec

TERMINAL = frozenset({"succeeded", "failed", "cancelled"})


# -------------------------------------------------------------------------- database snapshots


@dataclass
class Snapshot:
    jobs: dict[int, tuple[str, str]]  # id -> (name, state)
    attempts: list[tuple[int, int, int, str, list[dict[str, Any]]]]  # pk, job, number, state, placement
    claims: list[tuple[str, int, int]]  # node, gpu index, attempt pk
    gpu_health: dict[tuple[str, int], str]  # (node, index) -> healthy | quarantined | lost
    created: dict[tuple[int, int], float]  # (job, attempt number) -> when the attempt was created
    holds: dict[int, list[tuple[float, str]]]  # job -> its "hold" and "release" events (at, kind)


class DbReader:
    """Read-only snapshots: every query of one snapshot in one read transaction."""

    def __init__(self, url: str | None, sqlite_path: Path | None) -> None:
        self.url, self.sqlite_path = url, sqlite_path

    @contextlib.contextmanager
    def _cursor(self) -> Iterator[Any]:
        if self.sqlite_path is not None:
            conn = sqlite3.connect(
                f"file:{self.sqlite_path}?mode=ro", uri=True, timeout=30, isolation_level=None
            )
            try:
                conn.execute("BEGIN")  # WAL: the first read fixes the snapshot for the rest
                yield conn.cursor()
                conn.execute("COMMIT")
            finally:
                conn.close()
            return
        import psycopg

        assert self.url is not None
        dsn = self.url.replace("postgresql+psycopg://", "postgresql://")
        with psycopg.connect(dsn) as pg:
            pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            yield pg.cursor()

    def gpu_health(self) -> dict[tuple[str, int], str]:
        """(node, GPU index) -> health: the one table tend_gpus needs, not a whole snapshot."""
        with self._cursor() as cur:
            cur.execute('SELECT node_name, "index", health FROM gpus')
            return {(str(r[0]), int(r[1])): str(r[2]) for r in cur.fetchall()}

    def snapshot(self) -> Snapshot:
        with self._cursor() as cur:
            cur.execute("SELECT id, name, state FROM jobs")
            jobs = {int(r[0]): (str(r[1]), str(r[2])) for r in cur.fetchall()}
            cur.execute("SELECT id, job_id, number, state, placement FROM attempts")
            attempts = [(int(r[0]), int(r[1]), int(r[2]), str(r[3]), _json(r[4])) for r in cur.fetchall()]
            cur.execute("SELECT node, gpu_index, attempt_pk FROM gpu_claims")
            claims = [(str(r[0]), int(r[1]), int(r[2])) for r in cur.fetchall()]
            cur.execute('SELECT node_name, "index", health FROM gpus')
            health = {(str(r[0]), int(r[1])): str(r[2]) for r in cur.fetchall()}
            cur.execute("SELECT job_id, number, created_at FROM attempts")
            created = {(int(r[0]), int(r[1])): float(r[2]) for r in cur.fetchall()}
            cur.execute(
                "SELECT job_id, at, kind FROM job_events WHERE kind IN ('hold', 'release') ORDER BY at, id"
            )
            holds: dict[int, list[tuple[float, str]]] = {}
            for r in cur.fetchall():
                holds.setdefault(int(r[0]), []).append((float(r[1]), str(r[2])))
        return Snapshot(jobs, attempts, claims, health, created, holds)


def open_jobs(snap: Snapshot) -> dict[int, tuple[str, int]]:
    """Jobs neither terminal nor queued: job id -> (state, number of its latest attempt)."""
    latest: dict[int, int] = {}
    for _pk, jid, number, _state, _placement in snap.attempts:
        latest[jid] = max(latest.get(jid, 0), number)
    return {
        jid: (state, latest.get(jid, 0))
        for jid, (_name, state) in snap.jobs.items()
        if state not in TERMINAL and state != "queued"
    }


def held_placements(snap: Snapshot) -> list[tuple[int, int, float, float]]:
    """(job, attempt number, hold at, release at) of each attempt created while its job was held:
    after a "hold" event and before the "release" that ended it (or with no release yet)."""
    found: list[tuple[int, int, float, float]] = []
    created_of: dict[int, list[tuple[int, float]]] = {}
    for (job, number), created in snap.created.items():
        created_of.setdefault(job, []).append((number, created))
    for jid, events in snap.holds.items():
        spans, held_at = [], None
        for at, kind in events:
            if kind == "hold" and held_at is None:
                held_at = at
            elif kind == "release" and held_at is not None:
                spans.append((held_at, at))
                held_at = None
        if held_at is not None:
            spans.append((held_at, float("inf")))
        for number, created in created_of.get(jid, ()):
            found += [(jid, number, lo, hi) for lo, hi in spans if lo < created < hi]
    return found


def _json(value: Any) -> list[dict[str, Any]]:
    loaded = json.loads(value) if isinstance(value, str | bytes) else value
    return list(loaded or [])


# -------------------------------------------------------------------------- engine-side records


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def supervisor_alive(adir: Path) -> int | None:
    """The pid of the attempt's supervisor while that very process lives, else None."""
    sup = _read_json(adir / "supervisor.json")
    if sup is None or (adir / "status.json").exists():
        return None
    pid = int(sup["pid"])
    start = proc_start(pid)
    return pid if start is not None and start == str(sup.get("proc_start")) else None


def attempt_dirs(home: Path) -> dict[int, dict[int, Path]]:
    """job id -> attempt number -> attempt dir, as the local engine laid them out."""
    found: dict[int, dict[int, Path]] = {}
    root = home / "engine" / "attempts"
    for entry in os.scandir(root) if root.exists() else ():
        job, _, number = entry.name.partition(".")
        if job.isdigit() and number.isdigit():
            found.setdefault(int(job), {})[int(number)] = Path(entry.path)
    return found


def attempt_pids(adir: Path) -> list[int]:
    """Processes still in the cgroups of the attempt's instances (what its supervisor started)."""
    spec = read_spec(str(adir / "spec.marshal"))
    if spec is None:
        return []
    return [
        pid
        for inst in spec.get("instances", ())
        if (cgroup := inst.get("cgroup"))
        for pid in cgroupfs.pids(cgroup)
    ]


def engine_overlaps(dirs: dict[int, Path]) -> list[tuple[str, str]]:
    """(key, detail) of each way two attempts of one job overlapped on the engine side: the
    earlier one's supervisor started after the later one's, ended after it, left processes in
    its cgroups while the later one ran, or wrote to its logs after the later one started. An
    attempt whose supervisor never started ran nothing, whenever the engine wrote it off."""
    problems = []
    sups = {n: _read_json(d / "supervisor.json") for n, d in dirs.items()}  # each read once
    for prev, nxt in itertools.pairwise(sorted(dirs)):
        sup, prev_sup = sups[nxt], sups[prev]
        if sup is None or prev_sup is None:
            continue  # one of them never started a supervisor (yet): nothing ran side by side
        started = float(sup["started_at"])
        key = f"{prev}<{nxt}"
        if float(prev_sup["started_at"]) > started:
            problems.append((f"{key}:late", f"attempt {prev}'s supervisor started after attempt {nxt}'s"))
        status = _read_json(dirs[prev] / "status.json")
        if status is not None and float(status["finished_at"]) > started:
            late = float(status["finished_at"]) - started
            problems.append((f"{key}:end", f"attempt {nxt} started {late:.2f} s before {prev} ended"))
        if status is None and supervisor_alive(dirs[nxt]) and attempt_pids(dirs[prev]):
            problems.append((f"{key}:pids", f"processes of attempt {prev} run beside attempt {nxt}"))
        for log in dirs[prev].glob("rank-*.log"):
            written = log.stat().st_mtime - started
            if written > 0.05:  # mtime granularity
                problems.append(
                    (f"{key}:{log.name}", f"attempt {prev} wrote {log.name} {written:.2f} s into {nxt}")
                )
    return problems
