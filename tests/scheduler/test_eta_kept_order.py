"""The expected-start order taken from the last targeted read without popping
(eta_kept.OrderRecorder, KeptOrder): where the rule lets it skip, the queue gives exactly the pops
a fresh queue gives (the same jobs in the same order, the same shares to the bit); where the
shares moved too far apart, or a new arrival could come first, it pops as before."""

from __future__ import annotations

import random
from collections.abc import Mapping

import pytest

from corral.scheduler.eta_kept import KeptOrder, OrderRecorder
from corral.scheduler.queues import FairShareQueue
from corral.scheduler.types import Job
from tests.scheduler.builders import job

HORIZON = 3600.0
NEVER: Mapping[str, object] = {}


def _queue(jobs: list[Job], usage: dict[str, float], weights: dict[str, float]) -> FairShareQueue:
    """A fair-share queue as DiagnosisView._start_queue builds it (per group and user, in order)."""
    by_user: dict[str, dict[str, list[Job]]] = {}
    for j in jobs:
        by_user.setdefault(j.group, {}).setdefault(j.user, []).append(j)
    user_usage = {(j.group, j.user): usage.get(j.group, 0.0) for j in jobs}
    return FairShareQueue(by_user, set(), weights, usage, user_usage, HORIZON)


def _pop(queue: FairShareQueue, n: int, recorder: OrderRecorder | None = None) -> list[Job]:
    out = []
    for _ in range(n):
        j = queue.pop()
        if j is None:
            break
        if recorder is not None:
            recorder.popped(j)
        queue.charge(j)
        out.append(j)
    return out


def _world(rng: random.Random, groups: int) -> tuple[list[Job], dict[str, float], dict[str, float]]:
    jobs = [
        job(f"j{i}", gpus=rng.choice((1, 2, 4, 8)), group=f"g{rng.randrange(groups)}", submit=float(i))
        for i in range(rng.randrange(10, 60))
    ]
    for j in jobs:  # one user per group (the case the rule covers)
        object.__setattr__(j, "user", "u" + j.group)
    usage = {f"g{g}": rng.uniform(0, 1e6) for g in range(groups)}
    weights = {f"g{g}": rng.choice((1.0, 2.0, 0.5)) for g in range(groups)}
    return jobs, usage, weights


def _kept(jobs: list[Job], usage: dict[str, float], weights: dict[str, float], n: int) -> KeptOrder:
    queue = _queue(jobs, usage, weights)
    recorder = OrderRecorder(queue, NEVER)
    return recorder.record(_pop(queue, n, recorder))


def _later(
    rng: random.Random, jobs: list[Job], usage: dict[str, float], scale: float, groups: int
) -> tuple[list[Job], dict[str, float]]:
    """The next cycle: each group's usage moved by its own amount, a few jobs arrived."""
    moved = {g: max(0.0, u + rng.uniform(-scale, scale)) for g, u in usage.items()}
    arrivals = [
        job(f"n{i}", gpus=rng.choice((1, 2, 4)), group=f"g{rng.randrange(groups)}", submit=1000.0 + i)
        for i in range(rng.randrange(0, 4))
    ]
    for j in arrivals:
        object.__setattr__(j, "user", "u" + j.group)
    return jobs + arrivals, moved


@pytest.mark.parametrize("scale", [0.0, 10.0, 1e3, 1e5])
def test_the_order_taken_without_popping_is_the_popped_order(scale: float) -> None:
    """Three cycles after a fresh one, each with its own moves and arrivals: each later cycle's
    record starts from the one before (a skip's record carries the kept bounds over)."""
    rng = random.Random(int(scale) + 7)
    skipped = declined = 0
    for _ in range(200):
        groups = rng.randrange(1, 6)
        jobs, usage, weights = _world(rng, groups)
        kept = _kept(jobs, usage, weights, rng.randrange(1, len(jobs)))
        for _ in range(3):
            jobs, usage = _later(rng, jobs, usage, scale, groups)
            fresh = _queue(jobs, usage, weights)
            queue = _queue(jobs, usage, weights)
            order: list[Job] = []
            seen: set[str] = set()
            recorder = OrderRecorder(queue, NEVER)
            recorder.skip(kept, order, seen, 2000)
            if recorder.skipped:
                skipped += 1
                assert order == kept.jobs and seen == {j.id for j in kept.jobs}
            else:
                declined += 1
                assert not order
            depth = len(kept.jobs) + rng.randrange(0, 5)  # as far as a new target
            rest = _pop(queue, depth - len(order), recorder)
            expected = _pop(fresh, depth)
            assert [j.id for j in order + rest] == [j.id for j in expected]
            assert queue.group_share == fresh.group_share  # to the bit: the same charges, in order
            assert queue.user_share == fresh.user_share
            kept = recorder.record(order + rest)  # (before the pops below: it counts what is left)
            assert [j.id for j in _pop(queue, len(jobs))] == [j.id for j in _pop(fresh, len(jobs))]
    assert skipped > 0
    if scale >= 1e5:
        assert declined > 0


def test_a_new_arrival_that_would_come_first_is_not_skipped() -> None:
    """g1's only job was popped second; a new g1 job arrives, and g1's share is below the kept
    order's later winners': a fresh queue pops it inside the kept prefix, so no skip."""
    a = [job(f"a{i}", gpus=1, group="g0", submit=float(i)) for i in range(4)]
    b = job("b0", gpus=1, group="g1", submit=0.5)
    for j in (*a, b):
        object.__setattr__(j, "user", "u" + j.group)
    usage, weights = {"g0": 0.0, "g1": 100.0}, {"g0": 1.0, "g1": 1.0}
    kept = _kept([*a, b], usage, weights, 5)
    assert [j.id for j in kept.jobs] == ["a0", "b0", "a1", "a2", "a3"]
    late = job("b1", gpus=1, group="g1", submit=2.0)
    object.__setattr__(late, "user", "ug1")
    queue = _queue([*a, b, late], usage, weights)
    recorder = OrderRecorder(queue, NEVER)
    order: list[Job] = []
    recorder.skip(kept, order, set(), 2000)
    assert recorder.skipped == 0 and not order
    assert [j.id for j in _pop(queue, 6, recorder)] == ["a0", "b0", "a1", "b1", "a2", "a3"]


def test_a_group_with_two_users_is_not_skipped() -> None:
    jobs = [job("x", gpus=1, group="g", user="u1"), job("y", gpus=1, group="g", user="u2", submit=1.0)]
    usage, weights = {"g": 0.0}, {"g": 1.0}
    kept = _kept(jobs, usage, weights, 1)
    recorder = OrderRecorder(_queue(jobs, usage, weights), NEVER)
    recorder.skip(kept, [], set(), 2000)
    assert recorder.skipped == 0


def test_a_record_made_on_a_skip_carries_the_moved_shares_over() -> None:
    """Cycle 1 pops a0-a2 (a's share 0, 3600, 7200 at the pops). Cycle 2: a's base moved up by
    1,000 and the pops are skipped; its record's winners' shares are up to 8,200. Cycle 3: group h
    arrives with a share of 8,000, below a's 8,200 at a2's pop, so it comes before a2: no skip
    (with cycle 1's bound of 7,200 carried over unmoved, h would have been taken as last)."""
    a = [job(f"a{i}", gpus=1, group="a", submit=float(i)) for i in range(3)]
    for j in a:
        object.__setattr__(j, "user", "ua")
    weights = {"a": 1.0, "h": 1.0}
    kept = _kept(a, {"a": 0.0}, weights, 3)
    queue = _queue(a, {"a": 1000.0}, weights)
    recorder = OrderRecorder(queue, NEVER)
    order: list[Job] = []
    recorder.skip(kept, order, set(), 2000)
    assert recorder.skipped == 3
    kept = recorder.record(order)
    h = job("h0", gpus=1, group="h", submit=5.0)
    object.__setattr__(h, "user", "uh")
    usage = {"a": 1000.0, "h": 8000.0}
    queue = _queue([*a, h], usage, weights)
    recorder = OrderRecorder(queue, NEVER)
    order = []
    recorder.skip(kept, order, set(), 2000)
    assert recorder.skipped == 0
    assert [j.id for j in _pop(queue, 4)] == [j.id for j in _pop(_queue([*a, h], usage, weights), 4)]
    assert [j.id for j in _pop(_queue([*a, h], usage, weights), 4)] == ["a0", "a1", "h0", "a2"]


def test_a_record_of_no_pops_takes_nothing() -> None:
    jobs = [job("x", gpus=1, group="g")]
    empty = _kept([], {}, {"g": 1.0}, 1)  # (the same weights: only the empty record differs)
    assert empty.jobs == []
    recorder = OrderRecorder(_queue(jobs, {"g": 0.0}, {"g": 1.0}), NEVER)
    order: list[Job] = []
    recorder.skip(empty, order, set(), 2000)
    assert recorder.skipped == 0 and not order
