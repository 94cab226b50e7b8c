"""The live loop and the simulator decide alike: for every cycle the simulator recorded
(snapshot, now, plan), writing that state into the database and building the snapshot the way
the schedule loop does gives the same placements, preemptions and borrowed flags."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

from corral.db.models import Attempt, GpuClaim, Group, GroupQuota, Job, Node, UsageLedger, User
from corral.db.session import make_engine
from corral.domain import InstancePlacement
from corral.scheduler import Scheduler
from corral.scheduler import types as st
from corral.server.nodes import gpu_row
from corral.server.scheduling import run_scheduler
from corral.server.snapshot import build_snapshot, read_cluster_state
from corral.sim.cluster import ClusterSpec, Pool
from corral.sim.replay import CycleRecord, SimConfig, Simulator
from corral.sim.runner import resolve_policy
from corral.sim.trace import Trace, TraceJob
from tests.server.fakes import FakeEngine, make_context


def small_trace(n: int = 60, seed: int = 7) -> Trace:
    rng = random.Random(seed)
    jobs = []
    t = 0.0
    for i in range(1, n + 1):
        t += rng.expovariate(1 / 40)
        instances = rng.choice((1, 1, 1, 2))
        per = rng.choice((1, 2, 4, 8)) if instances == 1 else rng.choice((2, 4))
        jobs.append(
            TraceJob(
                job_id=str(i),
                submit_time=t,
                duration=rng.uniform(60, 900),
                num_gpus=per * instances,
                group=rng.choice(("vision", "nlp", "speech")),
                user=rng.choice(("ann", "ben")),
                gpu_model=rng.choice((None, None, "A100")),
                instances=instances,
                cpus=2.0,
                memory_mib=4096,
                priority=rng.choice((st.Priority.LOW, st.Priority.NORMAL, st.Priority.HIGH)),
            )
        )
    return Trace(name="parity", jobs=tuple(jobs))


def cluster() -> ClusterSpec:
    return ClusterSpec(
        name="parity",
        pools=(Pool("a100", 2, 8, "A100", 64, 262144), Pool("v100", 2, 4, "V100", 32, 131072)),
        groups=(
            st.Group("vision", guaranteed={"*": 12}),
            st.Group("nlp", guaranteed={"*": 8}, max={"*": 16}),
            st.Group("speech", guaranteed={"*": 4}, weight=2.0),
        ),
    )


def _spec(job: st.Job) -> dict[str, object]:
    tasks = {
        t.role: {
            "instances": t.instances,
            "resources": {
                "gpus": t.resources.gpus,
                "gpu_model": t.resources.gpu_model,
                "cpus": t.resources.cpus,
                "memory": t.resources.memory_mib,
            },
            "command": "true",
        }
        for t in job.tasks
    }
    return {"version": 1, "name": f"j{job.id}", "tasks": tasks}


def write_state(session: object, snap: st.Snapshot, now: float) -> None:
    """The recorded snapshot as rows, the way the API and the loops would have left them."""
    from sqlalchemy.orm import Session

    assert isinstance(session, Session)
    for node in snap.nodes:
        session.add(
            Node(
                name=node.name,
                cpus=node.cpus,
                memory_mib=node.memory_mib,
                state=node.state.value,
                admin_state="none",
                labels=dict(node.labels),
                last_heartbeat=now,
                gpus=[gpu_row(g) for g in node.gpus],
            )
        )
    groups, users = {}, {}
    for g in snap.groups:
        models = set(g.guaranteed) | set(g.max or {})
        row = Group(
            name=g.name,
            weight=g.weight,
            borrowing=g.borrowing,
            user_max_gpus=g.user_max_gpus,
            created_at=now,
            quotas=[
                GroupQuota(gpu_model=m, guaranteed=g.guaranteed.get(m, 0), max=(g.max or {}).get(m))
                for m in sorted(models)
            ],
        )
        session.add(row)
        groups[g.name] = row
    session.flush()
    for job in [*snap.queued, *(r.job for r in snap.running)]:
        if job.user not in users:
            users[job.user] = User(name=job.user, created_at=now)
            session.add(users[job.user])
    session.flush()

    def add_job(job: st.Job, state: str) -> Job:
        row = Job(
            id=int(job.id),
            name=f"j{job.id}",
            user_id=users[job.user].id,
            group_id=groups[job.group].id,
            state=state,
            priority=int(job.priority),
            preemptible=job.preemptible,
            spec=_spec(job),
            runtime_estimate_s=job.runtime_estimate,
            submitted_at=job.submit_time,
            updated_at=now,
            attained_gpu_seconds=job.attained_gpu_seconds,
            preemptions=job.preemptions,
            attempt_count=0 if state == "queued" else 1,
        )
        session.add(row)
        return row

    for job in snap.queued:
        add_job(job, "queued")
    for run in snap.running:
        job_row = add_job(run.job, "preempted" if run.stopping else "running")
        if run.stopping:  # the live loop keeps when the stop ends as PREEMPTED-since + grace
            assert run.stops_by is not None
            job_row.updated_at = run.stops_by
        placement = tuple(
            InstancePlacement(
                role=p.role,
                index=p.index,
                rank=k,
                node=p.node,
                gpu_indices=p.gpu_indices,
                gpu_uuids=tuple(f"GPU-{p.node}-{i}" for i in p.gpu_indices),
                cpus=p.cpus,
                memory_mib=p.memory_mib,
            )
            for k, p in enumerate(run.allocation.instances)
        )
        attempt = Attempt(
            job_id=int(run.job.id),
            number=1,
            state="running",
            placement=placement,
            borrowed=run.borrowed,
            created_at=run.start_time,
            started_at=run.start_time,
            stop_grace_s=0.0 if run.stopping else None,
        )
        session.add(attempt)
        session.flush()
        for p in run.allocation.instances:
            for i in p.gpu_indices:
                session.add(GpuClaim(node=p.node, gpu_index=i, attempt_pk=attempt.id, job_id=int(run.job.id)))
    for (group, user), value in snap.usage.by_user.items():
        session.add(UsageLedger(group_name=group, user_name=user, gpu_seconds=value, updated_at=now))
    session.commit()


def canonical(plan: st.Plan) -> tuple[object, ...]:
    return (
        sorted(
            (
                a.job_id,
                a.borrowed,
                sorted((p.role, p.index, p.node, p.gpu_indices) for p in a.allocation.instances),
            )
            for a in plan.assignments
        ),
        sorted((p.job_id, p.grace_s) for p in plan.preemptions),
    )


def test_live_snapshot_gives_the_simulators_placements(
    tmp_path: Path,
) -> None:
    sim = Simulator(
        small_trace(),
        cluster(),
        resolve_policy("default"),
        "default",
        SimConfig(record_cycles=True, usage_half_life_s=7 * 24 * 3600.0),
    )
    result = sim.run()
    busy = [r for r in result.records if r.plan.assignments or r.plan.preemptions]
    # Every cycle that preempted, and enough others to cover borrowing and gangs (time bound).
    records = [r for r in busy if r.plan.preemptions] + [r for r in busy if not r.plan.preemptions][:20]
    assert sum(bool(r.plan.preemptions) for r in records) >= 3 and any(r.snapshot.running for r in records)
    assert any(a.borrowed for r in records for a in r.plan.assignments)
    # Jobs still in their preemption grace are in the snapshots too (as stopping), and survive
    # the round trip through the database.
    assert any(run.stopping for r in records for run in r.snapshot.running)
    for k, record in enumerate(records):
        db = make_engine(f"sqlite:///{tmp_path / f'c{k}.db'}")
        ctx = make_context(db, FakeEngine(), str(tmp_path))
        with ctx.session_factory() as session:
            write_state(session, record.snapshot, record.now)
            live = build_snapshot(read_cluster_state(session), record.now)
        assert {j.id for j in live.queued} == {j.id for j in record.snapshot.queued}
        assert {r.job.id for r in live.running} == {r.job.id for r in record.snapshot.running}
        expected = canonical(record.plan)
        assert canonical(run_scheduler(live, record.now, random.Random(0))) == expected, (
            f"cycle at {record.now}"
        )
        db.dispose()


def test_live_snapshot_carries_the_overload_policy_state(tmp_path: Path) -> None:
    """The default policy's newer state survives the database: waiting jobs past the starvation
    guard (submit time), running jobs at the preemption bound (Job.preemptions), and the runtime
    estimates the size order reads. Recorded cycles are aged and marked, then replanned both ways."""
    config = SimConfig(record_cycles=True)
    result = Simulator(small_trace(), cluster(), resolve_policy("default"), "default", config).run()
    profile = resolve_policy("default").profile

    def crowded(r: CycleRecord) -> bool:  # jobs left waiting, and borrowed work running
        waiting = len(r.snapshot.queued) > len(r.plan.assignments) + 1
        return waiting and any(x.borrowed for x in r.snapshot.running)

    # cycles that reclaimed borrowed work (the bound spares those victims), and crowded ones
    records = result.records
    cycles = [r for r in records if r.plan.preemptions][:8] + [r for r in records if crowded(r)][:8]
    assert cycles
    changed = 0
    for k, record in enumerate(cycles):
        snap = record.snapshot
        old = record.now - profile.starvation_s - 1.0
        queued = tuple(
            dataclasses.replace(j, submit_time=old - i) if i % 2 else j for i, j in enumerate(snap.queued)
        )
        running = tuple(
            dataclasses.replace(r, job=dataclasses.replace(r.job, preemptions=profile.max_preemptions))
            if r.borrowed
            else r
            for r in snap.running
        )
        aged = dataclasses.replace(snap, queued=queued, running=running)
        expected = canonical(Scheduler(profile).schedule(aged, record.now, random.Random(0)))
        changed += expected != canonical(record.plan)
        db = make_engine(f"sqlite:///{tmp_path / f'o{k}.db'}")
        ctx = make_context(db, FakeEngine(), str(tmp_path))
        with ctx.session_factory() as session:
            write_state(session, aged, record.now)
            live = build_snapshot(read_cluster_state(session), record.now)
        assert canonical(run_scheduler(live, record.now, random.Random(0))) == expected, f"cycle {record.now}"
        db.dispose()
    assert changed >= 2  # the aged and marked state changed plans: the round trip carries it


def test_a_job_its_quota_holds_is_diagnosed_alike_live_and_simulated(tmp_path: Path) -> None:
    """On a full cluster, jobs their group's quota (borrowing off) or their user's cap holds: the
    live loop's snapshot (from the database) gives the plan and the diagnoses the simulator's
    scheduler gives on the same state, the quota or cap reason with no time (what the API shows as
    `diagnosis.held`), and no reservation for them: the other group's 1-GPU job starts."""
    from tests.scheduler.builders import gpu_node, job, running

    groups = (
        st.Group("a", guaranteed={"*": 4}, borrowing=False),
        st.Group("b"),
        st.Group("c", user_max_gpus=2),
    )
    run = (
        running(job("1", gpus=4, group="a", runtime=5000.0, preemptible=False), "n1", (0, 1, 2, 3)),
        running(job("2", gpus=2, group="c", user="cat", runtime=5000.0, preemptible=False), "n1", (4, 5)),
        running(job("3", gpus=1, group="b", user="bob", runtime=1100.0, preemptible=False), "n1", (6,)),
    )
    queued = (
        job("4", gpus=2, group="a", submit=1.0),
        job("5", gpus=2, group="c", user="cat", submit=2.0),
        job("6", gpus=1, group="b", user="bob", submit=3.0, runtime=500.0),
    )
    usage = st.Usage(by_group={"b": 1e9}, by_user={("b", "bob"): 1e9})  # a and c take their turns first
    snap = st.Snapshot((gpu_node("n1", gpus=8),), groups, queued, run, usage)
    now = 1000.0
    simulated = Scheduler(resolve_policy("default").profile).schedule(snap, now, random.Random(0))
    db = make_engine(f"sqlite:///{tmp_path / 'held.db'}")
    ctx = make_context(db, FakeEngine(), str(tmp_path))
    with ctx.session_factory() as session:
        write_state(session, snap, now)
        live_plan = run_scheduler(build_snapshot(read_cluster_state(session), now), now, random.Random(0))
    db.dispose()
    assert canonical(live_plan) == canonical(simulated)
    assert [a.job_id for a in live_plan.assignments] == ["6"]

    def shown(plan: st.Plan) -> dict[str, tuple[tuple[str, ...], float | None]]:
        return {j: (tuple(r.code for r in d.reasons), d.estimated_start) for j, d in plan.diagnoses.items()}

    assert shown(live_plan) == shown(simulated)
    assert shown(live_plan) == {"4": (("quota_exhausted",), None), "5": (("user_cap",), None)}
