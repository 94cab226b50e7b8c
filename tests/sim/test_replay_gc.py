"""A replay holds back full garbage collections while it runs (replay_gc.py) and leaves Python's
collection thresholds as it found them: after a replay, after one that fails, and after
overlapping ones (the last to end restores them)."""

from __future__ import annotations

import gc
import random

import pytest

from corral.scheduler import Scheduler
from corral.scheduler.profiles import PROFILES
from corral.scheduler.types import Plan, Snapshot
from corral.sim import replay_gc
from corral.sim.replay import SimConfig, Simulator
from tests.sim.helpers import cluster, trace

JOBS = [("a", 0.0, 50.0, 2), ("b", 1.0, 500.0, 2), ("c", 2.0, 100.0, 4)]


class ThresholdsSeen:
    """A Scheduler that records the collection thresholds at each cycle (and may fail)."""

    def __init__(self, fail: bool = False) -> None:
        self.inner = Scheduler(PROFILES["default"])
        self.profile = self.inner.profile
        self.seen: list[tuple[int, int, int]] = []
        self.fail = fail

    def schedule(self, snapshot: Snapshot, now: float, rng: random.Random) -> Plan:
        self.seen.append(gc.get_threshold())
        if self.fail:
            raise RuntimeError("a plug-in scheduler failed")
        return self.inner.schedule(snapshot, now, rng)


@pytest.fixture
def thresholds() -> object:
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)  # Python's defaults, whatever the test runner set
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("thresholds")
def test_full_collections_wait_during_a_replay_and_the_thresholds_come_back() -> None:
    seen = ThresholdsSeen()
    Simulator(trace(*JOBS), cluster(1, 4), seen, "default", SimConfig()).run()
    assert seen.seen and all(t == (700, 10, replay_gc.FULL_COLLECTION_EVERY) for t in seen.seen)
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.usefixtures("thresholds")
def test_a_failed_replay_restores_the_thresholds() -> None:
    seen = ThresholdsSeen(fail=True)
    with pytest.raises(RuntimeError, match="plug-in scheduler failed"):
        Simulator(trace(*JOBS), cluster(1, 4), seen, "default", SimConfig()).run()
    assert seen.seen == [(700, 10, replay_gc.FULL_COLLECTION_EVERY)]
    assert gc.get_threshold() == (700, 10, 10)


@pytest.mark.usefixtures("thresholds")
def test_overlapping_replays_restore_the_thresholds_when_the_last_ends() -> None:
    gc.set_threshold(700, 10, 10)
    replay_gc.defer_full_collections()
    replay_gc.defer_full_collections()
    replay_gc.restore_full_collections()
    assert gc.get_threshold() == (700, 10, replay_gc.FULL_COLLECTION_EVERY)  # one still runs
    replay_gc.restore_full_collections()
    assert gc.get_threshold() == (700, 10, 10)
    gc.set_threshold(500, 20, 5000)  # above the replay's own: kept as it is
    replay_gc.defer_full_collections()  # another replay (in another thread) under way
    try:
        assert gc.get_threshold() == (500, 20, 5000)
        seen = ThresholdsSeen()
        Simulator(trace(*JOBS), cluster(1, 4), seen, "default", SimConfig()).run()
        assert seen.seen and all(t == (500, 20, 5000) for t in seen.seen)
        assert gc.get_threshold() == (500, 20, 5000)  # the other one still runs
    finally:
        replay_gc.restore_full_collections()
    assert gc.get_threshold() == (500, 20, 5000)  # as the first of them found them
