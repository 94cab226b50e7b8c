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
from sqlalchemy import event, select, update

from corral.db.models import Attempt, GpuClaim, Job, JobEvent, Node
from corral.db.session import make_engine
from corral.scheduler import types as st
from corral.server import scheduling
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.scheduling import apply_assignments, schedule_tick
from corral.server.snapshot import jobs_with_live_attempts
from corral.services import nodes as node_service
from corral.services.lifecycle import schedule_jobs
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
        # nothing placed, nodes and groups unchanged: the shape's digest, then each per-cycle
        # table once; no "anything queued?" probe, since the last cycle saw jobs waiting; and the
        # ETA calibration's look for jobs started since (eta_record.note_started): the latest
        # first-attempt start, one index entry (none has started here, so nothing more)
        assert Counter(waiting) == Counter(
            {"jobs": 1, "digest": 1, "attempts": 1, **dict.fromkeys(CYCLE_TABLES - {"jobs"}, 1)}
        )
        # the first cycle: the probe, the digest, each snapshot table once, the digest again
        # (the shape is kept only if it did not move meanwhile)
        first = 2 + len(SNAPSHOT_TABLES) + 1
        assert Counter(placing[:first]) == Counter(
            {"jobs": 2, "digest": 2, **dict.fromkeys(SNAPSHOT_TABLES - {"jobs"}, 1)}
        )
        # then what the batch re-reads in its own transaction, each table once, and after its
        # first write the nodes and GPUs it placed on once more (scheduling.left_service); and
        # the ETA calibration rebuilt from the database, once per process (eta_record.calibration_of:
        # the latest first-attempt start, then the outcomes), whatever the number placed
        again = Counter(placing[first:])
        assert again == Counter({"jobs": 2, "nodes": 2, "gpu_claims": 1, "gpus": 1, "attempts": 1}), again
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


@contextmanager
def statements(ctx: ServerContext) -> Iterator[list[str]]:
    """Every statement (reads and writes) while the block runs, its first word and table."""
    seen: list[str] = []
    db = ctx.session_factory.kw["bind"]

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        seen.append(" ".join(statement.split()[:3]))

    event.listen(db, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(db, "before_cursor_execute", count)


def one_gpu(job_id: int, node: str, index: int) -> st.Assignment:
    allocation = st.Allocation(str(job_id), (st.InstancePlacement("worker", 0, node, (index,), 1.0, 1024),))
    return st.Assignment(str(job_id), allocation)


def test_applying_a_plan_writes_in_the_same_statements_for_2_jobs_as_for_8(tmp_path: Path) -> None:
    """The state change (one compare-and-set for the batch), its events, the attempts and their
    GPU claims: one statement each however many jobs are placed, and each placed job gets all of
    them (attempt 1 with its GPU, its claim, its event)."""
    counts = {}
    for n in (2, 8):
        ctx = cluster(tmp_path / f"c{n}", 2, n)
        with ctx.session_factory() as session:
            ids = sorted(session.scalars(select(Job.id)))
        plan = [one_gpu(job_id, f"n{i % 2}", i // 2) for i, job_id in enumerate(ids)]
        with ctx.session_factory() as session, statements(ctx) as seen:
            assert apply_assignments(session, plan, time.time()) == n
        counts[n] = len(seen)
        with ctx.session_factory() as session:
            attempts = {a.job_id: a for a in session.scalars(select(Attempt))}
            claims = {
                c.job_id: (c.node, c.gpu_index, c.attempt_pk) for c in session.scalars(select(GpuClaim))
            }
            events = Counter(
                e.job_id for e in session.scalars(select(JobEvent).where(JobEvent.to_state == "scheduled"))
            )
            states = {j.id: (j.state, j.attempt_count) for j in session.scalars(select(Job))}
        assert states == dict.fromkeys(ids, ("scheduled", 1))
        assert {
            j: (a.number, a.state, a.placement[0].node, a.placement[0].gpu_indices)
            for j, a in attempts.items()
        } == {
            int(p.job_id): (
                1,
                "scheduled",
                p.allocation.nodes[0],
                p.allocation.instances[0].gpu_indices,
            )
            for p in plan
        }
        assert claims == {
            int(p.job_id): (
                p.allocation.nodes[0],
                p.allocation.instances[0].gpu_indices[0],
                attempts[int(p.job_id)].id,
            )
            for p in plan
        }
        assert events == dict.fromkeys(ids, 1)
    assert counts[2] == counts[8], counts


def test_a_batch_places_the_jobs_that_won_and_leaves_one_cancelled_meanwhile(tmp_path: Path) -> None:
    """The batch's compare-and-set loses for a job cancelled after the cycle read it (its session
    copy still says queued): no attempt, claim or event for it; the others are placed."""
    ctx = cluster(tmp_path, 2, 3)
    with ctx.session_factory() as cycle:
        ids = sorted(cycle.scalars(select(Job.id)))
        copies = [cycle.get(Job, job_id) for job_id in ids]  # held: the cycle's copies
        with ctx.session_factory() as api:
            api.execute(update(Job).where(Job.id == ids[1]).values(state="cancelled", cancel_requested=True))
            api.commit()
        plan = [one_gpu(job_id, "n0", i) for i, job_id in enumerate(ids)]
        assert apply_assignments(cycle, plan, time.time()) == 2
        assert copies[0] is not None and copies[0].state == "scheduled" and copies[0].attempt_count == 1
    with ctx.session_factory() as session:
        assert {a.job_id for a in session.scalars(select(Attempt))} == {ids[0], ids[2]}
        assert {c.job_id for c in session.scalars(select(GpuClaim))} == {ids[0], ids[2]}
        assert session.get(Job, ids[1]).state == "cancelled"  # type: ignore[union-attr]
        scheduled = session.scalars(select(JobEvent.job_id).where(JobEvent.to_state == "scheduled")).all()
        assert sorted(scheduled) == [ids[0], ids[2]]


def test_the_batch_compare_and_set_skips_a_job_with_a_cancel_requested_or_already_ended(
    tmp_path: Path,
) -> None:
    """lifecycle.schedule_jobs on the cycle's stale copies (they still read queued, no cancel):
    the UPDATE's own conditions keep a job whose cancel was requested (still queued) and one
    cancelled outright; only the third moves, with its event."""
    ctx = cluster(tmp_path, 1, 3)
    with ctx.session_factory() as cycle:
        jobs = list(cycle.scalars(select(Job).order_by(Job.id)))
        with ctx.session_factory() as api:
            api.execute(update(Job).where(Job.id == jobs[0].id).values(cancel_requested=True))
            api.execute(update(Job).where(Job.id == jobs[1].id).values(state="cancelled"))
            api.commit()
        assert [j.state for j in jobs] == ["queued"] * 3 and not jobs[0].cancel_requested
        won = schedule_jobs(cycle, jobs, now=time.time(), messages={})
        cycle.commit()
        assert won == {jobs[2].id: 1}
    with ctx.session_factory() as session:
        states = {row.id: row.state for row in session.execute(select(Job.id, Job.state))}
        moved = session.scalars(select(JobEvent.job_id).where(JobEvent.to_state == "scheduled")).all()
    assert states == {jobs[0].id: "queued", jobs[1].id: "cancelled", jobs[2].id: "scheduled"}
    assert moved == [jobs[2].id]


def test_a_second_apply_in_the_same_session_sees_a_gpu_quarantined_after_the_first(
    tmp_path: Path,
) -> None:
    """The schedule loop applies its ahead pass in the session its first pass committed in, whose
    copies of nodes and GPUs outlive the commit: the applier reads them again, so a GPU
    quarantined between the two passes is refused."""
    ctx = cluster(tmp_path, 1, 2)
    with ctx.session_factory() as cycle:
        first, second = sorted(cycle.scalars(select(Job.id)))
        held = cycle.get(Node, "n0")  # the cycle's copy, as the loop's own objects would keep it
        assert held is not None and all(g.health == "healthy" for g in held.gpus)
        assert apply_assignments(cycle, [one_gpu(first, "n0", 1)], time.time()) == 1
        with ctx.session_factory() as operator:
            node_service.set_gpu_health(operator, "n0", 0, "quarantine")
            operator.commit()
        assert apply_assignments(cycle, [one_gpu(second, "n0", 0)], time.time()) == 0
    with ctx.session_factory() as session:
        assert session.get(Job, second).state == "queued"  # type: ignore[union-attr]
        assert not session.scalars(select(GpuClaim).where(GpuClaim.job_id == second)).all()


@pytest.mark.parametrize("change", ["cordon", "drain", "quarantine"])
def test_a_cordon_or_quarantine_committed_after_the_applier_read_the_rows_places_nothing_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """Check-then-act: the applier reads nodes and GPUs first (still_fits) and writes later. An
    admin's cordon, drain or quarantine committed in between must still keep the job off the
    node (GPU): the write re-checks, under its write lock, what it placed on."""
    ctx = cluster(tmp_path, 1, 1)
    with ctx.session_factory() as session:
        (job_id,) = session.scalars(select(Job.id)).all()
    checked = scheduling.still_fits

    def then_the_admin_acts(*args: Any) -> Any:
        fit = checked(*args)
        with ctx.session_factory() as operator:  # commits between the read and the write
            if change == "quarantine":
                node_service.set_gpu_health(operator, "n0", 0, "quarantine")
            else:
                node_service.set_admin_state(operator, "n0", change)
            operator.commit()
        return fit

    monkeypatch.setattr(scheduling, "still_fits", then_the_admin_acts)
    with ctx.session_factory() as session:
        assert apply_assignments(session, [one_gpu(job_id, "n0", 0)], time.time()) == 0
    with ctx.session_factory() as session:
        assert session.get(Job, job_id).state == "queued"  # type: ignore[union-attr]
        assert session.scalars(select(GpuClaim)).all() == []
        assert session.scalars(select(Attempt)).all() == []


def test_a_plan_naming_a_job_twice_places_it_once_in_the_batch(tmp_path: Path) -> None:
    """Two assignments for one job (two GPUs that both fit) give one attempt, written by the
    batch: not a failed batch (attempt numbers are unique per job) and a job-by-job retry."""
    ctx = cluster(tmp_path, 1, 1)
    with ctx.session_factory() as session:
        (job_id,) = session.scalars(select(Job.id)).all()
    plan = [one_gpu(job_id, "n0", 0), one_gpu(job_id, "n0", 1)]
    with ctx.session_factory() as session, statements(ctx) as seen:
        assert apply_assignments(session, plan, time.time()) == 1
    assert sum(s.startswith("UPDATE jobs") for s in seen) == 1 and "ROLLBACK" not in seen, seen
    with ctx.session_factory() as session:
        assert [(a.number, a.placement[0].gpu_indices) for a in session.scalars(select(Attempt))] == [
            (1, (0,))
        ]


def test_a_claim_taken_meanwhile_fails_the_batch_and_the_others_are_placed_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another server claimed a GPU after this one read the claims (faked: the claims read here
    come back empty): the batch's claim INSERT fails, and the job-by-job fallback places every
    job but the one on that GPU, which stays queued with no attempt."""
    ctx = cluster(tmp_path, 1, 3)
    with ctx.session_factory() as session:
        first, clashing, other = sorted(session.scalars(select(Job.id)))
        assert apply_assignments(session, [one_gpu(first, "n0", 0)], time.time()) == 1
    monkeypatch.setattr(scheduling, "claimed_gpus", lambda session: set())
    with ctx.session_factory() as session:
        plan = [one_gpu(clashing, "n0", 0), one_gpu(other, "n0", 1)]
        assert apply_assignments(session, plan, time.time()) == 1
    with ctx.session_factory() as session:
        states = {row.id: row.state for row in session.execute(select(Job.id, Job.state))}
        attempts = {(a.job_id, a.number) for a in session.scalars(select(Attempt))}
        claims = {(c.job_id, c.node, c.gpu_index) for c in session.scalars(select(GpuClaim))}
    assert states == {first: "scheduled", clashing: "queued", other: "scheduled"}
    assert attempts == {(first, 1), (other, 1)}
    assert claims == {(first, "n0", 0), (other, "n0", 1)}


def test_a_queue_of_only_held_jobs_costs_one_probe_per_tick(tmp_path: Path) -> None:
    """A held job is left out of the scheduler's input, so a queue holding nothing else is idle:
    the "anything queued?" probe alone, not the state read of a cycle that can place nothing."""
    ctx = cluster(tmp_path, 1, 2)
    with ctx.session_factory() as session:
        session.execute(update(Job).values(held_by=1, held_at=time.time()))
        session.commit()
    schedule_tick(ctx, time.time())  # the first tick after the holds
    with selects(ctx) as seen:
        schedule_tick(ctx, time.time())
    assert seen == ["jobs"], seen  # before: the probe found the held jobs and the state was read
    with ctx.session_factory() as session:
        assert session.scalar(select(Attempt.id)) is None  # and nothing was placed
