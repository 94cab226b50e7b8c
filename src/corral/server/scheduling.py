"""The schedule loop: snapshot -> the server's `corral.scheduler.Scheduler` -> `apply_plan` with a
database `PlanSink` (the simulator applies plans through the same `apply_plan`).

One Scheduler per ServerContext (`scheduler_for`), kept across ticks so its caches (node tables,
per-job needs) serve the next cycle; a new one when the configured profile changes.

Apply, per assignment, in one transaction: re-check that the job is still queued and the nodes
still ready, create the Attempt (placement with GPU uuids and ranks) and its GpuClaim rows (their
primary key makes a double allocation fail instead of happen), then QUEUED -> SCHEDULED.
Preemptions mark the victim PREEMPTED with its grace period; the reconcile loop sends the stop and
requeues it once the engine reports it ended. Diagnoses of waiting jobs are written to
`Job.diagnosis` only when they change (since this loop last wrote them while the job waited: placing
a job clears its diagnosis), so an idle queue costs no writes.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Collection, Mapping, Sequence, Set
from dataclasses import dataclass, replace

from sqlalchemy import bindparam, insert, select, tuple_, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload

from corral.db.base import table_of
from corral.db.models import Attempt, Gpu, GpuClaim, Job, Node
from corral.domain import InstancePlacement, JobDiagnosis, PendingReason, Placement
from corral.monitor.metrics import record_scheduler_cycle
from corral.scheduler import PROFILES, Profile, Scheduler, apply_plan
from corral.scheduler import types as st
from corral.server.ahead import place_ahead, queues_ahead
from corral.server.context import ServerContext
from corral.server.dispatch import launch_placed
from corral.server.eta_record import calibrated, calibration_of, note_shown
from corral.server.finish import claimed_gpus
from corral.server.snapshot import ShapeCache, build_snapshot, live_attempts, read_cluster_state
from corral.server.specview import read_spec
from corral.services.lifecycle import (
    AttemptState,
    GpuHealth,
    JobState,
    schedule_jobs,
    transition,
)
from corral.services.policy import active_profile

log = logging.getLogger("corral.server.schedule")
# An estimated start that moved less than this is not rewritten: ETA_SLACK_S, or ETA_SLACK_SHARE
# of the wait it showed when longer (each new outcome moves a many-hour corrected wait by minutes).
ETA_SLACK_S = 5.0
ETA_SLACK_SHARE = 0.01


def scheduler_for(ctx: ServerContext, profile: Profile, slot: str = "scheduler") -> Scheduler:
    """The context's Scheduler for `profile`: the same object tick after tick (its caches are
    its own), a new one when the profile changes. `slot`: the LoopMemory field that keeps it
    (the ahead pass has its own, `ahead_scheduler`, so the two passes' caches never mix)."""
    current: Scheduler | None = getattr(ctx.memory, slot)
    if current is None or current.profile != profile:
        current = Scheduler(profile)
        setattr(ctx.memory, slot, current)
    return current


def run_scheduler(
    snapshot: st.Snapshot, now: float, rng: random.Random, profile: Profile | None = None
) -> st.Plan:
    """One cycle of the scheduler library with a fresh Scheduler (the simulator's plans, for tests)."""
    return Scheduler(profile if profile is not None else PROFILES["default"]).schedule(snapshot, now, rng)


def stored_diagnosis(diagnosis: st.Diagnosis) -> JobDiagnosis:
    return JobDiagnosis(
        reasons=tuple(PendingReason(r.code, r.source, r.message) for r in diagnosis.reasons),
        queue_position=diagnosis.queue_position,
        estimated_start=diagnosis.estimated_start,
        unschedulable=diagnosis.unschedulable,
        start_range=diagnosis.start_range,
    )


def stored_placement(job: Job, allocation: st.Allocation, uuids: Mapping[tuple[str, int], str]) -> Placement:
    """Instances in rank order: roles in spec order, then index (rank 0 = first role's index 0)."""
    order = {t.role: i for i, t in enumerate(read_spec(job.spec).tasks)}
    ordered = sorted(allocation.instances, key=lambda p: (order.get(p.role, len(order)), p.role, p.index))
    return tuple(
        InstancePlacement(
            role=p.role,
            index=p.index,
            rank=rank,
            node=p.node,
            gpu_indices=tuple(p.gpu_indices),
            gpu_uuids=tuple(uuids.get((p.node, i), f"{p.node}-gpu{i}") for i in p.gpu_indices),
            cpus=p.cpus,
            memory_mib=p.memory_mib,
        )
        for rank, p in enumerate(ordered)
    )


@dataclass(frozen=True, slots=True)
class PlacementFit:
    """An assignment that still fits in fresh rows: its job, nodes and GPUs (node, index)."""

    assignment: st.Assignment
    job: Job
    nodes: dict[str, Node]
    gpus: frozenset[tuple[str, int]]

    @property
    def message(self) -> str:
        return f"placed on {', '.join(sorted(self.nodes))}"

    def attempt_columns(self, number: int, now: float) -> dict[str, object]:
        uuids = {(n.name, g.index): g.uuid for n in self.nodes.values() for g in n.gpus}
        return {
            "job_id": self.job.id,
            "number": number,
            "state": AttemptState.SCHEDULED.value,
            "placement": stored_placement(self.job, self.assignment.allocation, uuids),
            "borrowed": self.assignment.borrowed,
            "created_at": now,
        }


def still_fits(
    session: Session, assignment: st.Assignment, claimed: Set[tuple[str, int]]
) -> PlacementFit | None:
    """Re-check the fit in fresh rows: job still queued and not held, nodes ready, its GPUs healthy and not in
    `claimed`. The plan came from a snapshot whose nodes may be cached (snapshot.cached_shape): a
    GPU reported unhealthy, quarantined or removed since is refused here."""
    job = session.get(Job, int(assignment.job_id))
    if job is None or job.state != JobState.QUEUED.value or job.cancel_requested or job.held_by is not None:
        return None
    names = set(assignment.allocation.nodes)
    nodes = {name: node for name in names if (node := session.get(Node, name)) is not None}
    if any(n not in nodes or nodes[n].state != st.NodeState.READY.value for n in names):
        return None
    wanted = frozenset((p.node, i) for p in assignment.allocation.instances for i in p.gpu_indices)
    if wanted & claimed:
        return None
    usable = {
        (n.name, g.index)
        for n in nodes.values()
        for g in n.gpus
        if g.healthy and g.health == GpuHealth.HEALTHY.value
    }
    return PlacementFit(assignment, job, nodes, wanted) if wanted <= usable else None


# Rows read again, not the session's copies: the ahead pass applies in the session the first pass
# committed in (expire_on_commit is off), and a GPU quarantined between the two must be seen.
FRESH_ROWS = {"populate_existing": True}

# Built once: Core statements, executemany (one round trip each for a whole batch).
INSERT_ATTEMPTS = insert(table_of(Attempt)).returning(table_of(Attempt).c.id, table_of(Attempt).c.job_id)
INSERT_CLAIMS = insert(table_of(GpuClaim))


class PlacementChanged(Exception):
    """A node the batch places on was cordoned, drained or lost, or one of its GPUs quarantined,
    after still_fits read it: the batch is rolled back and its jobs applied one by one."""


def left_service(session: Session, placed: Sequence[PlacementFit]) -> bool:
    """still_fits' verdict again, after the batch's first write: still_fits reads before any write
    (SQLite's write lock would make the API wait on those reads), so an operator's cordon, drain
    or quarantine committed in between would otherwise be missed. Here SQLite holds its write
    lock (no other commit can come between this read and the commit) and PostgreSQL share-locks
    the rows (such a change waits for this commit, or is seen)."""
    names = sorted({name for f in placed for name in f.nodes})
    out = select(Node.name).where(Node.name.in_(names), Node.state != st.NodeState.READY.value)
    if session.execute(out.with_for_update(read=True)).first() is not None:
        return True
    wanted = sorted({gpu for f in placed for gpu in f.gpus})
    if not wanted:
        return False
    gpus = select(Gpu.node_name, Gpu.index, Gpu.healthy, Gpu.health).where(
        tuple_(Gpu.node_name, Gpu.index).in_(wanted)
    )
    rows = session.execute(gpus.with_for_update(read=True)).all()
    usable = {(n, i) for n, i, healthy, health in rows if healthy and health == GpuHealth.HEALTHY.value}
    return not set(wanted) <= usable


def write_batch(session: Session, fits: Sequence[PlacementFit], now: float) -> list[int]:
    """The fitting assignments of a plan in four statements whatever their number (not three per
    job: the ORM inserts one row per statement on SQLite, which gives no order to RETURNING):
    QUEUED -> SCHEDULED by one compare-and-set and the events (lifecycle.schedule_jobs), the
    attempts of the jobs it moved, their GPU claims. Not committed; a claim taken meanwhile by
    another server raises IntegrityError here, and a node or GPU that left service since
    still_fits read it PlacementChanged (left_service: one or two more reads, whatever the number).
    Returns the ids of the jobs placed."""
    messages = {f.job.id: f.message for f in fits}
    won = schedule_jobs(session, [f.job for f in fits], now=now, messages=messages)
    placed = [f for f in fits if f.job.id in won]
    if not placed:
        return []
    if left_service(session, placed):
        raise PlacementChanged("a node or GPU of the plan left service after it was read")
    connection = session.connection()
    rows = connection.execute(INSERT_ATTEMPTS, [f.attempt_columns(won[f.job.id], now) for f in placed])
    attempt_pk = {int(job_id): int(pk) for pk, job_id in rows}
    claims = [
        {"node": node, "gpu_index": index, "attempt_pk": attempt_pk[f.job.id], "job_id": f.job.id}
        for f in placed
        for node, index in sorted(f.gpus)
    ]
    if claims:
        connection.execute(INSERT_CLAIMS, claims)
    return [f.job.id for f in placed]


def apply_assignment(session: Session, assignment: st.Assignment, now: float) -> bool:
    """One transaction: the batch write (write_batch) of one assignment. False when it no longer
    fits, lost its compare-and-set, or a GPU was claimed meanwhile (the job stays queued)."""
    fit = still_fits(session, assignment, claimed_gpus(session))
    try:
        placed = fit is not None and len(write_batch(session, [fit], now)) == 1
    except (IntegrityError, PlacementChanged):
        placed = False
    if placed:
        session.commit()
    else:
        session.rollback()
    return placed


def apply_assignments(session: Session, assignments: Sequence[st.Assignment], now: float) -> int:
    """place_assignments; how many jobs were placed."""
    return len(place_assignments(session, assignments, now))


def place_assignments(session: Session, assignments: Sequence[st.Assignment], now: float) -> list[int]:
    """All of a plan's assignments in one transaction (one SQLite write, not one per job). If the
    commit fails (another server claimed a GPU meanwhile), fall back to one transaction each.
    Returns the ids of the jobs placed."""
    if not assignments:
        return []
    # Read everything first: SQLite takes its write lock at the first write, and every read done
    # after that would make the API's submits wait for it.
    ids = [int(a.job_id) for a in assignments]
    names = {n for a in assignments for n in a.allocation.nodes}
    # Held in locals: the session's identity map keeps objects only weakly, so rows loaded and
    # dropped at once would be fetched again, one SELECT per session.get in still_fits.
    preloaded = (
        session.scalars(
            select(Job).where(Job.id.in_(ids)).options(joinedload(Job.user)), execution_options=FRESH_ROWS
        ).all(),
        # the GPUs joined in (one SELECT, not two): still_fits reads their health
        session.scalars(
            select(Node).where(Node.name.in_(names)).options(joinedload(Node.gpus)),
            execution_options=FRESH_ROWS,
        )
        .unique()
        .all(),
    )
    claimed = claimed_gpus(session)
    fits: list[PlacementFit] = []
    fitted: set[int] = set()
    with session.no_autoflush:
        for assignment in assignments:
            if int(assignment.job_id) in fitted:
                continue  # one attempt per job and cycle (a second would break (job_id, number))
            fit = still_fits(session, assignment, claimed)
            if fit is not None:
                fitted.add(fit.job.id)
                fits.append(fit)
                claimed |= fit.gpus
    try:
        staged = write_batch(session, fits, now)
        session.commit()
        del preloaded
        return staged
    except (IntegrityError, PlacementChanged):
        session.rollback()
        return [int(a.job_id) for a in assignments if apply_assignment(session, a, now)]


# A launched job is stopped whether or not the engine has reported it running yet (as a node
# drain does): the scheduler sees both as running work, and refusing a STARTING victim left its
# waiting job "waiting for preemption" cycle after cycle while nothing was being stopped.
PREEMPTABLE_STATES = (JobState.STARTING.value, JobState.RUNNING.value)


def apply_preemption(session: Session, preemption: st.Preemption, now: float) -> bool:
    """STARTING | RUNNING -> PREEMPTED by compare-and-set: False (nothing written) when the job is
    no longer running in the database, whatever the session's copy of it says (e.g. it just
    succeeded); the reconcile loop stops its attempt with the grace given here."""
    job = session.get(Job, int(preemption.job_id))
    if job is None or job.state not in PREEMPTABLE_STATES:
        session.rollback()
        return False
    if not transition(session, job, JobState.PREEMPTED, now=now, message=preemption.reason):
        session.rollback()
        return False
    attempt = live_attempts(session, [job.id]).get(job.id)
    if attempt is not None:
        attempt.stop_grace_s = preemption.grace_s
    session.commit()
    return True


def _same_diagnosis(old: JobDiagnosis | None, new: JobDiagnosis, now: float) -> bool:
    """Equal but for an estimated start (and its range) that moved less than the slack (they
    drift every cycle): ETA_SLACK_S, or ETA_SLACK_SHARE of the old one's wait from `now`."""
    if old is None:
        return False
    if replace(old, estimated_start=None, start_range=None) != replace(
        new, estimated_start=None, start_range=None
    ):
        return False
    a, b = old.start_range, new.start_range
    pairs = [(old.estimated_start, new.estimated_start)]
    if a is not None and b is not None:
        pairs += [(a[0], b[0]), (a[1], b[1])]
    elif a is not None or b is not None:
        return False
    for x, y in pairs:
        if x is None or y is None:
            if x is not y:
                return False
        elif abs(x - y) >= max(ETA_SLACK_S, ETA_SLACK_SHARE * (x - now)):
            return False
    return True


def write_diagnoses(
    ctx: ServerContext,
    session: Session,
    diagnoses: Mapping[str, st.Diagnosis],
    now: float,
    gpus: Mapping[str, int],
    calibrates: bool = True,
) -> None:
    """One executemany UPDATE for the diagnoses that changed, only on jobs still queued, not held.
    Each estimated start is the roll's corrected by the platform's past outcomes (eta_record): the
    first a job is shown in full, later ones less as it waits (`LoopMemory.eta_since`); not under a
    profile that shows the roll as it is (`Profile.eta_calibration`: the FIFO ones). A job's
    first estimate, the roll's own, is recorded for the calibration (eta_record.note_shown; `gpus`:
    job id -> its GPUs, the size class the correction reads)."""
    cache, since = ctx.memory.diagnoses, ctx.memory.eta_since
    # each class's line once, not once per job; outcomes are recorded under every profile
    fits = calibration_of(ctx, session, now).fits()
    calibrates = calibrates and fits.corrects()
    changed = {}
    first_shown = {}
    for job_id, diagnosis in diagnoses.items():
        shown = diagnosis
        if calibrates:
            elapsed = now - since.get(job_id, now)
            shown = calibrated(fits, diagnosis, gpus.get(job_id, 0), now, elapsed)
        stored = stored_diagnosis(shown)
        old = cache.get(job_id)
        if not _same_diagnosis(old, stored, now):
            changed[job_id] = stored
            if diagnosis.estimated_start is not None and (old is None or old.estimated_start is None):
                first_shown[job_id] = diagnosis.estimated_start - now
    if not changed:
        return
    note_shown(session, first_shown, now)
    jobs = table_of(Job)  # Core UPDATE: executemany over plain parameters
    stmt = (
        update(jobs)
        .where(
            jobs.c.id == bindparam("job_pk"),
            jobs.c.state == JobState.QUEUED.value,
            jobs.c.held_by.is_(None),  # held since the snapshot: its hold is its diagnosis
        )
        .values(diagnosis=bindparam("new_diagnosis"))
    )
    session.execute(stmt, [{"job_pk": int(j), "new_diagnosis": d} for j, d in changed.items()])
    session.commit()
    cache.update(changed)
    for job_id in first_shown:
        since.setdefault(job_id, now)


def forget_diagnoses(ctx: ServerContext, waiting: Collection[str]) -> None:
    """Keep the written diagnoses (and `eta_since`) of the jobs still waiting only. Placing a job
    clears its stored diagnosis (lifecycle.schedule_jobs), and so does a hold, so a job that comes
    back to the queue (a retry, a preemption, a lost node, a release) must be written again even
    when its reason is the same as before, and its next estimate is its first of this wait."""
    cache, since = ctx.memory.diagnoses, ctx.memory.eta_since
    for job_id in [j for j in cache if j not in waiting]:
        del cache[job_id]
    for job_id in [j for j in since if j not in waiting]:
        del since[job_id]


def forget_schedule_memory(ctx: ServerContext) -> None:
    """The schedule lease came (back) to this server: another may have placed jobs and written
    diagnoses meanwhile, so the ETA calibration is rebuilt from the database (eta_record) and every
    waiting job's diagnosis written again."""
    ctx.memory.eta_calibration = None
    forget_diagnoses(ctx, ())


class DbPlanSink:
    """The live loop's side of `apply_plan`: each step is one of the transactions above."""

    def __init__(
        self,
        ctx: ServerContext,
        session: Session,
        now: float,
        queued: Sequence[st.Job] = (),
        calibrates: bool = True,
    ) -> None:
        self.ctx, self.session, self.now = ctx, session, now
        self.queued = queued  # the snapshot's waiting jobs: their sizes, for the ETA calibration
        self.calibrates = calibrates  # the profile's eta_calibration

    def assign(self, assignments: Sequence[st.Assignment]) -> int:
        # (a placement is no ETA outcome: the job's start is, when the engine starts it, eta_record)
        return len(place_assignments(self.session, assignments, self.now))

    def preempt(self, preemption: st.Preemption) -> bool:
        return apply_preemption(self.session, preemption, self.now)

    def diagnose(self, diagnoses: Mapping[str, st.Diagnosis], planned: Set[str]) -> None:
        waiting = {k: v for k, v in diagnoses.items() if k not in planned}
        forget_diagnoses(self.ctx, waiting.keys())
        gpus = {j.id: j.total_gpus for j in self.queued} if waiting else {}
        write_diagnoses(self.ctx, self.session, waiting, self.now, gpus, self.calibrates)


# Built once. A held job (`corral hold`) is no input (snapshot.CLUSTER_JOBS), so a queue of only
# held jobs is an idle one: the tick ends here instead of reading the whole state to place nothing.
ANY_QUEUED = select(Job.id).where(Job.state == JobState.QUEUED.value, Job.held_by.is_(None)).limit(1)


def schedule_tick(ctx: ServerContext, now: float) -> None:
    memory = ctx.memory
    with ctx.session_factory() as session:
        # An idle queue costs one indexed read per tick; while the last cycle left jobs waiting
        # (a burst larger than the free slots), that read is skipped and the snapshot says.
        # No job waits: none keeps a written diagnosis either (one held meanwhile must be written,
        # and shown its first estimate, again after its release: eta_record).
        if not memory.queue_seen and session.scalar(ANY_QUEUED) is None:
            forget_diagnoses(ctx, ())
            return
        if memory.shape_cache is None:
            memory.shape_cache = ShapeCache()
        state = read_cluster_state(session, memory.shape_cache)
        session.rollback()
        memory.queue_seen = False
        if not state.queued:
            forget_diagnoses(ctx, ())
            return
        started = time.perf_counter()
        settings = ctx.settings
        profile = active_profile(settings)
        snapshot = build_snapshot(
            state,
            now,
            max_stop_grace_s=settings.max_stop_grace_s,
            cpu_jobs_on_gpu_nodes=profile.cpu_jobs_on_gpu_nodes,
        )
        scheduler = scheduler_for(ctx, profile)
        plan = scheduler.schedule(snapshot, now, random.Random(int(now)))
        sink = DbPlanSink(ctx, session, now, snapshot.queued, profile.eta_calibration)
        done = apply_plan(plan, sink)
        applied, preempted = done.assigned, done.preempted
        # An engine with its own queue (Slurm) gets the next jobs while the current ones still
        # run (server/ahead.py); not in a cycle that preempted: those jobs wait for the victims.
        if queues_ahead(ctx) and not preempted and applied < len(snapshot.queued):
            applied += place_ahead(ctx, session, now, None if applied else state)
        memory.queue_seen = applied < len(snapshot.queued)
    record_scheduler_cycle(time.perf_counter() - started, placements=applied, preemptions=preempted)
    if applied:  # both passes' jobs go to the engine now, in one claim, not at the dispatch loop's next tick
        launch_placed(ctx)
    if preempted:
        ctx.wake("reconcile")
    if applied or preempted:
        log.debug("schedule: %d assigned, %d preempted", applied, preempted)
