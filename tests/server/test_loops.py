"""Unit tests of the control loops on a real SQLite database with a fake engine."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest
from sqlalchemy import select

from corral.db.models import Attempt, Gpu, GpuClaim, Group, Job, Node, RemovedNode, UsageLedger
from corral.db.session import make_engine
from corral.db.sqlite_writes import write_lock_for
from corral.engine.base import (
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    FailureReason,
    InstanceLaunch,
    LogChunk,
    NodeReport,
)
from corral.engine.local import LocalEngine
from corral.scheduler import types as st
from corral.server.context import ServerContext
from corral.server.leases import claim_job, claim_lease
from corral.server.nodes import HEARTBEAT_TIMEOUT_S, node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import apply_assignment, apply_preemption, schedule_tick
from corral.server.snapshot import build_snapshot, read_cluster_state
from corral.services.lifecycle import JobState
from corral.services.nodes import remove_node, set_admin_state, set_gpu_health
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, run_dispatch, seed_tenant


@pytest.fixture
def env(tmp_path: Path) -> tuple[ServerContext, FakeEngine]:
    fake = FakeEngine([gpu_node("n1", address="10.0.0.1"), gpu_node("n2", address="10.0.0.2")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    return ctx, fake


def assign(ctx: ServerContext, job_id: int, *places: tuple[str, str, int, tuple[int, ...]]) -> bool:
    allocation = st.Allocation(
        str(job_id), tuple(st.InstancePlacement(r, i, n, g, 1.0, 1024) for r, n, i, g in places)
    )
    with ctx.session_factory() as session:
        return apply_assignment(session, st.Assignment(str(job_id), allocation), time.time())


def job_state(ctx: ServerContext, job_id: int) -> str:
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.state


def running_job(ctx: ServerContext, fake: FakeEngine, gpus: tuple[int, ...]) -> int:
    """A job on n1's `gpus`, assigned, launched and reported running: the start of the stop tests."""
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, gpus=len(gpus))
    assert assign(ctx, job_id, ("worker", "n1", 0, gpus))
    run_dispatch(ctx)
    fake.run(f"{job_id}.1")
    reconcile_tick(ctx, time.time())
    return job_id


def test_node_sync_stores_gpus_and_pushes_cordon(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    with ctx.session_factory() as session:
        node = session.get(Node, "n1")
        assert node is not None and node.state == "ready" and len(node.gpus) == 4
        assert node.gpus[2].uuid == "GPU-n1-2" and node.last_heartbeat is not None
        node.admin_state = "cordoned"
        session.commit()
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        assert session.get(Node, "n1").state == "cordoned"  # type: ignore[union-attr]
    assert fake.node_states["n1"] is st.NodeState.CORDONED
    assert fake.node_states["n2"] is st.NodeState.READY


def test_a_quarantined_gpu_that_drops_out_of_the_report_comes_back_quarantined(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """Only an admin returns a quarantined or lost GPU to service. A GPU missing from one report
    (a server restarted while it was off the bus, NVML not listing it) had its row deleted, and
    came back as a new, healthy row the next time the engine listed it."""
    ctx, fake = env
    with ctx.session_factory() as session:
        set_gpu_health(session, "n1", 3, "quarantine")
        session.commit()
    fake.reports = [gpu_node("n1", gpus=3, address="10.0.0.1"), gpu_node("n2", address="10.0.0.2")]
    node_tick(ctx, time.time())
    fake.reports = [gpu_node("n1", address="10.0.0.1"), gpu_node("n2", address="10.0.0.2")]
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gpu = session.get(Gpu, ("n1", 3))
        assert gpu is not None and gpu.health == "quarantined"
        set_gpu_health(session, "n1", 3, "return")  # the admin's decision
        session.commit()
    fake.reports = [gpu_node("n1", gpus=3, address="10.0.0.1"), gpu_node("n2", address="10.0.0.2")]
    node_tick(ctx, time.time())  # a healthy GPU the engine no longer has is removed, as before
    with ctx.session_factory() as session:
        assert session.get(Gpu, ("n1", 3)) is None


def test_assignment_claims_gpus_once(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, _ = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        first, second = add_job(session, gid, uid), add_job(session, gid, uid)
    assert assign(ctx, first, ("worker", "n1", 0, (1,)))
    assert not assign(ctx, second, ("worker", "n1", 0, (1,)))  # GPU n1/1 is already claimed
    assert job_state(ctx, first) == "scheduled" and job_state(ctx, second) == "queued"
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == first)).one()
        assert attempt.placement[0].gpu_uuids == ("GPU-n1-1",) and attempt.number == 1
        assert session.scalars(select(Attempt).where(Attempt.job_id == second)).all() == []


def test_dispatch_sets_rendezvous_env_for_a_gang(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, gpus=2, instances=2)
    assert assign(ctx, job_id, ("worker", "n2", 1, (0, 1)), ("worker", "n1", 0, (2, 3)))
    run_dispatch(ctx)
    assert job_state(ctx, job_id) == "starting"
    launch = fake.launched[f"{job_id}.1"]
    by_rank = {i.rank: i for i in launch.instances}
    assert by_rank[0].node == "n1" and by_rank[1].node == "n2"
    for rank, inst in by_rank.items():
        assert inst.env["RANK"] == str(rank) and inst.env["WORLD_SIZE"] == "2"
        assert inst.env["MASTER_ADDR"] == "10.0.0.1" and inst.env["CORRAL_NUM_INSTANCES"] == "2"
        assert inst.env["CORRAL_TASK_INDEX"] == str(rank) and inst.env["CORRAL_JOB_ID"] == str(job_id)
        assert inst.env["EPOCHS"] == "3"
    assert by_rank[0].env["MASTER_PORT"] == by_rank[1].env["MASTER_PORT"]
    assert by_rank[0].env["CUDA_VISIBLE_DEVICES"] == "GPU-n1-2,GPU-n1-3"
    run_dispatch(ctx)  # a second pass launches nothing new
    assert fake.launch_calls == 1


def test_reconcile_runs_succeeds_frees_gpus_and_charges_usage(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake, (0, 1))
    assert job_state(ctx, job_id) == "running"
    fake.finish(f"{job_id}.1", 0)
    reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "succeeded"
    with ctx.session_factory() as session:
        assert session.scalars(select(GpuClaim)).all() == []
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert attempt.state == "succeeded" and attempt.exit_code == 0 and attempt.ended_at is not None
        ledger = session.get(UsageLedger, ("g", "u"))
        # 2 GPUs for as long as the attempt ran (not a wall-clock guess: the test's own pace under
        # load decides how long that was)
        assert attempt.started_at is not None and attempt.ended_at - attempt.started_at >= 1.0
        assert ledger is not None
        assert ledger.gpu_seconds == pytest.approx(2 * (attempt.ended_at - attempt.started_at), rel=1e-6)


def test_failed_attempts_retry_then_fail_keeping_every_attempt(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, retries=1)
    for number in (1, 2):
        assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
        run_dispatch(ctx)
        fake.finish(f"{job_id}.{number}", 3)
        reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "failed"
    with ctx.session_factory() as session:
        attempts = session.scalars(
            select(Attempt).where(Attempt.job_id == job_id).order_by(Attempt.number)
        ).all()
        assert [(a.number, a.state, a.exit_code) for a in attempts] == [(1, "failed", 3), (2, "failed", 3)]


def test_cancel_while_running_stops_with_grace_then_cancels(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake, (0,))
    with ctx.session_factory() as session:
        session.get(Job, job_id).cancel_requested = True  # type: ignore[union-attr]
        session.commit()
    reconcile_tick(ctx, time.time())
    assert fake.stopped == [(f"{job_id}.1", 10.0)] and job_state(ctx, job_id) == "running"
    fake.finish(f"{job_id}.1", 143)
    reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "cancelled"
    assert len(fake.stopped) == 1


def test_launch_failure_fails_the_attempt_with_its_message(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    fake.fail_launch = "no such environment"
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
    assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
    run_dispatch(ctx)
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        # the exit-spec refines the engine's launch_failed: a missing environment is the user's
        assert attempt.reason == "environment_missing" and "no such environment" in attempt.message
        assert session.scalars(select(GpuClaim)).all() == []
    assert job_state(ctx, job_id) == "failed"


@pytest.mark.parametrize(
    ("refused", "reason"),
    [("storage: code snapshot abc is gone", "storage_refused"), ("", "environment_missing")],
)
def test_a_launch_the_local_engine_refuses_for_the_jobs_own_fault_is_not_retried(
    env: tuple[ServerContext, FakeEngine], tmp_path: Path, refused: str, reason: str
) -> None:
    """The local engine does not raise when it refuses a launch (its storage refused, an
    environment it does not have): it records the attempt failed, `launch_failed` with the
    refusal as its message, and the reconcile loop classifies it. The exit-spec read only the
    rank's log, empty since nothing ran, so storage_refused and environment_missing (user, never
    retried) could never match: it was launch_failed (platform), retried twice with backoff,
    failing the same way, and charged to the platform-loss budget."""
    ctx, fake = env
    local = LocalEngine(tmp_path / "engine", "n1", virtual_gpus=0, isolation=False, use_launcher=False)
    inst = InstanceLaunch("worker", 0, 0, "n1", (), 1.0, 128, "true", {})
    environment = "default" if refused else "no-such-env"
    local.launch(AttemptLaunch("9.1", "9", 1, "u", "g", (inst,), environment=environment, refused=refused))
    engine_says = local.poll(["9.1"])["9.1"]
    assert engine_says.phase is AttemptPhase.FAILED and engine_says.reason is FailureReason.LAUNCH_FAILED
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, retries=3)
    assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
    run_dispatch(ctx)
    fake.statuses[f"{job_id}.1"] = dataclasses.replace(engine_says, attempt_id=f"{job_id}.1")
    reconcile_tick(ctx, time.time())
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert attempt.reason == reason, attempt.message
        job = session.get(Job, job_id)
        assert job is not None and (job.state, job.platform_losses) == ("failed", 0), job.reason


def test_a_sandbox_bwrap_refused_is_the_platforms_loss_not_the_jobs_own_failure(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """The local engine's launch_failed for a sandbox that bwrap refused to set up (docs/isolation.md,
    "Sandboxes that do not start"; the rank ran and is reaped, so it comes through the reconcile
    loop): requeued on the platform-loss budget, the job's own failures untouched, though bwrap's
    words hold the 'No such file or directory' by which missing_file (user, never) knows a log."""
    ctx, fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, retries=0)
    assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
    run_dispatch(ctx)
    aid, now = f"{job_id}.1", time.time()
    refused = "bwrap: Can't find source path /proc/self/fd/7: No such file or directory"
    fake.statuses[aid] = AttemptStatus(
        aid, AttemptPhase.FAILED, None, FailureReason.LAUNCH_FAILED,
        f"rank 0: the sandbox did not start the job: {refused}", started_at=now - 1, finished_at=now,
    )  # fmt: skip
    reconcile_tick(ctx, now)
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert attempt.reason == "launch_failed" and refused in attempt.message, attempt.message
        job = session.get(Job, job_id)
        assert job is not None and (job.state, job.own_failures, job.platform_losses) == ("queued", 0, 1)


def test_a_server_started_with_a_bad_exit_spec_file_still_records_how_attempts_end(
    env: tuple[ServerContext, FakeEngine], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An admin exit-spec file that does not parse is refused with its line and the previous
    table stays active (docs/diagnosis.md). A server started with one had no previous table: the
    exit-spec raised on every use, so each reconcile tick that saw an attempt fail raised before
    recording anything, that failure and every other change of the tick alike (jobs never
    reached RUNNING, ended attempts kept their GPUs), until the file was fixed. The shipped
    table is used meanwhile."""
    ctx, fake = env
    bad = tmp_path / "exit_spec.yaml"
    bad.write_text("version: 1\nrules: [oops\n")
    monkeypatch.setenv("CORRAL_DIAG_EXIT_SPEC_FILE", str(bad))
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        failing = add_job(session, gid, uid, name="fails")
        starting = add_job(session, gid, uid, name="starts")
    assert assign(ctx, failing, ("worker", "n1", 0, (0,)))
    assert assign(ctx, starting, ("worker", "n1", 0, (1,)))
    run_dispatch(ctx)
    fake.finish(f"{failing}.1", 1)
    fake.run(f"{starting}.1")
    reconcile_tick(ctx, time.time())
    assert (job_state(ctx, failing), job_state(ctx, starting)) == ("failed", "running")
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == failing)).one()
        assert attempt.reason == "exit_code"  # the shipped table's verdict


@pytest.mark.parametrize(("budget", "expected"), [(3, "queued"), (0, "failed")])
def test_a_platform_launch_failure_is_held_to_the_configured_loss_budget(
    env: tuple[ServerContext, FakeEngine], budget: int, expected: str
) -> None:
    """launch_failed (platform, up_to 2) is requeued within the lower of its cap and the server's
    CORRAL_LOST_REQUEUE_BUDGET, like every other platform failure: the dispatch loop used the
    default budget (3) whatever was configured, so a budget of 0 still requeued it."""
    ctx, fake = env
    ctx.settings.lost_requeue_budget = budget
    fake.fail_launch = "the engine is out of slots"
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
    assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
    run_dispatch(ctx)
    assert job_state(ctx, job_id) == expected
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and job.platform_losses == 1
        assert ("platform loss 1 of 2" if budget else "over the limit of 0") in job.reason, job.reason


@pytest.mark.parametrize(
    ("preemptible", "budget", "expected"), [(True, 3, "queued"), (False, 3, "queued"), (True, 0, "failed")]
)
def test_silent_node_goes_down_and_its_jobs_are_requeued_or_failed(
    env: tuple[ServerContext, FakeEngine], preemptible: bool, budget: int, expected: str
) -> None:
    """Node loss is lost work: requeued within the platform-loss budget, preemptible or not."""
    ctx, fake = env
    ctx.settings.lost_requeue_budget = budget
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, preemptible=preemptible)
    assert assign(ctx, job_id, ("worker", "n2", 0, (0,)))
    run_dispatch(ctx)
    fake.reports = [r for r in fake.reports if r.name != "n2"]  # n2 stops reporting
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        assert session.get(Node, "n2").state == "ready"  # type: ignore[union-attr]
    node_tick(ctx, time.time() + HEARTBEAT_TIMEOUT_S + 0.5)
    with ctx.session_factory() as session:
        node = session.get(Node, "n2")
        assert node is not None and node.state == "down" and "heartbeat" in node.message
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert attempt.state == "lost" and attempt.reason == "node_lost"
        assert session.scalars(select(GpuClaim)).all() == []
    assert job_state(ctx, job_id) == expected


def test_down_nodes_are_polled_once_before_the_tick_writes(
    env: tuple[ServerContext, FakeEngine], tmp_path: Path
) -> None:
    """Two nodes lost in one tick (one reported down, one silent): the engine is asked how their
    attempts ended once, for both, before the tick writes anything (SQLite's write lock free: an
    engine call inside the write transaction held it as long as the engine took). The attempt
    the engine reports succeeded is left to the reconcile loop; the other is lost and requeued."""
    ctx, fake = env
    ctx.settings.lost_requeue_budget = 1
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        on_n1, on_n2 = add_job(session, gid, uid), add_job(session, gid, uid)
    assert assign(ctx, on_n1, ("worker", "n1", 0, (0,)))
    assert assign(ctx, on_n2, ("worker", "n2", 0, (0,)))
    run_dispatch(ctx)
    fake.statuses[f"{on_n2}.1"] = AttemptStatus(f"{on_n2}.1", AttemptPhase.SUCCEEDED, exit_code=0)
    polls: list[tuple[list[str], bool]] = []
    real_poll = fake.poll
    write_lock = write_lock_for(str((tmp_path / "db.sqlite").resolve()))

    def poll(attempt_ids: Iterable[str]) -> Mapping[str, AttemptStatus]:
        ids = sorted(attempt_ids)
        polls.append((ids, write_lock.locked()))
        return real_poll(ids)

    fake.poll = poll  # type: ignore[method-assign]
    fake.reports = [  # n1 reported down, n2 silent
        dataclasses.replace(r, state=st.NodeState.DOWN, message="kernel panic")
        for r in fake.reports
        if r.name == "n1"
    ]
    node_tick(ctx, time.time() + HEARTBEAT_TIMEOUT_S + 0.5)
    assert polls == [(sorted([f"{on_n1}.1", f"{on_n2}.1"]), False)]
    assert job_state(ctx, on_n1) == "queued"  # lost, requeued
    assert job_state(ctx, on_n2) == "starting"  # exited 0: left to the reconcile loop to record


def test_a_removed_node_the_engine_still_reports_comes_back_cordoned(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """`corral node remove` of a node the engine still reports (not taken out of it first): the
    next report brought it back ready, and work was placed on a decommissioned machine. It comes
    back cordoned (pushed to the engine so), saying why; an admin's uncordon makes it ready."""
    ctx, fake = env
    with ctx.session_factory() as session:
        set_admin_state(session, "n2", "cordon")
        remove_node(session, "n2", by="root", now=0.0)
        session.commit()
        assert session.get(Node, "n2") is None
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        node = session.get(Node, "n2")
        assert node is not None and (node.state, node.admin_state) == ("cordoned", "cordoned")
        assert node.message.startswith("removed by root at 1970-01-01 00:00:00 UTC, reported again")
        assert session.get(RemovedNode, "n2") is None  # a node again: the cordon holds it out
        assert session.get(Node, "n1").state == "ready"  # type: ignore[union-attr]
    assert fake.node_states["n2"] is st.NodeState.CORDONED
    with ctx.session_factory() as session:
        set_admin_state(session, "n2", "uncordon")
        session.commit()
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        assert session.get(Node, "n2").state == "ready"  # type: ignore[union-attr]


class ServerKilled(BaseException):
    """The server process dying at this very point (nothing after it runs, nothing is committed)."""


class DiesAtStop(FakeEngine):
    """An engine whose first stop is delivered, and the server dies right after sending it."""

    def stop(self, attempt_id: str, grace_s: float) -> None:
        super().stop(attempt_id, grace_s)
        self.statuses[attempt_id] = AttemptStatus(
            attempt_id,
            AttemptPhase.FAILED,
            exit_code=143,
            reason=FailureReason.STOPPED,
            message="stopped by Corral",
            finished_at=time.time(),
        )
        raise ServerKilled


def test_a_server_killed_while_stopping_a_lost_nodes_jobs_still_requeues_them(tmp_path: Path) -> None:
    """The node loop records the loss (job requeued, attempt LOST) before it stops the attempt
    through the engine: a stop sent first, then the server killed before its commit, left the
    attempt ended as `stopped` by Corral with no loss on record, and the restarted server failed
    the job (stopped: not retryable) instead of requeueing it within its platform-loss budget."""
    fake = DiesAtStop([gpu_node("n1", address="10.0.0.1"), gpu_node("n2", address="10.0.0.2")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
    assert assign(ctx, job_id, ("worker", "n2", 0, (0,)))
    run_dispatch(ctx)
    fake.run(f"{job_id}.1")
    reconcile_tick(ctx, time.time())
    fake.reports = [r for r in fake.reports if r.name != "n2"]  # n2 stops reporting
    with pytest.raises(ServerKilled):
        node_tick(ctx, time.time() + HEARTBEAT_TIMEOUT_S + 0.5)
    assert fake.stopped == [(f"{job_id}.1", 0.0)]
    restarted = ServerContext(ctx.settings, ctx.session_factory, fake, "test:2:bb")
    reconcile_tick(restarted, time.time())
    with ctx.session_factory() as session:
        job = session.get(Job, job_id)
        assert job is not None and (job.state, job.platform_losses) == ("queued", 1), job.reason
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert (attempt.state, attempt.reason) == ("lost", "node_lost")


def test_restart_adopts_running_attempts(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
    assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
    run_dispatch(ctx)
    fresh = ServerContext(ctx.settings, ctx.session_factory, fake, "test:2:bb")  # a restarted server
    fake.finish(f"{job_id}.1", 0)
    reconcile_tick(fresh, time.time())
    assert fake.adopted == {f"{job_id}.1": f"ref-{job_id}.1"}
    assert job_state(ctx, job_id) == "succeeded"


def test_leases_exclude_a_second_owner_until_expiry(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, _ = env
    now = time.time()
    with ctx.session_factory() as session:
        assert claim_lease(session, "schedule", "a", now, ttl_s=5)
        assert not claim_lease(session, "schedule", "b", now + 1, ttl_s=5)
        assert claim_lease(session, "schedule", "a", now + 1, ttl_s=5)
        assert claim_lease(session, "schedule", "b", now + 7, ttl_s=5)
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
        assert claim_job(session, job_id, "a", now)
        session.commit()
        assert not claim_job(session, job_id, "b", now + 1)
        assert claim_job(session, job_id, "b", now + 11)


def test_snapshot_holds_running_allocations_and_decayed_usage(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, _ = env
    now = time.time()
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        running, waiting = add_job(session, gid, uid, gpus=2), add_job(session, gid, uid, gpus=1)
        session.add(
            UsageLedger(group_name="g", user_name="u", gpu_seconds=100.0, updated_at=now - 7 * 24 * 3600)
        )
        session.commit()
    assert assign(ctx, running, ("worker", "n1", 0, (2, 3)))
    with ctx.session_factory() as session:
        state = read_cluster_state(session)
    snap = build_snapshot(state, now)
    assert snap == build_snapshot(state, now)  # pure
    assert [j.id for j in snap.queued] == [str(waiting)]
    assert snap.queued[0].tasks[0].resources.gpus == 1
    (run,) = snap.running
    assert run.allocation.instances[0].gpu_indices == (2, 3) and run.job.id == str(running)
    assert snap.usage.by_group["g"] == pytest.approx(50.0)
    assert {n.name for n in snap.nodes} == {"n1", "n2"} and snap.groups[0].guaranteed == {"*": 4}
    assert JobState(job_state(ctx, running)) is JobState.SCHEDULED


def test_preemption_stops_with_grace_and_requeues(env: tuple[ServerContext, FakeEngine]) -> None:
    ctx, fake = env
    job_id = running_job(ctx, fake, (0, 1))
    with ctx.session_factory() as session:
        assert apply_preemption(session, st.Preemption(str(job_id), 7.5, "reclaimed by group x"), time.time())
    assert job_state(ctx, job_id) == "preempted"
    reconcile_tick(ctx, time.time())
    assert fake.stopped == [(f"{job_id}.1", 7.5)]
    fake.finish(f"{job_id}.1", 143)
    reconcile_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "queued"
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert attempt.state == "preempted" and attempt.exit_code == 143
        assert session.scalars(select(GpuClaim)).all() == []
    assert assign(ctx, job_id, ("worker", "n2", 0, (0, 1)))  # it can be placed again, as attempt 2


class LoggingEngine(FakeEngine):
    """The fake engine, with every rank's log holding `text`."""

    def __init__(self, nodes: list[NodeReport], text: bytes) -> None:
        super().__init__(nodes)
        self.text = text

    def logs(self, attempt_id: str, instance: int = 0, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        data = self.text[offset : offset + limit]
        return LogChunk(data, offset + len(data), True)


def test_a_hardware_failure_found_in_the_log_on_the_only_node_is_retried_there(tmp_path: Path) -> None:
    """A hardware failure (gpu_error) is retried away from the GPU that failed, or from the node
    when the log alone told it (no fault on record names the GPU). On the only node (the local
    engine has one) the retry was told to avoid every node: it was never placed again, neither
    run nor failed, with its platform-loss budget left. It is retried where it can run."""
    log_text = b"RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
    fake = LoggingEngine([gpu_node("n1")], log_text)
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
    assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
    run_dispatch(ctx)
    fake.finish(f"{job_id}.1", 1)
    reconcile_tick(ctx, time.time())
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert attempt.reason == "gpu_error"
    assert job_state(ctx, job_id) == "queued"
    schedule_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "scheduled"


def test_schedule_tick_places_waiting_jobs_and_diagnoses_the_rest(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, _fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=8)
        big = [add_job(session, gid, uid, gpus=4) for _ in range(3)]  # 8 GPUs in all: one must wait
    schedule_tick(ctx, time.time())
    states = [job_state(ctx, j) for j in big]
    assert sorted(states) == ["queued", "scheduled", "scheduled"]
    with ctx.session_factory() as session:
        waiting = session.get(Job, big[states.index("queued")])
        assert waiting is not None and waiting.diagnosis is not None
        assert waiting.diagnosis.queue_position == 1 and waiting.diagnosis.reasons
        claims = session.scalars(select(GpuClaim)).all()
        assert len(claims) == 8 and len({(c.node, c.gpu_index) for c in claims}) == 8


def test_node_reported_down_loses_its_jobs_once_and_engine_outage_marks_unknown(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    ctx, fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, retries=1, preemptible=False)
    assert assign(ctx, job_id, ("worker", "n1", 0, (0,)))
    run_dispatch(ctx)
    fake.reports = [
        dataclasses.replace(r, state=st.NodeState.DOWN, message="kernel panic") if r.name == "n1" else r
        for r in fake.reports
    ]
    node_tick(ctx, time.time())
    node_tick(ctx, time.time())
    assert job_state(ctx, job_id) == "queued"  # not preemptible, but it has a retry left
    assert fake.stopped == [(f"{job_id}.1", 0.0)]
    with ctx.session_factory() as session:
        assert session.get(Node, "n1").message == "kernel panic"  # type: ignore[union-attr]
    fake.nodes = _raise_unavailable  # type: ignore[method-assign]
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        assert {n.name: n.state for n in session.scalars(select(Node))} == {"n1": "down", "n2": "unknown"}


def test_a_down_node_reported_unknown_stays_down_and_the_tick_goes_on(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """The Slurm engine answers an outage of slurmctld with its last nodes, each UNKNOWN (and a
    node of slurmd restarting is NOT_RESPONDING: UNKNOWN too). A node Corral had down must stay
    down ("down never -> unknown", as for EngineUnavailable): the DOWN -> UNKNOWN move raised
    InvalidTransition and failed the whole node tick, every tick, for every node."""
    ctx, fake = env
    up = list(fake.reports)
    fake.reports = [dataclasses.replace(r, state=st.NodeState.DOWN) if r.name == "n1" else r for r in up]
    node_tick(ctx, time.time())
    fake.reports = [dataclasses.replace(r, state=st.NodeState.UNKNOWN, message="slurmctld down") for r in up]
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        assert {n.name: n.state for n in session.scalars(select(Node))} == {"n1": "down", "n2": "unknown"}
    fake.reports = up
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        assert {n.name: n.state for n in session.scalars(select(Node))} == {"n1": "ready", "n2": "ready"}


def _raise_unavailable() -> list[NodeReport]:
    from corral.engine.base import EngineUnavailable

    raise EngineUnavailable("slurmctld is not answering")


def test_preemption_gives_each_victim_its_own_stop_grace_bounded(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """Two low-priority jobs fill both nodes; a high-priority gang preempts both. Each victim's
    attempt is stopped with its own spec's stop_grace (2m), bounded by CORRAL_MAX_STOP_GRACE_S
    (20m asked, 300 s given), not the profile's fixed 30 s."""
    ctx, fake = env
    assert ctx.settings.max_stop_grace_s == 300.0
    graces = {"2m": 120.0, "20m": 300.0}
    expected: dict[int, float] = {}
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=8)
        for asked, given in graces.items():
            job_id = add_job(session, gid, uid, gpus=4)
            job = session.get(Job, job_id)
            assert job is not None
            job.spec = job.spec.model_copy(update={"stop_grace": asked})
            job.priority = 0
            expected[job_id] = given
        session.commit()
    now = time.time()
    schedule_tick(ctx, now)
    run_dispatch(ctx)
    for job_id in expected:
        fake.run(f"{job_id}.1")
    reconcile_tick(ctx, time.time())
    assert all(job_state(ctx, j) == "running" for j in expected)
    with ctx.session_factory() as session:
        urgent = add_job(session, gid, uid, gpus=4, instances=2)
        job = session.get(Job, urgent)
        assert job is not None
        job.priority = 2
        session.commit()
    schedule_tick(ctx, time.time())
    with ctx.session_factory() as session:
        for job_id, given in expected.items():
            assert job_state(ctx, job_id) == "preempted"
            attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
            assert attempt.stop_grace_s == given


def test_job_waiting_on_cordoned_nodes_is_told_so(env: tuple[ServerContext, FakeEngine]) -> None:
    """Both nodes cordoned by the operator: the waiting job's stored diagnosis names the filter
    that refused them (node_not_ready, "2 nodes cordoned"), not a shortage of CPUs or GPUs."""
    ctx, _fake = env
    with ctx.session_factory() as session:
        for name in ("n1", "n2"):
            node = session.get(Node, name)
            assert node is not None
            node.admin_state = "cordoned"
        gid, uid = seed_tenant(session)
        waiting = add_job(session, gid, uid, gpus=1)
    node_tick(ctx, time.time())
    schedule_tick(ctx, time.time())
    with ctx.session_factory() as session:
        job = session.get(Job, waiting)
        assert job is not None and job.state == "queued" and job.diagnosis is not None
        (reason,) = job.diagnosis.reasons
        assert reason.code == "node_not_ready" and "2 nodes cordoned" in reason.message


def test_a_lender_reclaims_a_borrowing_job_that_is_still_starting(
    env: tuple[ServerContext, FakeEngine],
) -> None:
    """A group's guarantee takes back GPUs from a borrowing job that is launched but not yet
    reported running (STARTING: an image pulled, a Slurm job pending): the scheduler picks it (the
    youngest borrowed work goes first) and the schedule loop preempts it, as a node drain does
    (the lifecycle allows STARTING -> PREEMPTED). It was refused as "no longer running", so the
    lender waited "for preemption" every cycle while nothing was being stopped."""
    ctx, fake = env
    with ctx.session_factory() as session:
        lender, owner = seed_tenant(session, group="owner", user="o", guaranteed=8)
        borrower_group, borrower = seed_tenant(session, group="borrower", user="b", guaranteed=0)
        borrowing = add_job(session, borrower_group, borrower, gpus=4, instances=2)
    schedule_tick(ctx, time.time())
    run_dispatch(ctx)
    assert job_state(ctx, borrowing) == "starting"  # launched; the engine reports it pending
    with ctx.session_factory() as session:
        owned = add_job(session, lender, owner, gpus=4)
    schedule_tick(ctx, time.time())
    assert job_state(ctx, borrowing) == "preempted"
    reconcile_tick(ctx, time.time())
    assert fake.stopped == [(f"{borrowing}.1", 30.0)]  # the profile's grace: the spec names none
    fake.finish(f"{borrowing}.1", 143)
    reconcile_tick(ctx, time.time())
    assert job_state(ctx, borrowing) == "queued"  # requeued, not failed
    schedule_tick(ctx, time.time())
    assert job_state(ctx, owned) in ("scheduled", "starting")


def _set_guarantee(ctx: ServerContext, gpus: int) -> None:
    with ctx.session_factory() as session:
        group = session.scalars(select(Group)).one()
        group.borrowing = False
        group.quotas[0].guaranteed = gpus
        session.commit()


def test_a_job_back_in_the_queue_is_told_why_it_waits_again(env: tuple[ServerContext, FakeEngine]) -> None:
    """The schedule loop writes a waiting job's diagnosis only when it changed since it last wrote
    it; placing the job clears the stored one. A job requeued (a retry, a preemption, a lost node)
    that waited for the same reason as before it was placed kept no diagnosis at all ("the
    scheduler has not looked at it yet"), as long as the reason stayed the same."""
    ctx, fake = env
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session, guaranteed=1)
        add_job(session, gid, uid, gpus=1, command="sleep 600")
        second = add_job(session, gid, uid, gpus=1, retries=1)
    _set_guarantee(ctx, 1)
    schedule_tick(ctx, time.time())

    def stored_code() -> str | None:
        with ctx.session_factory() as session:
            job = session.get(Job, second)
            assert job is not None and job.state == "queued"
            return job.diagnosis.reasons[0].code if job.diagnosis is not None else None

    assert stored_code() == "quota_exhausted"
    _set_guarantee(ctx, 2)
    schedule_tick(ctx, time.time())
    run_dispatch(ctx)
    fake.run(f"{second}.1")
    reconcile_tick(ctx, time.time())
    fake.finish(f"{second}.1", 1)
    reconcile_tick(ctx, time.time())  # its retry: back in the queue
    _set_guarantee(ctx, 1)
    schedule_tick(ctx, time.time())
    assert stored_code() == "quota_exhausted"
