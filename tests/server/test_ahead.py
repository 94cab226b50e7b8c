"""The schedule loop's pass that hands jobs to an engine with its own queue ahead of a freed slot
(server/ahead.py), on a real SQLite database with a fake engine that says it queues ahead."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from corral.db.models import Group, Job
from corral.db.session import make_engine
from corral.engine.base import NodeReport
from corral.scheduler.eta_calibration import EtaCalibration
from corral.scheduler.types import GPU
from corral.server.ahead import ahead_state
from corral.server.context import ServerContext
from corral.server.eta_record import calibration_of, load_outcomes
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import schedule_tick
from corral.server.snapshot import live_attempts, read_cluster_state
from corral.services.lifecycle import JobState
from tests.server.fakes import FakeEngine, add_job, make_context, run_dispatch, seed_tenant


class QueueingEngine(FakeEngine):
    """The fake engine, saying it keeps a queue of its own `depth` node-fulls deep."""

    def __init__(self, nodes: list[NodeReport], depth: int) -> None:
        super().__init__(nodes)
        self.queue_ahead_depth = depth


def small_node(name: str, cpus: int, gpus: int = 0) -> NodeReport:
    gpu = tuple(GPU(index=i, uuid=f"GPU-{name}-{i}", model="VGPU") for i in range(gpus))
    return NodeReport(name=name, cpus=cpus, memory_mib=8192, address="10.0.0.1", gpus=gpu)


def setup(tmp_path: Path, engine: FakeEngine) -> tuple[ServerContext, int, int]:
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), engine, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
    return ctx, gid, uid


def add_jobs(ctx: ServerContext, gid: int, uid: int, n: int, gpus: int = 0, instances: int = 1) -> list[int]:
    with ctx.session_factory() as session:
        return [add_job(session, gid, uid, gpus=gpus, instances=instances) for _ in range(n)]


def states(ctx: ServerContext, ids: list[int]) -> list[str]:
    with ctx.session_factory() as session:
        rows = dict(session.execute(select(Job.id, Job.state).where(Job.id.in_(ids))).all())
    return [rows[i] for i in ids]


def start_running(ctx: ServerContext, fake: QueueingEngine, ids: list[int]) -> None:
    """Schedule, launch and report running the jobs among `ids` that the normal pass places now
    (the ahead pass is held off meanwhile: the fake engine runs whatever it is handed, where a
    real one would hold the jobs queued ahead pending)."""
    depth, fake.queue_ahead_depth = fake.queue_ahead_depth, 0
    schedule_tick(ctx, time.time())
    fake.queue_ahead_depth = depth
    run_dispatch(ctx)
    for job_id, state in zip(ids, states(ctx, ids), strict=True):
        if state == JobState.STARTING.value:
            fake.run(f"{job_id}.1")
    reconcile_tick(ctx, time.time())


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_running_cpu_jobs_leave_their_slots_to_depth_node_fulls_of_waiting_jobs(
    tmp_path: Path, depth: int
) -> None:
    fake = QueueingEngine([small_node("c1", cpus=2)], depth)
    ctx, gid, uid = setup(tmp_path, fake)
    ids = add_jobs(ctx, gid, uid, 10)
    start_running(ctx, fake, ids)
    assert states(ctx, ids).count(JobState.RUNNING.value) == 2
    schedule_tick(ctx, time.time())
    run_dispatch(ctx)
    # behind the 2 running jobs: `depth` times the node's 2 CPUs, starting (pending in the engine)
    assert states(ctx, ids).count(JobState.STARTING.value) == 2 * depth
    schedule_tick(ctx, time.time())  # nothing more: the waiting ones fill the node's queue
    assert states(ctx, ids).count(JobState.QUEUED.value) == 10 - 2 - 2 * depth


def test_jobs_pending_in_the_engine_are_a_queue_to_wait_behind(tmp_path: Path) -> None:
    """With nothing running, a node whose slots are taken by jobs the engine holds pending still
    takes `depth` node-fulls in all: Slurm starts batch jobs at its scheduler's ticks (once a
    second), and a pass that waited for a running job placed nothing between those ticks."""
    fake = QueueingEngine([small_node("c1", cpus=2)], depth=2)
    ctx, gid, uid = setup(tmp_path, fake)
    ids = add_jobs(ctx, gid, uid, 10)
    schedule_tick(ctx, time.time())  # the normal pass takes the node's 2 CPUs, the ahead pass 2 more
    run_dispatch(ctx)
    assert states(ctx, ids).count(JobState.STARTING.value) == 2 * 2
    assert JobState.RUNNING.value not in states(ctx, ids)
    schedule_tick(ctx, time.time())  # the node's queue is full: 2 node-fulls placed, none running
    assert states(ctx, ids).count(JobState.QUEUED.value) == 10 - 2 * 2


def test_group_cpu_limit_counts_the_running_jobs_left_out_of_occupancy(tmp_path: Path) -> None:
    fake = QueueingEngine([small_node("c1", cpus=2)], depth=1)
    ctx, gid, uid = setup(tmp_path, fake)
    with ctx.session_factory() as session:
        group = session.get(Group, gid)
        assert group is not None
        group.cpus_max = 3.0
        session.commit()
    ids = add_jobs(ctx, gid, uid, 4)
    start_running(ctx, fake, ids)
    schedule_tick(ctx, time.time())
    # 2 running + 1 waiting = the group's 3 CPUs, though the node's queue has room for 2
    assert sorted(states(ctx, ids)) == ["queued", "running", "running", "scheduled"]


def test_gpu_jobs_keep_their_slots(tmp_path: Path) -> None:
    """A running job holding GPUs leaves nothing to a successor (GPU claims are per index)."""
    fake = QueueingEngine([small_node("g1", cpus=1, gpus=1)], depth=1)
    ctx, gid, uid = setup(tmp_path, fake)
    gpu_job = add_jobs(ctx, gid, uid, 1, gpus=1)
    start_running(ctx, fake, gpu_job)
    assert states(ctx, gpu_job) == ["running"]
    waiting = add_jobs(ctx, gid, uid, 1, gpus=1)
    schedule_tick(ctx, time.time())
    assert states(ctx, waiting) == ["queued"]


@pytest.mark.parametrize("first_state", ["running", "scheduled"])
def test_gpu_jobs_are_not_queued_behind_gpu_jobs_using_up_the_cpus(tmp_path: Path, first_state: str) -> None:
    """GPUs are free but the node's CPUs are all held by GPU jobs, running or pending in the
    engine: a GPU job placed there would wait behind jobs that may run for days while another
    node frees first. Only the CPUs and memory not held by GPU jobs count `depth` times."""
    fake = QueueingEngine([small_node("g1", cpus=2, gpus=4)], depth=4)
    ctx, gid, uid = setup(tmp_path, fake)
    first = add_jobs(ctx, gid, uid, 2, gpus=1)  # 1 GPU and 1 CPU each: the node's 2 CPUs
    if first_state == "running":
        start_running(ctx, fake, first)
    else:  # placed by the normal pass, not yet launched
        schedule_tick(ctx, time.time())
    assert states(ctx, first) == [first_state] * 2
    later = add_jobs(ctx, gid, uid, 2, gpus=1)
    schedule_tick(ctx, time.time())
    assert states(ctx, later) == ["queued", "queued"]


def test_a_job_bigger_than_the_part_that_turns_over_is_not_placed(tmp_path: Path) -> None:
    """A running GPU job holds 2 of the node's 4 CPUs, two running CPU jobs the other 2. A
    3-CPU job fits the node, but only once the GPU job ends too: it is left waiting; a 1-CPU job
    goes behind the CPU jobs."""
    fake = QueueingEngine([small_node("g1", cpus=4, gpus=2)], depth=2)
    ctx, gid, uid = setup(tmp_path, fake)
    running = add_jobs(ctx, gid, uid, 1, gpus=1, instances=2) + add_jobs(ctx, gid, uid, 2)
    start_running(ctx, fake, running)
    assert states(ctx, running) == ["running"] * 3
    triple = add_jobs(ctx, gid, uid, 1, instances=3)
    single = add_jobs(ctx, gid, uid, 1)
    schedule_tick(ctx, time.time())
    assert states(ctx, triple + single) == ["queued", "scheduled"]


def test_no_ahead_pass_where_no_job_could_wait_behind_another(tmp_path: Path) -> None:
    """A GPU backlog on a cluster whose live jobs all hold GPUs: the pass could place nothing, so
    it does not run (it was a second scheduling pass on every tick). A CPU job the engine holds
    pending is a queue to wait behind: then it runs, and still places no GPU job."""
    fake = QueueingEngine([small_node("g1", cpus=4, gpus=2)], depth=4)
    ctx, gid, uid = setup(tmp_path, fake)
    start_running(ctx, fake, add_jobs(ctx, gid, uid, 2, gpus=1))
    backlog = add_jobs(ctx, gid, uid, 3, gpus=1)
    with ctx.session_factory() as session:
        assert ahead_state(read_cluster_state(session), 4) is None
    cpu_job = add_jobs(ctx, gid, uid, 1)
    schedule_tick(ctx, time.time())
    assert states(ctx, cpu_job) == ["scheduled"]
    with ctx.session_factory() as session:
        assert ahead_state(read_cluster_state(session), 4) is not None
    assert states(ctx, backlog) == ["queued"] * 3


def test_a_job_that_fits_only_the_scaled_node_is_not_placed(tmp_path: Path) -> None:
    """Depth 2 counts a 1-CPU node as 2 CPUs; a job with two 1-CPU instances would fit that node,
    never the real one, and is left waiting instead of being handed to the engine."""
    fake = QueueingEngine([small_node("c1", cpus=1)], depth=2)
    ctx, gid, uid = setup(tmp_path, fake)
    running = add_jobs(ctx, gid, uid, 1)
    start_running(ctx, fake, running)
    assert states(ctx, running) == ["running"]
    pair = add_jobs(ctx, gid, uid, 1, instances=2)
    single = add_jobs(ctx, gid, uid, 1)
    schedule_tick(ctx, time.time())
    assert states(ctx, pair + single) == ["queued", "scheduled"]


def test_waiting_jobs_spread_over_the_nodes_queues(tmp_path: Path) -> None:
    """The default profile packs (bestfit); jobs handed ahead go where the engine's queue is
    shortest instead, so no node's queue holds the whole depth while another's slots free idle."""
    fake = QueueingEngine([small_node("c1", cpus=2), small_node("c2", cpus=2)], depth=2)
    ctx, gid, uid = setup(tmp_path, fake)
    running = add_jobs(ctx, gid, uid, 4)
    start_running(ctx, fake, running)
    assert states(ctx, running) == ["running"] * 4
    waiting = add_jobs(ctx, gid, uid, 4)
    schedule_tick(ctx, time.time())
    run_dispatch(ctx)
    assert states(ctx, waiting) == ["starting"] * 4
    with ctx.session_factory() as session:
        placed = live_attempts(session, waiting)
        nodes = sorted(p.node for a in placed.values() for p in a.placement)
    assert nodes == ["c1", "c1", "c2", "c2"]  # packed, all four would wait behind c1's two


def test_a_job_placed_ahead_is_an_eta_outcome_at_its_start_not_its_placement(tmp_path: Path) -> None:
    """Such a job starts when the job before it ends, not when it is placed: its outcome is the
    engine's start (server/eta_record.py), live and rebuilt, like any other job's. Its estimate was
    forgotten with the placement while outcomes were placements; since they are starts, the ahead
    jobs (most jobs on a busy Slurm cluster) are no longer left out of the calibration."""
    fake = QueueingEngine([small_node("c1", cpus=2)], depth=1)
    ctx, gid, uid = setup(tmp_path, fake)
    ids = add_jobs(ctx, gid, uid, 6)
    start_running(ctx, fake, ids)  # 2 run; the 4 waiting are shown an estimate
    with ctx.session_factory() as session:
        shown = dict(
            session.execute(select(Job.id, Job.eta_shown_at).where(Job.eta_shown_at.is_not(None))).all()
        )
    assert len(shown) == 4 and set(states(ctx, list(shown))) == {JobState.QUEUED.value}
    now = time.time()
    schedule_tick(ctx, now)  # 2 of them placed ahead, their estimates kept
    ahead = [i for i, state in zip(shown, states(ctx, list(shown)), strict=True) if state == "scheduled"]
    assert len(ahead) == 2
    with ctx.session_factory() as session:
        kept = dict(session.execute(select(Job.id, Job.eta_shown_at).where(Job.id.in_(ahead))).all())
        assert kept == {i: shown[i] for i in ahead}
        assert load_outcomes(session, EtaCalibration(), now) == 0  # placed, not started
    run_dispatch(ctx)  # handed to the engine, which starts them once the jobs before them end
    started = now + 500
    for job_id in ahead:
        fake.run(f"{job_id}.1", started)
    reconcile_tick(ctx, time.time())
    with ctx.session_factory() as session:
        rebuilt = EtaCalibration()
        assert load_outcomes(session, rebuilt, started + 1) == 2
        live = calibration_of(ctx, session, started + 1)
    assert live.outcomes() == rebuilt.outcomes() == 2
