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

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.pg import PostgresServer
from tests.server.lifecycle_world import GROUPS, LOOPS, NODES, World, reset_postgres

# In the suite: the same 12 sequences of 30 steps on every run (10-20 s a database), and a failure
# is reported as it was found (shrinking takes minutes at ~40 ms a step). CORRAL_RACES_PROFILE=shrink
# to get a minimal failing sequence; bench/lifecycle_races.py for the long run.
settings.register_profile(
    "races-suite",
    max_examples=12,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
SUITE = settings.get_profile("races-suite")
settings.register_profile("races-shrink", SUITE, phases=list(Phase), derandomize=False)
SHORT = settings.get_profile(f"races-{os.environ.get('CORRAL_RACES_PROFILE', 'suite')}")
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

    @rule(server=SERVERS, group=st.sampled_from(GROUPS), priority=st.sampled_from(["normal", "high"]))
    def preempt(self, server: int, group: str, priority: str) -> None:
        self.world.preempt(server, group, priority)

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
        self.world.raced_tick(server, loop, k, self.world.race_action(what, pick, racer, loop))

    @rule(server=SERVERS)
    def cycle(self, server: int) -> None:
        self.world.cycle(server)

    def held_launches(self) -> bool:
        return any(s.launches.held for s in self.world.servers)

    def live_attempts(self) -> bool:
        return any(p.live for p in self.world.engine.procs.values())

    @precondition(held_launches)
    @rule(server=SERVERS)
    def launch(self, server: int) -> None:
        self.world.launch(server)

    @rule(server=SERVERS)
    def restart(self, server: int) -> None:
        self.world.restart(server)

    @precondition(live_attempts)
    @rule(what=st.sampled_from(["start", "exit0", "exit1", "lost", "stop_takes_effect"]), pick=PICK)
    def engine(self, what: str, pick: int) -> None:
        self.world.engine_step(what, pick)

    @precondition(live_attempts)
    @rule(what=st.sampled_from(["exit0", "exit1", "lost"]), pick=PICK, server=SERVERS)
    def attempt_ends(self, what: str, pick: int, server: int) -> None:
        self.world.attempt_ends(what, pick, server)

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


# Minimal sequences (after the busy start: b's jobs 1 on n1 and 2 on n2, 2 on borrowed GPUs) that
# broke an invariant here, kept as they are so that each stays fixed. `pick` counts among the open
# jobs (cancel) or the live attempts (engine steps), in order.
SEQUENCES: dict[str, list[tuple[str, tuple[object, ...]]]] = {
    # a preempted job whose attempt exits 0 before the stop is sent is requeued and runs again
    "preempted_job_exits_0": [("preempt", (0, "a", "normal")), ("attempt_ends", ("exit0", 1, 0))],
    # the completion commits while the schedule cycle preempts the job: SUCCEEDED -> PREEMPTED
    "completion_races_preemption": [
        ("submit", ("a", 4, "normal", True, 0)),
        ("raced_tick", (0, "schedule", 0, "exit0", 1, 1)),
    ],
    # the loss of an attempt is recorded (job requeued) while the schedule cycle preempts the job
    # (for job 4, high priority): QUEUED -> PREEMPTED from a stale read, and with no live attempt
    # nothing ever moves it on
    "attempt_lost_races_preemption": [
        ("preempt", (0, "a", "normal")),
        ("submit", ("b", 2, "high", True, 1)),
        ("raced_tick", (1, "schedule", 0, "lost", 2, 0)),
    ],
    # a cancel commits while the schedule cycle places the job: CANCELLED -> SCHEDULED
    "cancel_races_placement": [
        ("attempt_ends", ("exit0", 0, 0)),
        ("submit", ("a", 4, "normal", True, 0)),
        ("raced_tick", (0, "schedule", 0, "cancel", 1, 0)),
    ],
    # the server dies after engine.launch, before recording it; the job is cancelled, and the next
    # server cancels it without stopping what the engine already runs
    "cancel_after_launch_of_dead_server": [
        ("attempt_ends", ("exit0", 0, 0)),
        ("submit", ("a", 4, "normal", True, 0)),
        ("tick", (0, "schedule")),
        ("tick", (0, "dispatch")),
        ("launch", (0,)),
        ("restart", (0,)),
        ("cancel", (1,)),
        ("advance", (11.0,)),
        ("cycle", (1,)),
    ],
    # an attempt exits 0 and its node is lost before the exit is recorded: the engine still
    # knows how it ended, so the job succeeded and is not requeued to run again (found by
    # test_lifecycle_invariants_on_sqlite)
    "exit0_then_node_lost": [
        ("restart", (0,)),
        ("engine_step", ("exit0", 1)),
        ("advance", (11.0,)),
        ("node", ("lost", "n2")),
        ("cycle", (0,)),
    ],
    # a live but stalled server's launch waits in its pool past the job's row lease; the job is
    # cancelled and the other server settles it and frees its GPUs; the stale launch then starts
    # the process on GPUs the scheduler gives to the next job (found by the bench, seed 11)
    "stale_launch_after_lease_expired": [
        ("attempt_ends", ("exit0", 0, 0)),
        ("submit", ("a", 4, "normal", True, 0)),
        ("tick", (0, "schedule")),
        ("tick", (0, "dispatch")),
        ("cancel", (1,)),
        ("advance", (11.0,)),
        ("tick", (1, "dispatch")),
        ("launch", (0,)),
        ("submit", ("a", 4, "normal", True, 0)),
        ("tick", (1, "schedule")),
    ],
}


def run_sequence(world: World, steps: list[tuple[str, tuple[object, ...]]]) -> None:
    try:
        world.busy_cluster()
        assert not world.check()
        for number, (name, args) in enumerate(steps, 1):
            world.do(name, args)
            new = world.check()
            assert not new, f"after step {number} {name}{args}: " + "; ".join(
                f"{v.invariant}: job {v.job_id}: {v.detail}" for v in new
            )
    finally:
        world.close()


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_race_sequence_on_sqlite(name: str, tmp_path: Path) -> None:
    run_sequence(World(f"sqlite:///{tmp_path}/db.sqlite", tmp_path), SEQUENCES[name])


@pytest.mark.parametrize("name", list(SEQUENCES))
def test_race_sequence_on_postgres(name: str, postgres_server: PostgresServer, tmp_path: Path) -> None:
    url = postgres_server.create_database()
    reset_postgres(url)
    run_sequence(World(url, tmp_path), SEQUENCES[name])


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
