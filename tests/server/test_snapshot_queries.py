"""Queries per scheduling cycle: the snapshot reads each table once, and applying a plan reads
what it needs in one round trip per table, however many jobs are placed (SQLite, real loops)."""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select

from corral.db.models import Job
from corral.db.session import make_engine
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.scheduling import schedule_tick
from corral.server.snapshot import jobs_with_live_attempts
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant

# What read_cluster_state reads: each table once (jobs with their live attempts joined); the
# shape's tables only when its digest moved (snapshot.cached_shape), the others every cycle
SHAPE_TABLES = {"nodes", "gpus", "groups", "group_quotas", "users"}
CYCLE_TABLES = {"jobs", "usage_ledger", "storage_accounts", "job_avoid"}
SNAPSHOT_TABLES = SHAPE_TABLES | CYCLE_TABLES
FROM = re.compile(r"\bFROM\s+\"?(\w+)", re.IGNORECASE)


def cluster(tmp_path: Path, nodes: int, jobs: int) -> ServerContext:
    fake = FakeEngine([gpu_node(f"n{i}", address=f"10.0.0.{i}") for i in range(nodes)])  # 4 GPUs each
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=4 * nodes)
        for _ in range(jobs):
            add_job(session, gid, uid, gpus=1)
    return ctx


@contextmanager
def selects(ctx: ServerContext) -> Iterator[list[str]]:
    """The table each SELECT reads first, in order, while the block runs."""
    seen: list[str] = []
    db = ctx.session_factory.kw["bind"]

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT"):
            found = FROM.search(statement)
            # snapshot.SHAPE_DIGEST: SQLite's group_concat, PostgreSQL's string_agg
            digest = "group_concat" in statement or "string_agg" in statement
            seen.append("digest" if digest else found.group(1) if found else "?")

    event.listen(db, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(db, "before_cursor_execute", count)


def test_cycle_reads_each_table_once_whatever_it_places(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The cycle's own reads: the schedule loop then launches what it placed (dispatch.launch_placed),
    # which reads what the dispatch loop reads, counted here neither before nor now.
    monkeypatch.setattr("corral.server.scheduling.launch_placed", lambda ctx: None)
    counts = {}
    for nodes, jobs in ((2, 20), (4, 50)):  # places 8, then 16 jobs; the rest wait
        ctx = cluster(tmp_path / f"c{nodes}", nodes, jobs)
        with selects(ctx) as placing:
            schedule_tick(ctx, time.time())
        with selects(ctx) as waiting:
            schedule_tick(ctx, time.time())
        # nothing placed, nodes and groups unchanged: the "anything queued?" probe, the shape's
        # digest, then each per-cycle table once
        assert Counter(waiting) == Counter(
            {"jobs": 2, "digest": 1, **dict.fromkeys(CYCLE_TABLES - {"jobs"}, 1)}
        )
        # the first cycle: the probe, the digest, each snapshot table once, the digest again
        # (the shape is kept only if it did not move meanwhile)
        first = 2 + len(SNAPSHOT_TABLES) + 1
        assert Counter(placing[:first]) == Counter(
            {"jobs": 2, "digest": 2, **dict.fromkeys(SNAPSHOT_TABLES - {"jobs"}, 1)}
        )
        # then what the batch re-reads in its own transaction, each table once
        again = Counter(placing[first:])
        assert all(n == 1 for n in again.values()), again
        counts[jobs] = len(placing)
    assert counts[20] == counts[50]  # not one more SELECT per placed job


def test_recording_a_batch_reads_jobs_with_owners_and_attempts_in_two_selects(tmp_path: Path) -> None:
    """What the dispatch and reconcile loops read before recording a batch: the jobs with their
    owner and group joined (one SELECT, not three), then their live attempts; nothing is loaded
    lazily after."""
    ctx = cluster(tmp_path, 2, 6)
    schedule_tick(ctx, time.time())  # places them: each has a live (scheduled) attempt
    with ctx.session_factory() as session:
        ids = [job.id for job in session.scalars(select(Job))]
        with selects(ctx) as read:
            jobs, attempts = jobs_with_live_attempts(session, ids)
            names = {(job.user.name, job.group.name) for job in jobs.values()}
    assert read == ["jobs", "attempts"]
    assert names == {("u", "g")} and len(jobs) == 6 and len(attempts) == 6
