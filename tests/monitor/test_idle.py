"""Idle-GPU policy: a job's own `idle_gpu` policy or the admin rule warns the owner, then stops or
requeues the job; utilization coming back clears it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from corral.cli import workspaces as cli_workspaces
from corral.db.models import Gpu, GpuClaim, Job, JobEvent
from corral.db.workspace_models import Workspace
from corral.monitor.config import IdleGpuRule
from corral.monitor.idle import enforce_idle_policy, job_policy
from corral.monitor.loops import idle_tick, session_use_tick
from corral.monitor.models import Alert, AlertNotification, GpuReading, IdleGpuWatch
from corral.server.context import ServerContext
from corral.services import accounts, workspaces
from corral.services.auth import Principal, load_principal
from corral.services.lifecycle import JobState, transition
from corral.services.policy import active_profile
from corral.services.session_use import SessionUse
from corral.spec import JobSpecV1, ValidationError
from tests.monitor.conftest import Mon
from tests.server.fakes import FakeEngine


def running_jobs(mon: Mon) -> list[int]:
    with mon.factory() as db:
        return sorted(set(db.scalars(select(GpuClaim.job_id))))


def set_util(mon: Mon, job_id: int, percent: float, now: float) -> None:
    with mon.factory() as db:
        for claim in db.scalars(select(GpuClaim).where(GpuClaim.job_id == job_id)):
            db.execute(
                update(GpuReading)
                .where(GpuReading.node == claim.node, GpuReading.gpu_index == claim.gpu_index)
                .values(utilization_percent=percent, sampled_at=now, present=True)
            )
        db.commit()


def spec_with(idle_gpu: dict[str, object] | None, name: str = "j") -> JobSpecV1:
    return JobSpecV1.model_validate(
        {"name": name, "command": "true", **({"idle_gpu": idle_gpu} if idle_gpu else {})}
    )


def set_spec(mon: Mon, job_id: int, idle_gpu: dict[str, object] | None) -> None:
    with mon.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        job.spec = spec_with(idle_gpu, job.name)
        db.commit()


def run(mon: Mon, now: float, admin: IdleGpuRule | None = None) -> list[tuple[int, str]]:
    with mon.factory() as db:
        return enforce_idle_policy(db, now, admin, ["ops"])


def idle_events(mon: Mon, job_id: int) -> list[str]:
    with mon.factory() as db:
        return list(
            db.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id, JobEvent.kind == "idle_gpu"))
        )


def test_job_policy_warns_then_stops(mon: Mon) -> None:
    job_id, other = running_jobs(mon)
    now = time.time()
    set_spec(mon, job_id, {"below_percent": 20, "for": "30m", "grace": "10m", "action": "stop"})
    set_util(mon, job_id, 5.0, now)
    set_util(mon, other, 5.0, now)  # no policy anywhere: left alone
    assert run(mon, now) == []  # idle since now
    assert run(mon, now + 29 * 60) == []
    set_util(mon, job_id, 5.0, now + 31 * 60)
    assert run(mon, now + 31 * 60) == [(job_id, "warned")]
    (warning,) = idle_events(mon, job_id)
    assert "mean utilization 5.0% < 20%" in warning and "it will be stopped in 600 s" in warning
    with mon.factory() as db:
        (alert,) = db.scalars(select(Alert).where(Alert.name == "CorralJobGpuIdle"))
        assert alert.status == "firing" and alert.labels["job_id"] == str(job_id)
        assert alert.labels["user"].startswith("user")
    set_util(mon, job_id, 5.0, now + 42 * 60)
    assert run(mon, now + 42 * 60) == [(job_id, "stopped")]
    with mon.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None and job.cancel_requested and job.state == "running"  # reconcile does the stop
        assert not db.get(Job, other).cancel_requested  # type: ignore[union-attr]
    assert run(mon, now + 43 * 60) == []  # acted once


def test_admin_rule_requeues_and_recovery_clears(mon: Mon) -> None:
    job_id, other = running_jobs(mon)
    rule = IdleGpuRule.model_validate({"below_percent": 10, "for": "1h", "grace": 0, "action": "requeue"})
    now = time.time()
    set_util(mon, job_id, 2.0, now)
    set_util(mon, other, 80.0, now)  # busy: never touched
    run(mon, now, rule)
    set_util(mon, job_id, 2.0, now + 3601)
    set_util(mon, other, 80.0, now + 3601)
    assert run(mon, now + 3601, rule) == [(job_id, "warned")]
    set_util(mon, job_id, 50.0, now + 3602)  # back to work: watch and alert cleared
    assert run(mon, now + 3602, rule) == []
    with mon.factory() as db:
        (alert,) = db.scalars(select(Alert).where(Alert.name == "CorralJobGpuIdle"))
        assert alert.status == "resolved"
    set_util(mon, job_id, 1.0, now + 4000)
    run(mon, now + 4000, rule)
    set_util(mon, job_id, 1.0, now + 7601)
    assert run(mon, now + 7601, rule) == [(job_id, "warned")]
    set_util(mon, job_id, 1.0, now + 7602)
    assert run(mon, now + 7602, rule) == [(job_id, "requeued")]
    with mon.factory() as db:
        assert db.get(Job, job_id).state == "preempted"  # type: ignore[union-attr]
        assert db.get(Job, other).state == "running"  # type: ignore[union-attr]


def test_job_policy_overrides_admin_rule_and_bad_policy_falls_back() -> None:
    admin = IdleGpuRule.model_validate({"below_percent": 10, "for": "1h", "action": "stop"})
    mine = job_policy(spec_with({"below_percent": 30, "for": "2h"}), admin)
    assert mine is not None and mine.below_percent == 30 and mine.for_s == 7200 and mine.action == "stop"
    with pytest.raises(ValidationError, match="below_percent"):  # refused at submit, never stored
        spec_with({"below_percent": 300, "for": "1h"})
    assert job_policy(spec_with(None), admin) == admin
    assert job_policy(spec_with(None), None) is None


def idle_alerts(mon: Mon) -> dict[str, Alert]:
    with mon.factory() as db:
        rows = db.scalars(select(Alert).where(Alert.name == "CorralJobGpuIdle"))
        return {a.labels["job_id"]: a for a in rows}


def test_alert_resolves_when_the_job_ends_or_its_watch_is_dropped(mon: Mon) -> None:
    """Issue 17: the alert of a job that ended kept firing (the watch was dropped, the alert not)."""
    ended, unwatched = running_jobs(mon)
    rule = IdleGpuRule.model_validate({"below_percent": 10, "for": "1m", "action": "warn"})
    now = time.time()
    for t in (now, now + 61):
        set_util(mon, ended, 1.0, t)
        set_util(mon, unwatched, 1.0, t)
        run(mon, t, rule)
    assert {a.status for a in idle_alerts(mon).values()} == {"firing"}
    with mon.factory() as db:
        job = db.get(Job, ended)
        assert job is not None
        assert transition(db, job, JobState.SUCCEEDED, now=now + 70, message="exit 0")
        db.commit()
    set_util(mon, unwatched, 1.0, now + 90)
    assert run(mon, now + 90, rule) == []
    alerts = idle_alerts(mon)
    assert alerts[str(ended)].status == "resolved" and alerts[str(ended)].ends_at == now + 90
    assert alerts[str(unwatched)].status == "firing"  # still running, still idle
    assert run(mon, now + 100, None) == []  # no rule any more: the other watch is dropped too
    alerts = idle_alerts(mon)
    assert alerts[str(unwatched)].status == "resolved" and alerts[str(unwatched)].ends_at == now + 100
    with mon.factory() as db:
        assert not list(db.scalars(select(IdleGpuWatch)))
        resolved = db.scalars(select(AlertNotification).where(AlertNotification.alert_status == "resolved"))
        assert sorted(n.alert_id for n in resolved) == sorted(a.id for a in alerts.values())  # notified
    assert run(mon, now + 110, None) == []  # resolved once: nothing more queued
    with mon.factory() as db:
        assert len(list(db.scalars(select(AlertNotification)))) == 4  # 2 firing + 2 resolved, channel "ops"


def make_workspace(mon: Mon, job_id: int) -> None:
    with mon.factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        db.add(
            Workspace(
                name="nb", user_id=job.user_id, group_id=job.group_id, gpus=job.spec.total_gpus,
                gpu_model=None, cpus=1.0, memory_mib=1024, environment="default", idle_timeout_s=None,
                current_job_id=job_id, jupyter_token="t", created_at=0.0, updated_at=0.0,
            )
        )  # fmt: skip
        db.commit()


def unsample_gpus(mon: Mon, job_ids: list[int], uuid_prefix: str) -> None:
    """The jobs' GPUs get non-virtual UUIDs (`SLURM-...` as Slurm's, `GPU-...` as NVML's) and
    lose their readings."""
    with mon.factory() as db:
        for claim in db.scalars(select(GpuClaim).where(GpuClaim.job_id.in_(job_ids))):
            on = (Gpu.node_name == claim.node) & (Gpu.index == claim.gpu_index)
            db.execute(update(Gpu).where(on).values(uuid=f"{uuid_prefix}{claim.node}-gpu{claim.gpu_index}"))
            read = (GpuReading.node == claim.node) & (GpuReading.gpu_index == claim.gpu_index)
            db.execute(delete(GpuReading).where(read))
        db.commit()


def test_an_unsampled_gpu_workspace_is_judged_by_its_use_and_an_unsampled_batch_job_left_alone(
    mon: Mon,
) -> None:
    """GPUs nobody samples (a Slurm node's: not virtual, not the server's node, no reading at
    all): a workspace holding them is stopped when nobody uses it (JupyterLab, SSH), a batch job
    holding them never is."""
    workspace, batch = running_jobs(mon)
    unsample_gpus(mon, [workspace, batch], "SLURM-")
    policy = {"below_percent": 10, "for": "30m", "grace": "10m", "action": "stop"}
    with mon.factory() as db:
        for job_id in (workspace, batch):
            job = db.get(Job, job_id)
            assert job is not None
            job.spec = JobSpecV1.model_validate(
                {"name": "j", "command": "true", "resources": {"gpus": 2}, "idle_gpu": policy}
            )
        db.commit()
    make_workspace(mon, workspace)
    ctx = ServerContext(settings=mon.settings, session_factory=mon.factory, engine=FakeEngine(), owner_id="t")
    use = ctx.memory.session_use = SessionUse()
    now = time.time()
    use.opened(workspace)
    for minute in (0, 31, 62, 93):  # an SSH session open all along: in use at every pass
        idle_tick(ctx, now + minute * 60)
    use.closed(workspace, now + 94 * 60)  # closed (and JupyterLab, not reachable here, gives no evidence)
    idle_tick(ctx, now + 100 * 60)  # idle since
    idle_tick(ctx, now + 131 * 60)
    # its use alone was judged: said so, not a GPU utilization of 0.0% that nobody measured
    assert idle_events(mon, workspace) == [
        "unused for 1860 s (no JupyterLab, SSH or exec; no GPU utilization is measured for it); "
        "it will be stopped in 600 s"
    ]
    alert = idle_alerts(mon)[str(workspace)]
    assert (alert.status, alert.annotations["summary"]) == (
        "firing",
        f"job {workspace} unused for 1860 s (no GPU utilization is measured for it)",
    )
    idle_tick(ctx, now + 142 * 60)
    assert idle_events(mon, workspace)[1:] == ["still unused 600 s after the warning: stopped"]
    with mon.factory() as db:
        assert db.get(Job, workspace).cancel_requested  # type: ignore[union-attr]
        assert not db.get(Job, batch).cancel_requested  # type: ignore[union-attr]
        assert [w.job_id for w in db.scalars(select(IdleGpuWatch))] == [workspace]
    assert idle_events(mon, batch) == []


@pytest.mark.parametrize(
    "readings", ["stale", "none from the server's own node", "stale from another server's node"]
)
def test_a_workspace_on_sampled_gpus_without_fresh_readings_is_not_stopped(mon: Mon, readings: str) -> None:
    """A workspace holding GPUs a sampler covers is judged by their readings: stale ones (the
    sampler stopped; also when it ran on another server's node than the idle check's, as the two
    loops hold separate leases) or none at all (NVML failed to start on the server's node) are
    no evidence, however unused its JupyterLab and SSH; it is not stopped while its GPUs may be
    training."""
    workspace, _ = running_jobs(mon)
    now = time.time()
    settings = mon.settings
    if readings == "stale":
        set_util(mon, workspace, 100.0, now - 3600)  # virtual GPUs, last read an hour ago
    elif readings == "stale from another server's node":
        with mon.factory() as db:  # real GPUs of a node that is not this server's
            for claim in db.scalars(select(GpuClaim).where(GpuClaim.job_id == workspace)):
                on = (Gpu.node_name == claim.node) & (Gpu.index == claim.gpu_index)
                db.execute(update(Gpu).where(on).values(uuid=f"GPU-{claim.node}-gpu{claim.gpu_index}"))
            db.commit()
        set_util(mon, workspace, 100.0, now - 3600)
        assert settings.node_name not in {c.node for c in mon.factory().scalars(select(GpuClaim))}
    else:
        unsample_gpus(mon, [workspace], "GPU-")
        with mon.factory() as db:
            node = db.scalars(select(GpuClaim.node).where(GpuClaim.job_id == workspace)).first()
        settings = settings.model_copy(update={"node_name": node})  # the server runs on that node
    set_spec(mon, workspace, {"below_percent": 10, "for": "30m", "grace": "10m", "action": "stop"})
    make_workspace(mon, workspace)
    ctx = ServerContext(settings=settings, session_factory=mon.factory, engine=FakeEngine(), owner_id="t")
    for minute in (0, 31, 42, 60):
        idle_tick(ctx, now + minute * 60)
    with mon.factory() as db:
        assert not db.get(Job, workspace).cancel_requested  # type: ignore[union-attr]
        assert not list(db.scalars(select(IdleGpuWatch)))
    assert idle_events(mon, workspace) == []


def unsampled_workspace(mon: Mon) -> tuple[int, ServerContext]:
    """A workspace on GPUs nobody samples, policy 30 min + 10 min grace, and a server context."""
    workspace, _ = running_jobs(mon)
    unsample_gpus(mon, [workspace], "SLURM-")
    set_spec(mon, workspace, {"below_percent": 10, "for": "30m", "grace": "10m", "action": "stop"})
    make_workspace(mon, workspace)
    return workspace, ServerContext(
        settings=mon.settings, session_factory=mon.factory, engine=FakeEngine(), owner_id="t"
    )


def test_a_session_opened_and_closed_between_two_checks_counts_as_use(mon: Mon) -> None:
    """A short `ssh ws cmd`, an scp, a `corral exec`: open at no check, yet its close time is use
    after the watch began, which restarts it; without it the workspace is warned on time."""
    workspace, ctx = unsampled_workspace(mon)
    use = ctx.memory.session_use = SessionUse()
    now = time.time()
    idle_tick(ctx, now)  # idle since now
    use.opened(workspace)
    use.closed(workspace, now + 20 * 60)  # a two-second command, between two checks
    idle_tick(ctx, now + 31 * 60)  # used 11 min ago: not idle for 30 min, the watch restarts
    assert idle_events(mon, workspace) == []
    idle_tick(ctx, now + 32 * 60)  # idle since here
    idle_tick(ctx, now + 61 * 60)
    assert idle_events(mon, workspace) == []
    idle_tick(ctx, now + 63 * 60)
    assert idle_events(mon, workspace) == [
        "unused for 1860 s (no JupyterLab, SSH or exec; no GPU utilization is measured for it); "
        "it will be stopped in 600 s"
    ]


def test_a_session_held_by_another_server_counts_through_the_database(mon: Mon) -> None:
    """Server B's gateway holds an SSH session into the workspace; B's session-use loop writes its
    last use to the workspace row, and server A's idle check, which sees no session of its own,
    counts it. A's SessionUse never moves the row's time back."""
    workspace, ctx_a = unsampled_workspace(mon)
    ctx_a.memory.session_use = SessionUse()
    ctx_b = ServerContext(
        settings=mon.settings, session_factory=mon.factory, engine=FakeEngine(), owner_id="b"
    )
    use_b = ctx_b.memory.session_use = SessionUse()
    now = time.time()
    idle_tick(ctx_a, now)  # idle since now
    use_b.opened(workspace)
    for minute in (10, 20, 30, 40):  # B's loop every 30 s in production; coarser here
        session_use_tick(ctx_b, now + minute * 60)
        session_use_tick(ctx_a, now + minute * 60)  # A has nothing to write
        idle_tick(ctx_a, now + minute * 60 + 1)
    with mon.factory() as db:
        (row,) = db.scalars(select(Workspace).where(Workspace.current_job_id == workspace))
        assert row.last_used_at == now + 40 * 60
    assert idle_events(mon, workspace) == []
    use_b.closed(workspace, now + 41 * 60)
    session_use_tick(ctx_b, now + 41 * 60 + 30)
    idle_tick(ctx_a, now + 42 * 60)  # used at +41: the watch restarts
    idle_tick(ctx_a, now + 43 * 60)  # idle since here
    idle_tick(ctx_a, now + 72 * 60)
    assert idle_events(mon, workspace) == []
    idle_tick(ctx_a, now + 74 * 60)
    assert len(idle_events(mon, workspace)) == 1


def test_an_idle_stopped_workspace_says_so_and_when(mon: Mon) -> None:
    """`corral ws ls/show` of a workspace the idle policy stopped showed only "job N (cancelled)":
    nothing said it was stopped for being idle, nor when."""
    workspace, ctx = unsampled_workspace(mon)
    ctx.memory.session_use = SessionUse()
    now = time.time()

    def view() -> dict[str, Any]:
        with mon.factory() as db:
            job = db.get(Job, workspace)
            assert job is not None
            principal = load_principal(db, job.user, via="token")
            (one,) = workspaces.list_workspaces(db, principal, mon.settings)
            return dict(one)

    idle_tick(ctx, now)
    idle_tick(ctx, now + 31 * 60)  # warned
    assert view()["idle_stopped_at"] is None
    idle_tick(ctx, now + 42 * 60)  # stopped
    stopped = view()
    assert stopped["idle_stopped_at"] == pytest.approx(now + 42 * 60)
    assert cli_workspaces._state(stopped).startswith("stopping (idle, ")  # then "stopped (idle, 2h ago)"
    with mon.factory() as db:  # recorded on the workspace with the cancel, not found in an event
        row = db.scalars(select(Workspace).where(Workspace.current_job_id == workspace)).one()
        job = db.get(Job, workspace)
        assert job is not None and job.cancel_requested
        assert row.idle_stopped_at == pytest.approx(now + 42 * 60)
        db.execute(update(JobEvent).where(JobEvent.job_id == workspace).values(message="reworded"))
        db.commit()
    assert view()["idle_stopped_at"] == pytest.approx(now + 42 * 60)  # the message's words do not matter


def principal_and_workspace(db: Session, job_id: int) -> tuple[Principal, Workspace]:
    job = db.get(Job, job_id)
    assert job is not None
    ws = db.scalars(select(Workspace).where(Workspace.current_job_id == job_id)).one()
    return load_principal(db, job.user, via="token"), ws


def test_a_restart_clears_the_idle_stop_and_a_stop_by_hand_is_not_one(mon: Mon) -> None:
    """`corral ws start` after an idle stop: the new job was not stopped for being idle, nor is
    it when its owner stops it."""
    workspace, ctx = unsampled_workspace(mon)
    ctx.memory.session_use = SessionUse()
    now = time.time()
    for minute in (0, 31, 42):  # idle since now, warned, stopped
        idle_tick(ctx, now + minute * 60)
    with mon.factory() as db:
        job = db.get(Job, workspace)
        assert job is not None and job.cancel_requested
        assert transition(db, job, JobState.CANCELLED, now=now + 43 * 60, message="stopped")  # reconcile's
        accounts.add_member(db, job.group, job.user)  # the synthetic owner may submit to its group
        db.commit()
        principal, ws = principal_and_workspace(db, workspace)
        assert ws.idle_stopped_at == pytest.approx(now + 42 * 60)
        assert workspaces.get_workspace(db, principal, mon.settings, "nb")["idle_stopped_at"] is not None
        started = workspaces.start_workspace(
            db, principal, mon.settings, active_profile(mon.settings), "nb", None
        )
        assert started["job_id"] != workspace and started["state"] == "pending"
        assert started["idle_stopped_at"] is None
        assert cli_workspaces._state(dict(started)) == "pending"
    with mon.factory() as db:
        principal, ws = principal_and_workspace(db, started["job_id"])
        assert ws.idle_stopped_at is None  # committed with the start
        stopped = workspaces.stop_workspace(db, principal, mon.settings, "nb", None)
        assert stopped["idle_stopped_at"] is None  # a cancel by hand is not an idle stop
        (listed,) = workspaces.list_workspaces(db, principal, mon.settings)
        assert listed["job_id"] == started["job_id"] and listed["idle_stopped_at"] is None
