"""A stateful property test of job, attempt and GPU state under interleaved loops and servers.

Hypothesis interleaves: submits and cancels (the API's services), ticks of the schedule,
dispatch, reconcile and node loops of two servers (each holding its loops' leases like a real
server), launches reaching the engine, attempts starting, exiting 0 or 1, getting lost or acting
on a stop, nodes lost and back, time passing, server restarts (in-flight launches and unrecorded
results lost), and ticks raced by another action (a cancel, an engine event seen by a reconcile
tick, another loop) right before one of the tick's write transactions. Preemptions come from the
scheduler itself: group b borrows group a's guaranteed GPUs, a's jobs reclaim them, and higher
priority displaces lower within a group.

After every step (tests/server/lifecycle_world.py): terminal states are final; no job runs after
it succeeded or was cancelled; no GPU is held twice; every job's event history is a legal path
of the job state machine. On SQLite and on PostgreSQL. bench/lifecycle_races.py is the long run.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from tests.pg import PostgresServer
from tests.server.lifecycle_world import GROUPS, LOOPS, NODES, World, reset_postgres

SHORT = settings(
    max_examples=30,
    stateful_step_count=30,
    deadline=None,
    derandomize=False,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
SERVERS = st.integers(0, 1)
PICK = st.integers(0, 3)  # a job (or a running attempt) among those there are, modulo their number
RACES = st.sampled_from(["cancel", "exit0", "exit1", "lost", *LOOPS])


class LifecycleMachine(RuleBasedStateMachine):
    """Subclassed per database with `make_world` set."""

    make_world: Callable[[], World]

    def __init__(self) -> None:
        super().__init__()
        self.world = type(self).make_world()

    @initialize()
    def busy_cluster(self) -> None:
        self.world.busy_cluster()

    @rule(
        group=st.sampled_from(GROUPS),
        gpus=st.sampled_from([2, 4]),
        priority=st.sampled_from(["low", "normal", "high"]),
        preemptible=st.booleans(),
        retries=st.integers(0, 1),
    )
    def submit(self, group: str, gpus: int, priority: str, preemptible: bool, retries: int) -> None:
        self.world.submit(group, gpus, priority, preemptible, retries)

    @rule(pick=PICK)
    def cancel(self, pick: int) -> None:
        self.world.cancel(pick)

    @rule(server=SERVERS, loop=st.sampled_from(list(LOOPS)))
    def tick(self, server: int, loop: str) -> None:
        self.world.tick(server, loop)

    @rule(
        server=SERVERS,
        loop=st.sampled_from(list(LOOPS)),
        k=st.integers(0, 2),
        what=RACES,
        pick=PICK,
        racer=SERVERS,
    )
    def raced_tick(self, server: int, loop: str, k: int, what: str, pick: int, racer: int) -> None:
        self.world.raced_tick(server, loop, k, self.world.race_action(what, pick, racer))

    @rule(server=SERVERS)
    def cycle(self, server: int) -> None:
        self.world.cycle(server)

    @rule(server=SERVERS)
    def launch(self, server: int) -> None:
        self.world.launch(server)

    @rule(server=SERVERS)
    def restart(self, server: int) -> None:
        self.world.restart(server)

    @rule(what=st.sampled_from(["start", "exit0", "exit1", "lost", "stop_takes_effect"]), pick=PICK)
    def engine(self, what: str, pick: int) -> None:
        self.world.engine_step(what, pick)

    @rule(what=st.sampled_from(["lost", "back"]), node=st.sampled_from(NODES))
    def node(self, what: str, node: str) -> None:
        self.world.node(what, node)

    @rule(seconds=st.sampled_from([1.0, 3.0, 7.0, 11.0]))
    def advance(self, seconds: float) -> None:
        self.world.advance(seconds)

    @invariant()
    def invariants_hold(self) -> None:
        new = self.world.check()
        assert not new, "; ".join(f"{v.invariant}: job {v.job_id}: {v.detail}" for v in new)

    def teardown(self) -> None:
        self.world.close()


def test_lifecycle_invariants_on_sqlite() -> None:
    made: list[str] = []

    def make_world() -> World:
        home = tempfile.mkdtemp(prefix="corral-races-")
        made.append(home)
        return World(f"sqlite:///{home}/db.sqlite", Path(home))

    machine = type("SqliteLifecycle", (LifecycleMachine,), {"make_world": staticmethod(make_world)})
    try:
        run_state_machine_as_test(machine, settings=SHORT)
    finally:
        for home in made:
            shutil.rmtree(home, ignore_errors=True)


def test_lifecycle_invariants_on_postgres_with_two_servers(postgres_server: PostgresServer) -> None:
    url = postgres_server.create_database()
    home = tempfile.mkdtemp(prefix="corral-races-")

    def make_world() -> World:
        reset_postgres(url)
        return World(url, Path(home))

    machine = type("PostgresLifecycle", (LifecycleMachine,), {"make_world": staticmethod(make_world)})
    try:
        run_state_machine_as_test(machine, settings=SHORT)
    finally:
        shutil.rmtree(home, ignore_errors=True)
