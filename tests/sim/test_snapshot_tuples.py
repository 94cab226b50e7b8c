"""The simulator hands the scheduler the very same queued and running tuples while no job joined,
left, started, ended or was asked to stop (the scheduler's memos then skip their difference over
every job), and never a stale one."""

from __future__ import annotations

import random

from corral.scheduler import Scheduler
from corral.scheduler.profiles import PROFILES
from corral.scheduler.types import Plan, Snapshot
from corral.sim.replay import SimConfig, Simulator
from tests.sim.helpers import cluster, trace


class Recording:
    """A Scheduler that checks each snapshot against the simulator's own dicts."""

    def __init__(self) -> None:
        self.inner = Scheduler(PROFILES["default"])
        self.profile = self.inner.profile
        self.sim: Simulator | None = None
        self.snapshots: list[Snapshot] = []
        self.plans: list[Plan] = []

    def schedule(self, snapshot: Snapshot, now: float, rng: random.Random) -> Plan:
        assert self.sim is not None
        assert snapshot.queued == tuple(self.sim.queued.values())  # never stale
        assert snapshot.running == tuple(self.sim.running.values())
        self.snapshots.append(snapshot)
        plan = self.inner.schedule(snapshot, now, rng)
        self.plans.append(plan)
        return plan


def test_unchanged_queue_and_running_are_handed_over_as_the_same_tuples() -> None:
    # one 4-GPU node: a and b run while c, d, e and f arrive (the queue changes, running does
    # not); a's end starts f (both change); f's end while nothing starts (the queue does not)
    jobs = [("a", 0.0, 50.0, 2), ("b", 0.0, 500.0, 2), ("c", 1.0, 100.0, 2), ("d", 2.0, 100.0, 4)]
    jobs += [("e", 3.0, 10.0, 4), ("f", 4.0, 10.0, 1)]
    recording = Recording()
    sim = Simulator(trace(*jobs), cluster(1, 4), recording, "default", SimConfig())
    recording.sim = sim
    sim.run()
    snaps = recording.snapshots
    # pairs of cycles with nothing started or stopped by the first (its plan empty) and the same
    # jobs after it: the same tuple objects (equal contents alone may be a rebuilt tuple: a job
    # that started and ended in between)
    quiet = [
        (s, t)
        for s, t, plan in zip(snaps[:-1], snaps[1:], recording.plans[:-1], strict=True)
        if not plan.assignments and not plan.preemptions
    ]
    same_running = [(s, t) for s, t in quiet if s.running == t.running]
    same_queued = [(s, t) for s, t in quiet if s.queued == t.queued]
    assert same_running and same_queued
    assert all(s.running is t.running for s, t in same_running)
    assert all(s.queued is t.queued for s, t in same_queued)
