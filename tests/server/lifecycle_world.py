"""A small world for the lifecycle race tests: one database, one or two "servers" (a
ServerContext each, with its own connection pool and lease owner id), one controllable engine,
a virtual clock, and the invariants of job, attempt and GPU state checked after every step.

Used by tests/server/test_lifecycle_stateful.py (hypothesis picks the steps and shrinks a
failure) and by bench/lifecycle_races.py (a long random walk that counts violations).

What is real: the database (SQLite file or PostgreSQL), the services the API calls (submit_job,
cancel_job), the loops' tick functions and their leases. What is controlled: the engine (a
FakeEngine whose attempts start, exit, get lost or stop only when a step says so), the launch pool
(a launch handed to the pool runs only at a "launch" step, so a server can be killed while a
launch is in flight or after it reached the engine but before it was recorded), the clock (every
`time.time()` the product reads), and races: a step may tick a loop and run another action right
before that tick's k-th write transaction starts, which is what a second thread or server doing
that action at that moment would look like (see RaceHook).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, event, select, text
from sqlalchemy.orm import sessionmaker

from corral.config import Settings
from corral.db.base import Base
from corral.db.models import Attempt, GpuClaim, Group, GroupQuota, Job, JobEvent, Membership, User
from corral.db.session import make_engine
from corral.engine.base import AttemptLaunch, AttemptPhase, AttemptStatus, FailureReason
from corral.server.context import ServerContext
from corral.server.dispatch import LaunchQueue, dispatch_tick
from corral.server.leases import claim_lease
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import schedule_tick
from corral.services.auth import Principal
from corral.services.errors import Conflict
from corral.services.jobs import cancel_job, submit_job
from corral.services.lifecycle import JobState, can_transition
from corral.services.policy import active_profile
from corral.spec import JobSpecV1
from tests.server.fakes import FakeEngine, gpu_node

T = TypeVar("T")
LOOPS: dict[str, Callable[[ServerContext, float], float | None]] = {
    "schedule": schedule_tick,
    "dispatch": dispatch_tick,
    "reconcile": reconcile_tick,
    "nodes": node_tick,
}
NODES = ("n1", "n2")  # 4 GPUs each
GROUPS = ("a", "b")  # each guaranteed 4 GPUs, borrowing allowed: b's borrowed GPUs can be reclaimed
LIVE_PHASES = (AttemptPhase.PENDING, AttemptPhase.RUNNING)
_SQLITE_TEMPLATE: list[bytes] = []  # see World._from_template
INVARIANTS = (
    "terminal_final",
    "no_run_after_success",
    "no_run_after_cancel",
    "gpu_held_once",
    "legal_history",
)


# -- the clock ----------------------------------------------------------------------------------


class VirtualClock:
    """`time.time()` for the product: starts at the real time and moves only when told."""

    def __init__(self) -> None:
        self.now = float(int(time.time()))

    def advance(self, seconds: float) -> None:
        self.now += seconds


class _TimeModule(types.ModuleType):
    """Stands in for the `time` module inside corral's modules: time() is virtual, the rest real."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__("time")
        self._clock = clock

    def time(self) -> float:
        return self._clock.now

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


@dataclass
class PatchedTime:
    """Every loaded corral module that imported `time` reads the virtual clock instead, so lease
    and heartbeat expiry follow the steps, not the wall clock. Undone by `restore`."""

    clock: VirtualClock
    patched: list[types.ModuleType] = field(default_factory=list)

    def install(self) -> None:
        fake = _TimeModule(self.clock)
        for name, module in list(sys.modules.items()):
            if name.startswith("corral.") and getattr(module, "time", None) is time:
                module.time = fake  # type: ignore[attr-defined]
                self.patched.append(module)

    def restore(self) -> None:
        for module in self.patched:
            module.time = time  # type: ignore[attr-defined]
        self.patched.clear()


# -- the engine ---------------------------------------------------------------------------------


@dataclass
class Process:
    """One attempt as the engine runs it."""

    launch: AttemptLaunch
    phase: AttemptPhase = AttemptPhase.PENDING
    exit_code: int | None = None
    reason: FailureReason | None = None
    stop_grace: float | None = None  # set when Corral asked to stop it
    started_at: float | None = None
    finished_at: float | None = None

    @property
    def live(self) -> bool:
        return self.phase in LIVE_PHASES

    @property
    def gpus(self) -> set[tuple[str, int]]:
        return {(i.node, g.index) for i in self.launch.instances for g in i.gpus}

    @property
    def job_id(self) -> int:
        return int(self.launch.job_id)


class ControlledEngine(FakeEngine):
    """FakeEngine with processes that only change when a step says so. A stop with a grace period
    is a SIGTERM the process has not acted on yet (it exits 143 at a `stop_takes_effect` step, or
    exits on its own first); a stop with no grace kills it at once; a process whose node is lost
    is lost with it. Attempts the engine never launched poll as LOST, as every engine reports."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__([gpu_node(n, address=f"10.0.0.{i + 1}") for i, n in enumerate(NODES)])
        self.clock = clock
        self.procs: dict[str, Process] = {}
        self.launch_order: list[str] = []
        self.stop_before_launch: set[str] = set()
        self.lost_nodes: set[str] = set()

    def launch(self, attempt: AttemptLaunch) -> str:
        self.launch_calls += 1
        if attempt.attempt_id not in self.procs:  # idempotent per attempt id
            self.procs[attempt.attempt_id] = Process(attempt)
            self.launch_order.append(attempt.attempt_id)
            self.launched[attempt.attempt_id] = attempt
            if any(i.node in self.lost_nodes for i in attempt.instances):
                self._end(self.procs[attempt.attempt_id], AttemptPhase.LOST, None, FailureReason.NODE_LOST)
        return f"ref-{attempt.attempt_id}"

    def poll(self, attempt_ids: Iterable[str]) -> Mapping[str, AttemptStatus]:
        out = {}
        for attempt_id in attempt_ids:
            proc = self.procs.get(attempt_id)
            if proc is None:
                out[attempt_id] = AttemptStatus(attempt_id, AttemptPhase.LOST, message="unknown attempt")
                continue
            out[attempt_id] = AttemptStatus(
                attempt_id,
                proc.phase,
                exit_code=proc.exit_code,
                reason=proc.reason,
                started_at=proc.started_at,
                finished_at=proc.finished_at,
                engine_ref=f"ref-{attempt_id}",
            )
        return out

    def stop(self, attempt_id: str, grace_s: float) -> None:
        self.stopped.append((attempt_id, grace_s))
        proc = self.procs.get(attempt_id)
        if proc is None:
            self.stop_before_launch.add(attempt_id)
            return
        if not proc.live:
            return
        proc.stop_grace = grace_s if proc.stop_grace is None else min(proc.stop_grace, grace_s)
        if grace_s <= 0:
            self._end(proc, AttemptPhase.FAILED, 137, FailureReason.STOPPED)

    def _end(
        self, proc: Process, phase: AttemptPhase, code: int | None, reason: FailureReason | None
    ) -> None:
        proc.phase, proc.exit_code, proc.reason = phase, code, reason
        proc.started_at = proc.started_at or self.clock.now - 1
        proc.finished_at = self.clock.now

    # steps
    def start(self, attempt_id: str) -> None:
        proc = self.procs.get(attempt_id)
        if proc is not None and proc.phase is AttemptPhase.PENDING:
            proc.phase, proc.started_at = AttemptPhase.RUNNING, self.clock.now

    def exit(self, attempt_id: str, code: int) -> None:
        proc = self.procs.get(attempt_id)
        if proc is not None and proc.live:
            phase = AttemptPhase.SUCCEEDED if code == 0 else AttemptPhase.FAILED
            self._end(proc, phase, code, None if code == 0 else FailureReason.EXIT_CODE)

    def lose(self, attempt_id: str) -> None:
        proc = self.procs.get(attempt_id)
        if proc is not None and proc.live:
            self._end(proc, AttemptPhase.LOST, None, FailureReason.NODE_LOST)

    def stop_takes_effect(self, attempt_id: str) -> None:
        proc = self.procs.get(attempt_id)
        if proc is not None and proc.live and proc.stop_grace is not None:
            self._end(proc, AttemptPhase.FAILED, 143, FailureReason.STOPPED)

    def node_lost(self, node: str) -> None:
        """The node stops reporting and what ran on it is gone with it."""
        self.lost_nodes.add(node)
        self.reports = [r for r in self.reports if r.name != node]
        for proc in self.procs.values():
            if proc.live and any(i.node == node for i in proc.launch.instances):
                self._end(proc, AttemptPhase.LOST, None, FailureReason.NODE_LOST)

    def node_back(self, node: str) -> None:
        if node in self.lost_nodes:
            self.lost_nodes.discard(node)
            self.reports.append(gpu_node(node, address=f"10.0.0.{NODES.index(node) + 1}"))


# -- launches held until a step runs them ------------------------------------------------------


class HeldLaunches(ThreadPoolExecutor):
    """The dispatch loop's launch pool, except that a launch runs only at a `launch` step (in the
    caller's thread). Dropping it with its server is a server killed with launches in flight."""

    def __init__(self) -> None:
        super().__init__(max_workers=1)
        self.held: list[Callable[[], object]] = []

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        self.held.append(lambda: fn(*args, **kwargs))
        return Future()

    def run_one(self) -> bool:
        if not self.held:
            return False
        self.held.pop(0)()
        return True


# -- races --------------------------------------------------------------------------------------


class RaceHook:
    """Runs an action right before the k-th write transaction of a tick starts (its first
    INSERT/UPDATE/DELETE), on another thread, as another loop or server doing it at that moment
    would. The ticking thread waits for the action, unless the action is blocked by a lock the
    tick holds: then the tick goes on, and the action finishes once the tick's transaction ends."""

    WRITES = ("INSERT", "UPDATE", "DELETE")

    def __init__(self) -> None:
        self.thread: int | None = None
        self.k = 0
        self.action: Callable[[], None] | None = None
        self.writes_seen = 0
        self.worker: threading.Thread | None = None
        self.error: BaseException | None = None
        self.fired = False

    def install(self, engine: Engine) -> None:
        event.listen(engine, "before_cursor_execute", self._before)

    def _before(self, conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if self.action is None or threading.get_ident() != self.thread:
            return
        if not statement.lstrip()[:6].upper().startswith(self.WRITES):
            return
        transaction = conn.get_transaction()
        if conn.info.get("corral_race_wrote") is transaction:  # not the first write of it
            return
        conn.info["corral_race_wrote"] = transaction
        self.writes_seen += 1
        if self.writes_seen - 1 != self.k:
            return
        action, self.action = self.action, None
        self.fired = True

        def run() -> None:
            try:
                action()
            except BaseException as exc:  # reported by `during`
                self.error = exc

        self.worker = threading.Thread(target=run, name="race")
        self.worker.start()
        self.worker.join(1.0)

    def during(self, k: int, action: Callable[[], None], tick: Callable[[], object]) -> bool:
        """Run `tick` with `action` raced before its k-th write transaction; True if it fired."""
        self.thread, self.k, self.action, self.writes_seen, self.fired = (
            threading.get_ident(),
            k,
            action,
            0,
            False,
        )
        self.worker, self.error = None, None
        try:
            tick()
        finally:
            self.action, self.thread = None, None
            if self.worker is not None:
                self.worker.join(30.0)
                if self.worker.is_alive():
                    raise RuntimeError("the raced action is still blocked 30 s after the tick ended")
        if self.error is not None:
            raise self.error
        return self.fired


# -- servers and the world ----------------------------------------------------------------------


@dataclass
class Server:
    """One server process: its own pool of connections, lease owner id and launch pool."""

    ctx: ServerContext
    db: Engine
    launches: HeldLaunches
    generation: int

    def queue(self) -> LaunchQueue:
        queue = self.ctx.memory.launch_queue
        assert isinstance(queue, LaunchQueue)
        return queue

    def unrecorded(self) -> set[str]:
        """Attempts whose launch reached the engine but is not recorded yet: the dispatch loop
        settles them (records or stops them) at its next tick."""
        return {r[1] for r in self.queue().done}


@dataclass(frozen=True)
class Violation:
    invariant: str
    job_id: int
    detail: str


def _spec(name: str, gpus: int, priority: str, preemptible: bool, retries: int) -> JobSpecV1:
    return JobSpecV1.model_validate(
        {
            "name": name,
            "priority": priority,
            "preemptible": preemptible,
            "retries": retries,
            "tasks": {"main": {"command": "train", "resources": {"gpus": gpus, "cpus": 1, "memory": "1GiB"}}},
        }
    )


class World:
    """The system under test plus what the invariants remember between steps."""

    def __init__(self, url: str, home: Path, servers: int = 2) -> None:
        self.url = url
        self.clock = VirtualClock()
        self.time = PatchedTime(self.clock)
        self.engine = ControlledEngine(self.clock)
        self.settings = Settings(home=home, virtual_gpus=4)
        self.race = RaceHook()
        self.jobs: list[int] = []
        self.terminal: dict[int, str] = {}
        self.violations: list[Violation] = []
        self.seen: set[tuple[str, int]] = set()
        self.races_fired = 0
        self._generations = itertools.count()
        self.servers: list[Server] = []
        self.api_db = self._make_db()
        self.api = sessionmaker(bind=self.api_db, expire_on_commit=False)
        self.time.install()
        try:  # a world that cannot start leaves the real clock in place for the tests after it
            self.principals = self._seed()
            self.servers = [self._start_server(i) for i in range(servers)]
            self.tick(0, "nodes")
        except BaseException:
            self.close()
            raise

    def _make_db(self) -> Engine:
        db = make_engine(self.url)
        self.race.install(db)
        return db

    def _start_server(self, index: int) -> Server:
        generation = next(self._generations)
        db = self._make_db()
        factory = sessionmaker(bind=db, expire_on_commit=False)
        ctx = ServerContext(self.settings, factory, self.engine, f"server{index}:{generation}")
        launches = HeldLaunches()
        ctx.memory.launch_queue = LaunchQueue(launches)
        return Server(ctx, db, launches, generation)

    def _seed(self) -> dict[str, Principal]:
        if not self._from_template():
            self._create_and_seed()
        principals = {}
        with self.api() as session:
            for group in session.scalars(select(Group)):
                user = session.scalars(select(User).where(User.default_group_id == group.id)).one()
                principals[group.name] = Principal(user.id, user.name, False, group.id, {group.id: "member"})
        return principals

    def _from_template(self) -> bool:
        """A new SQLite file is a copy of the first one made in this process (schema and tenants),
        which is much faster than create_all each time."""
        database = self.api_db.url.database
        if self.api_db.dialect.name != "sqlite" or not database:
            return False
        if _SQLITE_TEMPLATE:
            Path(database).write_bytes(_SQLITE_TEMPLATE[0])
            return True
        self._create_and_seed()
        self.api_db.dispose()
        _SQLITE_TEMPLATE.append(Path(database).read_bytes())
        return True

    def _create_and_seed(self) -> None:
        Base.metadata.create_all(self.api_db)
        with self.api() as session:
            for name in GROUPS:
                group = Group(name=name, created_at=self.clock.now, weight=1.0, borrowing=True)
                group.quotas = [GroupQuota(gpu_model="*", guaranteed=4, max=None)]
                session.add(group)
                session.flush()
                user = User(
                    name=f"u{name}",
                    is_admin=False,
                    default_group_id=group.id,
                    created_at=self.clock.now,
                    active=True,
                )
                session.add(user)
                session.flush()
                session.add(Membership(user_id=user.id, group_id=group.id, role="member"))
            session.commit()

    def close(self) -> None:
        for server in self.servers:
            server.launches.shutdown(wait=False)
            server.db.dispose()
        self.api_db.dispose()
        self.time.restore()

    # -- steps --------------------------------------------------------------------------------

    def job(self, pick: int) -> int | None:
        """A job not seen ended yet (cancelling an ended one is a 409 that tests nothing)."""
        open_jobs = [j for j in self.jobs if j not in self.terminal] or self.jobs
        return open_jobs[pick % len(open_jobs)] if open_jobs else None

    def attempt_of(self, pick: int) -> str | None:
        """One of the attempts the engine runs now (in launch order)."""
        live = [a for a in self.engine.launch_order if self.engine.procs[a].live]
        return live[pick % len(live)] if live else None

    def submit(self, group: str, gpus: int, priority: str, preemptible: bool, retries: int = 0) -> None:
        spec = _spec(f"j{len(self.jobs)}", gpus, priority, preemptible, retries)
        profile = active_profile(self.settings)
        with self.api() as session:
            view = submit_job(session, self.principals[group], spec, profile, now=self.clock.now)
        self.jobs.append(int(view["id"]))

    def cancel(self, pick: int) -> None:
        job_id = self.job(pick)
        if job_id is None:
            return
        with self.api() as session:
            owner = session.scalar(select(Job.group_id).where(Job.id == job_id))
            principal = next(p for p in self.principals.values() if p.default_group_id == owner)
            try:
                cancel_job(session, principal, job_id, now=self.clock.now)
            except Conflict:  # it has already ended: the API answers 409
                session.rollback()

    def tick(self, server: int, loop: str) -> None:
        """One tick of `loop` on `server`, if that server holds (or can take) the loop's lease."""
        srv = self._holder(server, loop)
        if srv is not None:
            LOOPS[loop](srv.ctx, self.clock.now)

    def _holder(self, server: int, loop: str) -> Server | None:
        """The server that ticks `loop` now: `server` if it holds (or can take) the loop's lease,
        as the runner checks before every tick, else the other one if it does."""
        for i in range(len(self.servers)):
            srv = self.servers[(server + i) % len(self.servers)]
            with srv.ctx.session_factory() as session:
                if claim_lease(session, loop, srv.ctx.owner_id, self.clock.now):
                    return srv
        return None

    def raced_tick(self, server: int, loop: str, k: int, action: Callable[[], None]) -> None:
        srv = self._holder(server, loop)
        if srv is None:
            return
        ctx = srv.ctx
        if self.race.during(k, action, lambda: LOOPS[loop](ctx, self.clock.now)):
            self.races_fired += 1
        else:  # the tick wrote less than k + 1 times: the action comes just after it
            action()

    def busy_cluster(self) -> None:
        """The usual start: group b runs two preemptible 4-GPU jobs on n1 and n2, the second on
        GPUs borrowed from group a's guarantee (a job of a's reclaims them)."""
        self.submit("b", 4, "normal", True)
        self.submit("b", 4, "normal", True)
        self.cycle(0)
        for attempt_id in list(self.engine.procs):
            self.engine.start(attempt_id)
        self.tick(0, "reconcile")

    def preempt(self, server: int, group: str, priority: str) -> None:
        """A 4-GPU job that the scheduler makes room for by preemption when it can (group a
        reclaiming its guarantee from b's borrowed GPUs, or a higher priority within a group),
        then a schedule tick on `server`."""
        self.submit(group, 4, priority, True)
        self.tick(server, "schedule")

    def cycle(self, server: int) -> None:
        """A round of every loop on `server`, its launches reaching the engine and being recorded:
        what a quiet server does in a fraction of a second."""
        self.tick(server, "nodes")
        self.tick(server, "schedule")
        self.tick(server, "dispatch")
        while self.servers[server % len(self.servers)].launches.run_one():
            pass
        self.tick(server, "dispatch")
        self.tick(server, "reconcile")

    def launch(self, server: int) -> None:
        """The next launch held in `server`'s pool (else the other's) reaches the engine."""
        for i in range(len(self.servers)):
            if self.servers[(server + i) % len(self.servers)].launches.run_one():
                return

    def restart(self, server: int) -> None:
        """The server process dies (launches in flight and unrecorded results die with it; its
        leases stay until they expire) and a new one starts on the same database and engine."""
        index = server % len(self.servers)
        old = self.servers[index]
        old.launches.held.clear()
        old.launches.shutdown(wait=False)
        old.db.dispose()
        self.servers[index] = self._start_server(index)

    def engine_step(self, what: str, pick: int) -> None:
        attempt_id = self.attempt_of(pick)
        if attempt_id is None:
            return
        if what == "start":
            self.engine.start(attempt_id)
        elif what == "exit0":
            self.engine.exit(attempt_id, 0)
        elif what == "exit1":
            self.engine.exit(attempt_id, 1)
        elif what == "lost":
            self.engine.lose(attempt_id)
        elif what == "stop_takes_effect":
            self.engine.stop_takes_effect(attempt_id)
        else:
            raise ValueError(f"unknown engine step {what!r}")

    def attempt_ends(self, what: str, pick: int, server: int) -> None:
        """An attempt exits 0 or 1 or is lost, and the reconcile loop's next tick sees it."""
        self.engine_step(what, pick)
        self.tick(server, "reconcile")

    def node(self, what: str, node: str) -> None:
        if what == "lost":
            self.engine.node_lost(node)
        else:
            self.engine.node_back(node)

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def race_action(self, what: str, pick: int, server: int, ticking: str) -> Callable[[], None]:
        """An action for `raced_tick` of the loop `ticking`: an API call, an engine event seen by a
        reconcile tick, or a tick of another loop. Never a second tick of the `ticking` loop: its
        lease lets one tick of a loop run at a time across all servers."""

        def act() -> None:
            if what == "cancel":
                self.cancel(pick)
            elif what in ("exit0", "exit1", "lost"):
                self.engine_step(what, pick)
                if ticking != "reconcile":
                    self.tick(server, "reconcile")
            elif what in LOOPS:
                if what != ticking:
                    self.tick(server, what)
            else:
                raise ValueError(f"unknown race action {what!r}")

        return act

    def do(self, name: str, args: tuple[object, ...]) -> None:
        """One step by name, as bench/lifecycle_races.py draws them and the sequence tests list them."""
        if name == "raced_tick":
            server, loop, k, what, pick, racer = args
            assert isinstance(server, int) and isinstance(loop, str) and isinstance(k, int)
            assert isinstance(what, str) and isinstance(pick, int) and isinstance(racer, int)
            self.raced_tick(server, loop, k, self.race_action(what, pick, racer, loop))
            return
        method: Callable[..., None] = self.engine_step if name == "engine" else getattr(self, name)
        method(*args)

    # -- invariants ---------------------------------------------------------------------------

    def check(self) -> list[Violation]:
        """Check every invariant; returns the violations not reported before (also kept)."""
        found: list[Violation] = []
        with self.api() as session:
            jobs = {j.id: j for j in session.scalars(select(Job))}
            attempts = list(session.scalars(select(Attempt)))
            claims = list(session.scalars(select(GpuClaim)))
            events = list(session.scalars(select(JobEvent).order_by(JobEvent.id)))
        found += self._terminal_final(jobs, events)
        found += self._no_run_after_success(jobs, attempts)
        found += self._no_run_after_cancel(jobs, attempts)
        found += self._gpu_held_once(claims, attempts)
        found += self._legal_history(jobs, events)
        new = []
        for violation in found:
            key = (violation.invariant, violation.job_id)
            if key not in self.seen:
                self.seen.add(key)
                new.append(violation)
        self.violations += new
        return new

    def _terminal_final(self, jobs: Mapping[int, Job], events: list[JobEvent]) -> Iterator[Violation]:
        """Seen terminal at an earlier check, or recorded terminal in the job's own history (an
        overwrite inside one step), the job is in that state now."""
        for ev in events:
            if ev.kind == "transition" and ev.to_state and JobState(ev.to_state).terminal:
                self.terminal.setdefault(ev.job_id, ev.to_state)
        for job_id, job in jobs.items():
            before = self.terminal.get(job_id)
            if before is not None and job.state != before:
                yield Violation("terminal_final", job_id, f"was {before}, now {job.state}")
            elif before is None and JobState(job.state).terminal:
                self.terminal[job_id] = job.state

    def _live_processes(self, job_id: int) -> list[str]:
        unrecorded = set().union(*(s.unrecorded() for s in self.servers))
        return [
            a for a, p in self.engine.procs.items() if p.job_id == job_id and p.live and a not in unrecorded
        ]

    def _no_run_after_success(self, jobs: Mapping[int, Job], attempts: list[Attempt]) -> Iterator[Violation]:
        """A job whose work exited 0 on its own (no stop asked) is done: it is not queued again and
        no later attempt is launched; a SUCCEEDED job has no live attempt or process."""
        done: dict[int, int] = {}  # job id -> number of the attempt that exited 0 unasked
        for proc in self.engine.procs.values():
            if proc.phase is AttemptPhase.SUCCEEDED and proc.stop_grace is None:
                done.setdefault(proc.job_id, proc.launch.attempt)
        numbers: dict[int, list[int]] = {}
        for attempt in attempts:
            numbers.setdefault(attempt.job_id, []).append(attempt.number)
        for job_id, number in done.items():
            job = jobs.get(job_id)
            if job is not None and job.state == JobState.QUEUED.value:
                detail = f"attempt {number} exited 0, yet the job is queued"
                yield Violation("no_run_after_success", job_id, detail)
            later = [p.launch.attempt for p in self.engine.procs.values() if p.job_id == job_id]
            later += numbers.get(job_id, [])
            if max(later) > number:
                detail = f"attempt {number} exited 0, yet there is attempt {max(later)}"
                yield Violation("no_run_after_success", job_id, detail)
        for job_id, job in jobs.items():
            if job.state == JobState.SUCCEEDED.value:
                yield from self._runs_while(job_id, job.state, attempts, "no_run_after_success")

    def _no_run_after_cancel(self, jobs: Mapping[int, Job], attempts: list[Attempt]) -> Iterator[Violation]:
        for job_id, job in jobs.items():
            if job.state == JobState.CANCELLED.value:
                yield from self._runs_while(job_id, job.state, attempts, "no_run_after_cancel")

    def _runs_while(self, job_id: int, state: str, attempts: list[Attempt], name: str) -> Iterator[Violation]:
        live_rows = [a.attempt_id for a in attempts if a.job_id == job_id and not _attempt_finished(a.state)]
        if live_rows:
            yield Violation(name, job_id, f"job is {state} but attempt {live_rows} is live in the database")
        processes = self._live_processes(job_id)
        if processes:
            yield Violation(name, job_id, f"job is {state} but the engine still runs {processes}")

    def _gpu_held_once(self, claims: list[GpuClaim], attempts: list[Attempt]) -> Iterator[Violation]:
        by_pk = {a.id: a.attempt_id for a in attempts}
        holder: dict[tuple[str, int], str] = {}
        for claim in claims:
            holder[(claim.node, claim.gpu_index)] = by_pk.get(claim.attempt_pk, f"pk{claim.attempt_pk}")
        running: dict[tuple[str, int], str] = {}
        for attempt_id, proc in self.engine.procs.items():
            if not proc.live:
                continue
            for gpu in sorted(proc.gpus):
                other = running.setdefault(gpu, attempt_id)
                if other != attempt_id:
                    yield Violation(
                        "gpu_held_once", proc.job_id, f"GPU {gpu} runs {other} and {attempt_id} at once"
                    )
                claimed = holder.get(gpu)
                if claimed is not None and claimed != attempt_id:
                    yield Violation(
                        "gpu_held_once",
                        proc.job_id,
                        f"GPU {gpu} is claimed by {claimed} while {attempt_id} runs on it",
                    )

    def _legal_history(self, jobs: Mapping[int, Job], events: list[JobEvent]) -> Iterator[Violation]:
        by_job: dict[int, list[JobEvent]] = {}
        for ev in events:
            if ev.kind == "transition":
                by_job.setdefault(ev.job_id, []).append(ev)
        for job_id, job in jobs.items():
            history = by_job.get(job_id, [])
            path = " -> ".join(str(e.to_state) for e in history)
            previous: str | None = None
            for ev in history:
                if ev.from_state != previous:
                    yield Violation(
                        "legal_history", job_id, f"{ev.from_state}->{ev.to_state} after {previous} ({path})"
                    )
                    break
                if previous is not None and not can_transition(
                    JobState(previous), JobState(str(ev.to_state))
                ):
                    yield Violation(
                        "legal_history", job_id, f"{previous}->{ev.to_state} is not allowed ({path})"
                    )
                    break
                previous = ev.to_state
            if previous != job.state:
                yield Violation(
                    "legal_history", job_id, f"job is {job.state}, its history ends at {previous}"
                )


def _attempt_finished(state: str) -> bool:
    return state not in ("scheduled", "starting", "running")


def reset_postgres(url: str) -> None:
    """Empty every table of a PostgreSQL database made by create_all (ids restart at 1)."""
    db = make_engine(url)
    try:
        Base.metadata.create_all(db)
        names = ", ".join(f'"{t.name}"' for t in Base.metadata.sorted_tables)
        with db.begin() as conn:
            conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    finally:
        db.dispose()
