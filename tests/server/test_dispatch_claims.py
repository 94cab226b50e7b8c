"""A launch that starts within FRESH_CLAIM_S of its claim goes to the engine without a write of
its own (the claim's UPDATE checked the job a moment ago; renewing it was one write transaction
per job); an older one renews the claim first and is not started when that fails. Real SQLite,
the fake engine records what it was asked to launch."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import event, select, update

from corral.db.models import Attempt, Job
from corral.db.session import make_engine
from corral.engine.base import AttemptLaunch
from corral.server.context import ServerContext
from corral.server.dispatch import FRESH_CLAIM_S, _launch, _record_all, prepare_launches
from corral.server.leases import JOB_LEASE_TTL_S
from corral.server.nodes import node_tick
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant
from tests.server.test_loops import assign


def claimed_launch(tmp_path: Path) -> tuple[ServerContext, FakeEngine, AttemptLaunch, list[str]]:
    """A scheduled job claimed by this server, its launch built; and the list of job UPDATEs
    executed from then on."""
    fake = FakeEngine([gpu_node("n1")])
    db = make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    ctx = make_context(db, fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
    assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
    with ctx.session_factory() as session:
        (launch,) = prepare_launches(ctx, session, time.time())
    updates: list[str] = []

    def seen(_conn: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE JOBS"):
            updates.append(statement)

    event.listen(db, "before_cursor_execute", seen)
    return ctx, fake, launch, updates


def test_a_fresh_claim_launches_without_a_write(tmp_path: Path) -> None:
    ctx, fake, launch, updates = claimed_launch(tmp_path)
    result = _launch(ctx, launch, claimed_at=time.time())
    assert result is not None and result[3] is None
    assert launch.attempt_id in fake.launched
    assert updates == []


def test_an_old_claim_is_renewed_first_and_a_lost_one_starts_nothing(tmp_path: Path) -> None:
    ctx, fake, launch, updates = claimed_launch(tmp_path)
    old = time.time() - FRESH_CLAIM_S - 0.5
    with ctx.session_factory() as session:  # another server took the job's lease meanwhile
        session.execute(update(Job).values(lease_owner="other:2:bb", lease_until=time.time() + 10))
        session.commit()
    updates.clear()
    assert _launch(ctx, launch, claimed_at=old) is None
    assert launch.attempt_id not in fake.launched
    assert len(updates) == 1  # the renewal, which found the lease gone

    with ctx.session_factory() as session:  # ours again: renewed, then launched
        session.execute(update(Job).values(lease_owner=ctx.owner_id, lease_until=time.time() + 10))
        session.commit()
    updates.clear()
    result = _launch(ctx, launch, claimed_at=old)
    assert result is not None and launch.attempt_id in fake.launched
    assert len(updates) == 1


def test_a_stalled_servers_late_record_does_not_stop_the_launch_another_server_recorded(
    tmp_path: Path,
) -> None:
    """Server A launches a job, then stalls before recording it; its claim runs out, server B
    claims the job, launches the same attempt (the engine's launch is idempotent: the same
    process) and records it STARTING. A's late record found the job no longer scheduled and
    stopped the attempt as an orphan: the job's one live attempt, which the engine then ended as
    `stopped` by Corral, and the job failed (not retryable) though nothing was wrong with it."""
    ctx_a, fake, launch, _ = claimed_launch(tmp_path)
    launched_by_a = _launch(ctx_a, launch, claimed_at=time.time())
    assert launched_by_a is not None and launched_by_a[3] is None
    ctx_b = ServerContext(ctx_a.settings, ctx_a.session_factory, fake, "other:2:bb")
    later = time.time() + JOB_LEASE_TTL_S + 1.0  # A's claim has run out
    with ctx_b.session_factory() as session:
        (again,) = prepare_launches(ctx_b, session, later)
    assert again.attempt_id == launch.attempt_id
    launched_by_b = _launch(ctx_b, again, claimed_at=later)
    assert launched_by_b is not None and launched_by_b[2] == launched_by_a[2]  # the same process
    with ctx_b.session_factory() as session:
        _record_all(ctx_b, session, [launched_by_b])
    with ctx_a.session_factory() as session:  # A wakes up and records its launch
        _record_all(ctx_a, session, [launched_by_a])
    assert fake.stopped == []
    with ctx_a.session_factory() as session:
        (attempt,) = session.scalars(select(Attempt)).all()
        assert attempt.state == "starting" and attempt.engine_ref == launched_by_a[2]


def started_then_raised(fake: FakeEngine, monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """The fake's launch starts the attempt, then raises (the local engine's write of engine_ref
    after its supervisor was spawned, on a full disk) while the returned flag's item is True."""
    raising = [True]
    launch = fake.launch

    def launch_then_raise(attempt: AttemptLaunch) -> str:
        ref = launch(attempt)
        if raising[0]:
            raise OSError(28, "No space left on device", "engine_ref")
        return ref

    monkeypatch.setattr(fake, "launch", launch_then_raise)
    return raising


def test_a_launch_that_raised_after_starting_its_attempt_is_stopped_once_recorded_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine started the attempt, then raised: the dispatch loop recorded the attempt FAILED
    (launch_failed) and requeued the job without stopping what had started, so the job could run
    twice (the requeued attempt beside the first, which nobody watched any more). It is stopped
    now, and only after the failure is committed (a stop of an attempt still live in the database
    could fail its job as `stopped`)."""
    ctx, fake, launch, _ = claimed_launch(tmp_path)
    started_then_raised(fake, monkeypatch)
    launched = _launch(ctx, launch, claimed_at=time.time())
    assert launched is not None and launched[3] is not None and launch.attempt_id in fake.launched
    states_at_stop: list[str] = []
    stop = fake.stop

    def stop_seeing_the_database(attempt_id: str, grace_s: float) -> None:
        with ctx.session_factory() as session:  # what another server would read then
            states_at_stop.append(session.scalars(select(Attempt.state)).one())
        stop(attempt_id, grace_s)

    monkeypatch.setattr(fake, "stop", stop_seeing_the_database)
    with ctx.session_factory() as session:
        _record_all(ctx, session, [launched])
    assert fake.stopped == [(launch.attempt_id, 0.0)]
    assert states_at_stop == ["failed"]
    with ctx.session_factory() as session:
        job = session.scalars(select(Job)).one()
        assert job.state == "queued" and "No space left on device" in (job.reason or ""), job.reason


def test_a_stalled_servers_raised_launch_does_not_stop_the_launch_another_server_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but server A stalled after its launch raised; its claim ran out and server B
    launched the same attempt (the same process) and recorded it STARTING: A's late record of its
    failure must neither fail the job nor stop its one live attempt."""
    ctx_a, fake, launch, _ = claimed_launch(tmp_path)
    raising = started_then_raised(fake, monkeypatch)
    launched_by_a = _launch(ctx_a, launch, claimed_at=time.time())
    assert launched_by_a is not None and launched_by_a[3] is not None
    raising[0] = False
    ctx_b = ServerContext(ctx_a.settings, ctx_a.session_factory, fake, "other:2:bb")
    later = time.time() + JOB_LEASE_TTL_S + 1.0  # A's claim has run out
    with ctx_b.session_factory() as session:
        (again,) = prepare_launches(ctx_b, session, later)
    launched_by_b = _launch(ctx_b, again, claimed_at=later)
    assert launched_by_b is not None and launched_by_b[3] is None
    with ctx_b.session_factory() as session:
        _record_all(ctx_b, session, [launched_by_b])
    with ctx_a.session_factory() as session:
        _record_all(ctx_a, session, [launched_by_a])
    assert fake.stopped == []
    with ctx_a.session_factory() as session:
        (attempt,) = session.scalars(select(Attempt)).all()
        assert attempt.state == "starting" and session.scalars(select(Job.state)).one() == "starting"
