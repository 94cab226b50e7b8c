"""The quota_hold knob (off by default): a group's first job that its guarantee could hold but that
finds too little free guaranteed room holds that room until its shadow time (the group's running
work ending at its estimates); the group's later jobs may use it only if their estimate ends by
then, and work on borrowed quota may not take the GPUs the holder needs then."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings

from corral.scheduler import ANY_MODEL, PROFILES
from corral.scheduler.types import Job, Snapshot
from tests.scheduler.builders import gpu_node, group, job, plan_for, running, snap
from tests.scheduler.test_known_outcomes import assert_same, crowded, fresh_plan, twice

HOLD = dataclasses.replace(PROFILES["default"], quota_hold=True)
OFF = PROFILES["default"]
NOW = 1000.0
SHADOW = NOW + 1000.0  # when the group's running job ends, by its estimate


def _cluster(queued: list[Job]) -> Snapshot:
    """Group g (guarantee 8) runs 4 GPUs on n until SHADOW, so 4 of its guarantee are free now;
    group o (guarantee 8) fills m, so o's next job can only borrow. Free now: 4 GPUs on n and 4
    on k, enough for g's 8-GPU gang of two 4-GPU instances but for its guarantee."""
    groups = [group("g", guaranteed={ANY_MODEL: 8}), group("o", guaranteed={ANY_MODEL: 8})]
    mine = job("r", gpus=4, runtime=SHADOW)  # started at 0: ends at SHADOW
    theirs = job("full", gpus=8, group="o", runtime=1e6)
    run = [running(mine, "n", (0, 1, 2, 3)), running(theirs, "m", tuple(range(8)))]
    return snap([gpu_node("n"), gpu_node("m"), gpu_node("k", gpus=4)], queued, groups, run=run)


def _gang() -> Job:
    """g's gang: 8 GPUs, first in g's order (smallest GPU-time), not preemptible (it may not
    borrow: it waits for its guarantee)."""
    return job("gang", gpus=4, instances=2, submit=0, runtime=60.0, preemptible=False)


def test_the_holder_keeps_its_room_from_a_borrower() -> None:
    borrower = job("borrower", gpus=4, instances=2, group="o", submit=0, runtime=1e5)  # past SHADOW
    s = _cluster([_gang(), borrower])
    assert [a.job_id for a in plan_for(s, OFF, now=NOW).assignments] == ["borrower"]
    plan = plan_for(s, HOLD, now=NOW)
    assert plan.assignments == ()
    reason = plan.diagnoses["borrower"].reasons[0]
    assert reason.source == "admission:quota_hold" and "job gang" in reason.message
    # a borrower that ends (by its estimate) before the holder's shadow time may use the GPUs
    quick = dataclasses.replace(borrower, id="quick", runtime_estimate=500.0)
    assert [a.job_id for a in plan_for(_cluster([_gang(), quick]), HOLD, now=NOW).assignments] == ["quick"]
    # and one that leaves the gang its 8 GPUs at SHADOW (12 free by then) may run past it
    small = job("small", gpus=4, group="o", submit=0, runtime=1e5)
    assert [a.job_id for a in plan_for(_cluster([_gang(), small]), HOLD, now=NOW).assignments] == ["small"]


def test_a_short_job_of_the_group_may_backfill_the_held_room() -> None:
    # size order inside g: the gang (480 GPU-s) first, then short (1,200), then long (10,000);
    # neither may borrow, so only the group's guarantee can hold them
    short = job("short", gpus=2, submit=10, runtime=600.0, preemptible=False)  # ends before SHADOW
    long = job("long", gpus=2, submit=20, runtime=5000.0, preemptible=False)  # runs past SHADOW
    s = _cluster([_gang(), short, long])
    assert sorted(a.job_id for a in plan_for(s, OFF, now=NOW).assignments) == ["long", "short"]
    plan = plan_for(s, HOLD, now=NOW)
    assert [a.job_id for a in plan.assignments] == ["short"]
    assert plan.diagnoses["long"].reasons[0].code == "quota_exhausted"


def test_the_knob_parses_and_is_off_by_default() -> None:
    from corral.sim.runner import parse_knobs

    assert parse_knobs(["quota_hold=1"]) == {"quota_hold": True}
    assert OFF.quota_hold is False


@settings(max_examples=100, deadline=None)
@given(crowded())
def test_replayed_outcomes_equal_the_ordinary_path_with_holds(s: Snapshot) -> None:
    """Whether a job may use held room reads its own estimate: the outcomes replayed within a
    cycle (known.py) must still give the plan a fresh search gives."""
    fresh = fresh_plan(s, HOLD)
    first, second = twice(s, HOLD)
    assert_same(first, fresh)
    assert_same(second, fresh)
