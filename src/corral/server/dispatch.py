"""The dispatch loop: SCHEDULED jobs -> `engine.launch` -> STARTING.

Each job is claimed with its row lease before the engine is called, and the engine call happens
outside any transaction (SQLite would otherwise hold its write lock across a process start). A
crash between launch and commit leaves the job SCHEDULED; the next dispatch launches the same
attempt id again, which the engine treats as the same launch (idempotent), so nothing starts twice.
If such a job is cancelled meanwhile, its attempt is stopped through the engine before the job is
settled CANCELLED; and a launch that waited more than FRESH_CLAIM_S since its claim renews the
job's lease right before the engine call, so a launch that outlived its lease on a stalled server
does not start anything. A launch the engine raised from may have started the attempt all the
same: it is stopped once its failure is committed (_stop_failed_launches).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import socket
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace

from sqlalchemy import and_, bindparam, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, joinedload

from corral.db.models import Attempt, Job, Node
from corral.diagnosis.exitspec import Facts
from corral.diagnosis.record import failing_node, record, retry_rule
from corral.domain import InstancePlacement
from corral.engine.base import (
    AttemptLaunch,
    Engine,
    EngineUnavailable,
    FailureReason,
    InstanceLaunch,
    MountSpec,
    SecretGrant,
)
from corral.environments.mounts import BUILD_INTERPRETER
from corral.monitor.metrics import ENGINE_LAUNCH_SECONDS
from corral.scheduler.types import GPU
from corral.server.context import ServerContext
from corral.server.finish import AttemptChangedMeanwhile, end_attempt
from corral.server.leases import JOB_LEASE_TTL_S
from corral.server.reconcile import active_exit_spec
from corral.server.rendezvous import rendezvous_for_placement
from corral.server.snapshot import LIVE_ATTEMPT_STATES, jobs_with_live_attempts
from corral.server.specview import SpecView, read_spec
from corral.services import secrets, workspaces
from corral.services.lifecycle import (
    AttemptState,
    JobState,
    move_attempt,
    move_attempts,
    settle_failure,
    transition,
    transition_jobs,
)
from corral.storage.plan import JobStorage, plan_jobs
from corral.words import plural

log = logging.getLogger("corral.server.dispatch")
LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")
# Launches run in parallel (as many at once as the engine's launch_workers): starting a process is
# mostly system calls that release the GIL, a Slurm launch mostly sbatch's round trip. The dispatch
# loop records finished launches once this many are done (or the last of a burst is): one
# transaction for several, yet not only after the whole burst (see _submit).
RECORD_BATCH = 4
MAX_BATCH = 256  # scheduled jobs launched per tick; the rest go in the next tick
# A launch that starts within this many seconds of its claim (the claim's UPDATE checked the job
# was still scheduled; its lease runs JOB_LEASE_TTL_S) starts without renewing the claim: no other
# server can have taken the lease yet. Renewing every launch was one write transaction per job,
# which under a burst waited ~100 ms each for SQLite's write lock behind submissions and capped
# the launch pool at a few dozen jobs/s. Older launches (a stalled server, a long queue in the
# pool) renew first, as before. A job settled meanwhile by another path (its node went down) is
# stopped when the launch is recorded (_record_launch), as it always was for the same race
# between the renewal and the engine call.
FRESH_CLAIM_S = 1.0
DISPATCH_INTERVAL_S = 0.2  # the loop's interval (runner.core_loops)


def master_port(address: str, job_id: int) -> int:
    """A free port on this machine when rank 0 runs here; otherwise a stable per-job guess."""
    if address in LOCAL_ADDRESSES:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    return 29500 + job_id % 10000


def instance_env(
    job: Job, view: SpecView, place: InstancePlacement, master: tuple[str, int], world: int
) -> dict[str, str]:
    task = next((t for t in view.tasks if t.role == place.role), None)
    env = {**view.env, **(task.env if task else {})}
    env.update(
        {
            "CORRAL_JOB_ID": str(job.id),
            "CORRAL_TASK_ROLE": place.role,
            "CORRAL_TASK_INDEX": str(place.index),
            "CORRAL_NUM_INSTANCES": str(task.instances if task else 1),
            "MASTER_ADDR": master[0],
            "MASTER_PORT": str(master[1]),
            "WORLD_SIZE": str(world),
            "RANK": str(place.rank),
            "CUDA_VISIBLE_DEVICES": ",".join(place.gpu_uuids),
        }
    )
    return env


def placed_nodes(session: Session, attempts: Iterable[Attempt]) -> dict[str, Node]:
    """The nodes these attempts are placed on, with their GPUs: one query for a whole batch."""
    names = {p.node for a in attempts for p in a.placement}
    query = select(Node).where(Node.name.in_(names)).options(joinedload(Node.gpus))  # one SELECT
    return {n.name: n for n in session.scalars(query).unique()}


def build_launch(
    job: Job, attempt: Attempt, nodes: Mapping[str, Node], storage: JobStorage | None = None
) -> AttemptLaunch:
    """`nodes`: at least those the attempt is placed on (placed_nodes); `storage`: the job's
    uid, gids and binds (corral.storage.plan), none for a launch without storage."""
    view = read_spec(job.spec)
    placement = sorted(attempt.placement, key=lambda p: p.rank)
    placed = [nodes[name] for name in {p.node for p in placement} if name in nodes]
    models = {(n.name, g.index): g.model for n in placed for g in n.gpus}
    rank0 = nodes.get(placement[0].node) if placement else None
    address = rank0.address if rank0 is not None else "127.0.0.1"
    master = (address, master_port(address, job.id))
    commands = {t.role: t.command for t in view.tasks}
    addresses = {name: node.address for name, node in nodes.items()}
    peers = rendezvous_for_placement(
        job.id, [t.role for t in view.tasks], placement, addresses
    ).instance_envs()
    instances = []
    for p in placement:
        gpus = tuple(
            GPU(index=i, uuid=u, model=models.get((p.node, i), ""))
            for i, u in zip(p.gpu_indices, p.gpu_uuids, strict=False)
        )
        instances.append(
            InstanceLaunch(
                role=p.role,
                index=p.index,
                rank=p.rank,
                node=p.node,
                gpus=gpus,
                cpus=p.cpus,
                memory_mib=p.memory_mib,
                command=commands.get(p.role, ""),
                env={
                    **instance_env(job, view, p, master, len(placement)),
                    **peers[p.rank],
                    **(storage.env if storage else {}),
                },
            )
        )
    launch = AttemptLaunch(
        attempt_id=attempt.attempt_id,
        job_id=str(job.id),
        attempt=attempt.number,
        user=job.user.name,
        group=job.group.name,
        instances=tuple(instances),
        max_runtime_s=view.max_runtime_s,
        environment=view.environment,
    )
    if storage is None:
        return launch
    return dataclasses.replace(
        launch,
        uid=storage.uid,
        gids=storage.gids,
        mounts=tuple(MountSpec(b.host_path, b.target, b.readonly) for b in storage.binds),
        storage_dirs=tuple(d for b in storage.binds for d in b.prepare),
        cwd=storage.cwd,
        home=storage.home,
        refused=storage.refused,
        environment_bin=storage.environment_bin,
        environment_paths=storage.environment_paths,
        network_outbound=storage.network_outbound,
        log_dir=storage.log_dir,
    )


Launched = tuple[int, str, str | None, str | None]  # (job id, attempt id, engine ref, error message)


def claim_jobs(session: Session, ids: list[int], owner: str, now: float) -> set[int]:
    """One UPDATE ... RETURNING: the scheduled jobs among `ids` whose row lease `owner` now holds."""
    rows = session.execute(
        update(Job)
        .where(
            Job.id.in_(ids),
            Job.state == JobState.SCHEDULED.value,
            or_(Job.lease_owner.is_(None), Job.lease_owner == owner, Job.lease_until < now),
        )
        .values(lease_owner=owner, lease_until=now + JOB_LEASE_TTL_S)
        .returning(Job.id)
        .execution_options(synchronize_session=False)
    )
    return {int(r[0]) for r in rows}


def stop_claimed_before(
    ctx: ServerContext, cancelled: list[Job], attempts: Mapping[int, Attempt], now: float
) -> set[int]:
    """The cancelled scheduled jobs among `cancelled` that may be settled CANCELLED now. A job
    claimed before (a row lease, even an expired one) may have been launched by a server that
    died before recording it: its attempt is stopped through the engine first (at once, it never
    started as far as Corral knows), before any write, so no process runs on after CANCELLED. A
    job whose lease another server holds is left to that server."""
    ready: set[int] = set()
    for job in cancelled:
        attempt = attempts.get(job.id)
        if attempt is None:
            continue
        if job.lease_owner is None:  # never claimed, so never launched
            ready.add(job.id)
            continue
        if job.lease_owner != ctx.owner_id and (job.lease_until or 0.0) >= now:
            continue
        try:
            ctx.engine.stop(attempt.attempt_id, 0.0)
        except EngineUnavailable as exc:
            log.warning("engine unavailable, cancelled job %s stays scheduled: %s", job.id, exc)
            continue
        ready.add(job.id)
    return ready


# Run every tick: built once (building it cost about as much as running it, ~0.4 ms). Each job
# comes with what its launch needs from three other tables, in this read instead of a read each
# per batch: its live attempt (the one the schedule loop placed; NULL if none, as live_attempts
# would leave it out), the interpreter of the environment version it builds and a workspace job's
# credential (NULL for other jobs). Read in the claim's own transaction, as before.
SCHEDULED_JOBS = (
    select(Job, Attempt, BUILD_INTERPRETER, workspaces.LAUNCH_TOKEN)
    .outerjoin(
        Attempt,
        and_(Attempt.job_id == Job.id, Attempt.state.in_([s.value for s in LIVE_ATTEMPT_STATES])),
    )
    .where(Job.state == JobState.SCHEDULED.value, Job.id.not_in(bindparam("skip", expanding=True)))
    .order_by(Job.id)
    .limit(MAX_BATCH)
    # many-to-one: joined into this query, not two more SELECTs per batch
    .options(joinedload(Job.user), joinedload(Job.group))
)


def prepare_launches(
    ctx: ServerContext, session: Session, now: float, skip: set[int] | None = None
) -> list[AttemptLaunch]:
    """Build the launches of scheduled jobs not in `skip` (reads only), then claim them and settle
    cancelled ones in one short write at the end, and commit. SQLite holds its write lock only then."""
    rows = session.execute(SCHEDULED_JOBS, {"skip": sorted(skip or ())}).all()
    if not rows:
        return []
    jobs = list({job.id: job for job, _, _, _ in rows}.values())  # once each, in id order
    attempts = {job.id: attempt for job, attempt, _, _ in rows if attempt is not None}
    builds = {job.id: python for job, _, python, _ in rows if python is not None}
    tokens = {job.id: token for job, _, _, token in rows if token is not None}
    nodes = placed_nodes(session, attempts.values())
    to_launch = [j for j in jobs if j.id in attempts and not j.cancel_requested]
    storage = plan_jobs(session, to_launch, ctx.settings, builds)
    launches = {j.id: build_launch(j, attempts[j.id], nodes, storage.get(j.id)) for j in to_launch}
    refused = attach_secrets(ctx, session, jobs, launches)
    attach_workspace_tokens(launches, tokens)
    stopped = stop_claimed_before(ctx, [j for j in jobs if j.cancel_requested], attempts, now)
    claimed = claim_jobs(session, [j.id for j in jobs], ctx.owner_id, now)
    for job in jobs:  # a secret it names cannot be given: the attempt fails, saying which
        if job.id in claimed and job.id in refused:
            launch = launches.pop(job.id)
            _record_launch(
                ctx, session, (job.id, launch.attempt_id, None, refused[job.id]), job, attempts[job.id]
            )
    for job in jobs:
        if job.id in claimed and job.cancel_requested and job.id in stopped:
            if not transition(
                session, job, JobState.CANCELLED, now=now, message="cancelled before it started"
            ):
                continue
            end_attempt(
                session, job, attempts[job.id], AttemptState.CANCELLED, now, reason=FailureReason.STOPPED
            )
            job.lease_owner = None
            ctx.wake("schedule")
    session.commit()
    return [launch for job_id, launch in launches.items() if job_id in claimed]


def attach_secrets(
    ctx: ServerContext, session: Session, jobs: Iterable[Job], launches: dict[int, AttemptLaunch]
) -> dict[int, str]:
    """Put the values of the secrets each job names into its launch (in memory only; decrypted
    now, at dispatch, so a changed secret reaches the next attempt). Returns {job id: why} for
    the jobs whose secrets cannot be given (deleted, no longer usable, wrong key)."""
    refused: dict[int, str] = {}
    for job in jobs:
        launch = launches.get(job.id)
        if launch is None or not job.spec.secrets:
            continue
        try:
            grants = secrets.grants_for_job(session, secrets.box_for(ctx.settings), job)
        except (secrets.SecretUnavailable, secrets.SecretKeyError) as exc:
            refused[job.id] = str(exc)
            continue
        launches[job.id] = replace(launch, secrets=grants)
    return refused


def attach_workspace_tokens(launches: dict[int, AttemptLaunch], tokens: Mapping[int, str]) -> None:
    """A workspace job's JupyterLab credential (`tokens`: {job id: credential}, as read with the
    scheduled jobs, workspaces.LAUNCH_TOKEN), given like a secret: in memory and in the root-only
    env file, never in the spec, a record or a log."""
    for job_id, token in tokens.items():
        if job_id not in launches:
            continue
        grant = SecretGrant(name="workspace", value=token.encode(), env=workspaces.TOKEN_ENV)
        launches[job_id] = replace(launches[job_id], secrets=(*launches[job_id].secrets, grant))


def _stop_orphan(ctx: ServerContext, session: Session, attempt: Attempt | None, attempt_id: str) -> None:
    """Stop a launch whose job was settled meanwhile (e.g. its node went down): no orphan process.
    Not when the attempt is recorded STARTING or RUNNING: then another server, whose claim came
    after this one's ran out (a stalled server, a launch slower than the lease), launched the
    same attempt (launches are idempotent) and recorded it first; the process is the job's live
    attempt, and stopping it would end it as `stopped` by Corral, which fails the job."""
    if attempt is not None and attempt.attempt_id == attempt_id:
        now_state = session.scalar(select(Attempt.state).where(Attempt.id == attempt.id))
        if now_state in (AttemptState.STARTING.value, AttemptState.RUNNING.value):
            return
    ctx.engine.stop(attempt_id, 0.0)


def _record_launch(
    ctx: ServerContext, session: Session, launched: Launched, job: Job | None, attempt: Attempt | None
) -> str | None:
    """STARTING with the engine's ref, or FAILED (launch_failed) with the engine's message.
    Returns the attempt id when it recorded the attempt FAILED: the caller stops it through the
    engine once that is committed (_stop_failed_launches)."""
    _job_id, attempt_id, ref, error = launched
    now = time.time()
    current = job is not None and attempt is not None and attempt.attempt_id == attempt_id
    if job is None or attempt is None or not current or job.state != JobState.SCHEDULED.value:
        if ref is not None or error is not None:  # an engine that raised may have started it too
            _stop_orphan(ctx, session, attempt, attempt_id)
        return None
    job.lease_owner = None
    if error is not None:
        # The exit-spec decides the retry (launch_failed: platform, a few tries with backoff).
        verdict = active_exit_spec(ctx).classify(Facts(frozenset({"launch_failed"}), log_tail=error))
        why = f"launch failed: {error}"
        budget = ctx.settings.lost_requeue_budget
        if settle_failure(session, job, why=why, now=now, rule=retry_rule(verdict), budget=budget) is None:
            return None
        node = failing_node(attempt, 0)
        record(session, job, attempt, verdict, node, now, retried=job.state == JobState.QUEUED.value)
        end_attempt(session, job, attempt, AttemptState.FAILED, now, reason=verdict.reason, message=error)
        ctx.wake("schedule")
        return attempt_id
    elif transition(session, job, JobState.STARTING, now=now):
        if not move_attempt(
            session, attempt, AttemptState.STARTING, {"engine_ref": ref, "engine": ctx.engine.name}
        ):
            raise AttemptChangedMeanwhile(f"attempt {attempt_id} ended in another session")
    elif ref is not None:  # changed in another session since it was read
        _stop_orphan(ctx, session, attempt, attempt_id)
    return None


def _stop_failed_launches(ctx: ServerContext, attempt_ids: Iterable[str]) -> None:
    """Stop what the engine may have started of these attempts before its launch raised (the
    local engine's supervisor spawned, then the write of its ref failed; a Slurm job submitted,
    then its record not saved): their jobs are requeued, and the retry must not run beside them.
    Only once the attempts' FAILED is committed: until then another server that took the job over
    (our claim run out) may record the same attempt (idempotent launch, the same process)
    STARTING, and stopping that live attempt would fail its job as `stopped`. A stop that fails
    is logged: the attempt then runs on unwatched, as it did before."""
    for attempt_id in attempt_ids:
        try:
            ctx.engine.stop(attempt_id, 0.0)
        except Exception:
            log.exception("could not stop attempt %s after its failed launch", attempt_id)


def renew_claim(ctx: ServerContext, job_id: int, now: float) -> bool:
    """Right before the engine call: renew this server's row lease on the job, if it still holds
    it and the job is still scheduled and not cancelled. A launch that waited in the pool longer
    than the lease (a stalled server) must not start a process for a job another server has
    meanwhile claimed or settled (and whose GPUs it may have given to another job)."""
    with ctx.session_factory() as session:
        renewed = session.connection().execute(
            update(Job)
            .where(
                Job.id == job_id,
                Job.state == JobState.SCHEDULED.value,
                Job.cancel_requested.is_(False),
                Job.lease_owner == ctx.owner_id,
                Job.lease_until >= now,
            )
            .values(lease_until=now + JOB_LEASE_TTL_S)
        )
        session.commit()
    return renewed.rowcount == 1


def _launch(ctx: ServerContext, launch: AttemptLaunch, claimed_at: float) -> Launched | None:
    """Call the engine (outside any transaction); None when the engine is unreachable or the job
    is no longer this server's to launch (it stays as it is; the next dispatch tick decides).
    `claimed_at`: when this server claimed the job (the claim is renewed first when older than
    FRESH_CLAIM_S)."""
    now = time.time()
    try:
        ours = now - claimed_at < FRESH_CLAIM_S or renew_claim(ctx, int(launch.job_id), now)
    except SQLAlchemyError:  # e.g. the database busy: the job stays scheduled, tried again
        log.exception("could not renew the claim on job %s before launching it", launch.job_id)
        return None
    if not ours:
        log.info("job %s is no longer ours to launch (lease lost, settled or cancelled)", launch.job_id)
        return None
    started = time.perf_counter()
    try:
        return int(launch.job_id), launch.attempt_id, ctx.engine.launch(launch), None
    except EngineUnavailable as exc:
        log.warning("engine unavailable, job %s stays scheduled: %s", launch.job_id, exc)
        return None
    except Exception as exc:  # the engine refused: the attempt fails with its message
        log.exception("launch of job %s failed", launch.job_id)
        return int(launch.job_id), launch.attempt_id, None, f"{type(exc).__name__}: {exc}"
    finally:
        ENGINE_LAUNCH_SECONDS.labels(engine=ctx.engine.name).observe(time.perf_counter() - started)


def _record_started(
    ctx: ServerContext, session: Session, started: list[tuple[Job, Attempt, Launched]]
) -> None:
    """The launches that started, still scheduled as read: the jobs STARTING in one
    compare-and-set, their attempts (with the engine's ref) in one more, the events in one
    INSERT. A job settled meanwhile loses alone and its process is stopped (no orphan)."""
    now = time.time()
    # The row lease is released in the compare-and-set itself: a separate ORM flush of
    # `lease_owner = None` was one more UPDATE per batch. Only a job that lost (rare) is released
    # by that flush, as before.
    won = transition_jobs(
        session,
        [job for job, _, _ in started],
        JobState.STARTING,
        now=now,
        values={job.id: {"lease_owner": None} for job, _, _ in started},
    )
    for job, attempt, (_, attempt_id, ref, _) in started:
        if job.id not in won:
            job.lease_owner = None
            if ref is not None:
                _stop_orphan(ctx, session, attempt, attempt_id)
    values = {a.id: {"engine_ref": r[2], "engine": ctx.engine.name} for j, a, r in started if j.id in won}
    moved = move_attempts(session, [a for j, a, _ in started if j.id in won], AttemptState.STARTING, values)
    if len(moved) < len(values):
        raise AttemptChangedMeanwhile(
            f"{plural(len(values) - len(moved), 'attempt')} ended in another session"
        )


def _record_all(ctx: ServerContext, session: Session, results: list[Launched]) -> None:
    """One transaction for the batch (rows read first, written at commit); one per job if it fails."""
    try:
        jobs, attempts = jobs_with_live_attempts(session, [r[0] for r in results])
        started = []
        failed: list[str] = []
        with session.no_autoflush:
            for launched in results:
                job, attempt = jobs.get(launched[0]), attempts.get(launched[0])
                if (
                    job is not None
                    and attempt is not None
                    and attempt.attempt_id == launched[1]
                    and job.state == JobState.SCHEDULED.value
                    and launched[3] is None
                ):
                    started.append((job, attempt, launched))
                else:  # failed, or settled meanwhile: one by one, as the rules for each need
                    if (stop := _record_launch(ctx, session, launched, job, attempt)) is not None:
                        failed.append(stop)
            _record_started(ctx, session, started)
        session.commit()
        _stop_failed_launches(ctx, failed)
        return
    except Exception:
        session.rollback()
        log.exception("recording %d launches at once failed; recording them one by one", len(results))
    for launched in results:
        try:
            jobs, attempts = jobs_with_live_attempts(session, [launched[0]])
            stop = _record_launch(ctx, session, launched, jobs.get(launched[0]), attempts.get(launched[0]))
            session.commit()
            _stop_failed_launches(ctx, [stop] if stop is not None else [])
        except Exception:
            session.rollback()
            log.exception("could not record the launch of job %s", launched[0])


@dataclass
class LaunchQueue:
    """Launches in flight on the pool, and the results not yet recorded. The dispatch tick never
    waits for the engine: it records what finished, then hands new launches to the pool."""

    pool: ThreadPoolExecutor
    in_flight: set[int] = field(default_factory=set)
    done: list[Launched] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # One claimer at a time in this process: the dispatch loop, or the schedule loop handing the
    # jobs it just placed straight on (launch_placed). Both skip the jobs in flight; holding this
    # from that read until the claimed jobs are in flight keeps them from launching one job twice.
    claiming: threading.Lock = field(default_factory=threading.Lock)
    # When this process last read the scheduled jobs (monotonic): a tick woken only to record
    # finished launches skips the read while it is younger than the loop's interval, unless a
    # claim was asked for since ("dispatch" in LoopMemory.asked).
    claim_read_at: float = -math.inf

    def take_done(self) -> list[Launched]:
        with self.lock:
            done, self.done = self.done, []
        return done

    def busy_ids(self) -> set[int]:
        with self.lock:
            return set(self.in_flight)


def launch_workers(engine: Engine) -> int:
    """How many launches run at once: the engine's own `launch_workers` (the Slurm engine's
    launch is mostly waiting for sbatch's round trip to slurmctld)."""
    return max(1, engine.launch_workers)


_QUEUE_MADE = threading.Lock()  # the dispatch and schedule loops may both ask for it first


def launch_queue(ctx: ServerContext) -> LaunchQueue:
    queue = ctx.memory.launch_queue
    if queue is None:
        with _QUEUE_MADE:
            queue = ctx.memory.launch_queue
            if queue is None:
                pool = ThreadPoolExecutor(launch_workers(ctx.engine), thread_name_prefix="launch")
                queue = ctx.memory.launch_queue = LaunchQueue(pool)
    return queue


def _submit(ctx: ServerContext, queue: LaunchQueue, launch: AttemptLaunch, claimed_at: float) -> None:
    def run() -> None:
        result = _launch(ctx, launch, claimed_at)
        with queue.lock:
            if result is not None:
                queue.done.append(result)
            else:  # engine unavailable or claim lost: the job stays as it is, tried again
                queue.in_flight.discard(int(launch.job_id))
            last = queue.in_flight <= {r[0] for r in queue.done}
            batch_ready = len(queue.done) >= RECORD_BATCH
        # Record a burst of launches in one transaction, not one each; but not only once the
        # whole burst is out: an attempt is polled only once recorded STARTING, and on a remote
        # engine (Slurm: tens of ms per sbatch) a short job may end before the last of a long
        # burst is launched, holding its resources in Corral's view until then.
        if last or batch_ready:
            ctx.nudge("dispatch")  # to record them: no read of the scheduled jobs asked for

    with queue.lock:
        queue.in_flight.add(int(launch.job_id))
    try:
        queue.pool.submit(run)
    except RuntimeError:  # the pool shut down (the server stopping): not in flight, claimed again later
        with queue.lock:
            queue.in_flight.discard(int(launch.job_id))
        raise


def dispatch_tick(ctx: ServerContext, now: float) -> float | None:
    """Record the launches that finished (one transaction), then claim and build the launches of
    newly scheduled jobs (one transaction) and hand them to the launch pool. A tick that recorded
    launches skips the claim's read when the last one is younger than DISPATCH_INTERVAL_S and no
    claim was asked for since: the launch pool wakes this loop for every few launches it ends
    (a dozen ticks a second under load), and the jobs the schedule loop places are claimed by
    that loop itself (launch_placed). Such a tick returns when the read is due, so that the
    runner ticks again then and not a whole interval later: another server's placements are
    still read at least once per interval, as by an idle loop."""
    queue = launch_queue(ctx)
    done = queue.take_done()
    if done:
        with ctx.session_factory() as session:
            _record_all(ctx, session, done)
        with queue.lock:
            queue.in_flight.difference_update(r[0] for r in done)
        ctx.wake("reconcile")
        due = queue.claim_read_at + DISPATCH_INTERVAL_S - time.monotonic()
        if "dispatch" not in ctx.memory.asked and due > 0:
            return due
    launch_scheduled(ctx, queue)
    return None


def launch_scheduled(ctx: ServerContext, queue: LaunchQueue, wait: bool = True) -> int | None:
    """Claim the scheduled jobs not in flight, build their launches and hand them to the pool
    (one transaction); how many were handed on. None: another thread is claiming and `wait` is
    False."""
    if not queue.claiming.acquire(blocking=wait):
        return None
    try:
        ctx.memory.asked.discard("dispatch")
        queue.claim_read_at = time.monotonic()
        claimed_at = time.time()
        try:
            with ctx.session_factory() as session:
                launches = prepare_launches(ctx, session, claimed_at, skip=queue.busy_ids())
        except Exception:
            ctx.memory.asked.add("dispatch")  # not read: the next tick reads, recording or not
            raise
        if len(launches) >= MAX_BATCH:
            ctx.memory.asked.add("dispatch")  # more may wait: read again at the next tick
        for launch in launches:
            _submit(ctx, queue, launch, claimed_at)
    finally:
        queue.claiming.release()
    return len(launches)


def launch_placed(ctx: ServerContext) -> None:
    """The schedule loop, right after it committed placements: launch them from its own thread
    instead of waking the dispatch loop, which may be resting after its last tick or recording
    launches (a wait of tens of ms per job under load, on the path from submit to running).
    Only where this process also holds the dispatch lease: that loop records the launches, and
    another server's would claim them again once their row leases ran out (a second attempt)."""
    if ctx.memory.lease_until.get("dispatch", math.inf) <= time.time():
        return  # the dispatch leader (another server) claims them at its next tick
    try:
        if launch_scheduled(ctx, launch_queue(ctx), wait=False) is None:
            # the dispatch loop is claiming: the schedule loop does not wait behind its batch (and
            # a busy database); woken, that loop takes these at its next tick
            ctx.wake("dispatch")
    except Exception:  # e.g. the database busy: the dispatch loop tries again at its next tick
        log.exception("launching just-placed jobs failed; the dispatch loop will")
        ctx.wake("dispatch")


def shutdown_launches(ctx: ServerContext) -> None:
    """Wait for launches in flight and record them (server shutdown)."""
    queue = ctx.memory.launch_queue
    if queue is not None:
        queue.pool.shutdown(wait=True)
        done = queue.take_done()
        if done:
            with ctx.session_factory() as session:
                _record_all(ctx, session, done)
