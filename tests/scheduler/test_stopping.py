"""Running jobs already asked to stop (`RunningJob.stopping`): never victims again, and their room
counts as free at the end of their grace."""

from __future__ import annotations

import dataclasses

from corral.scheduler import ANY_MODEL, PROFILES
from corral.scheduler.types import RunningJob, Snapshot
from tests.scheduler.builders import gpu_node, group, job, plan_for, running, snap

DEFAULT = PROFILES["default"]


def _borrowed_cluster(queued_a: int) -> Snapshot:
    """Group a (guarantee 2) waits; group b fills the 4-GPU node on borrowed quota."""
    groups = [group("a", guaranteed={ANY_MODEL: 2}), group("b", guaranteed={})]
    b_jobs = [job(f"b{i}", group="b", runtime=10_000.0) for i in range(4)]
    run = [running(j, "n", (i,), start=float(i), borrowed=True) for i, j in enumerate(b_jobs)]
    queued = [job(f"a{i}", group="a", submit=i) for i in range(queued_a)]
    return snap([gpu_node("n", gpus=4)], queued, groups, run)


def _mark_stopping(s: Snapshot, job_id: str, stops_by: float | None) -> Snapshot:
    run = tuple(
        dataclasses.replace(rj, stopping=True, stops_by=stops_by) if rj.job.id == job_id else rj
        for rj in s.running
    )
    return dataclasses.replace(s, running=run)


def test_stopping_victim_is_not_picked_again_and_its_room_is_awaited() -> None:
    s = _borrowed_cluster(1)
    first = plan_for(s, DEFAULT, now=100.0)
    assert [p.job_id for p in first.preemptions] == ["b3"]
    # next cycle: b3 is still in its grace period, and the caller says so
    again = plan_for(_mark_stopping(s, "b3", stops_by=130.0), DEFAULT, now=105.0)
    assert again.preemptions == ()
    diag = again.diagnoses["a0"]
    assert diag.reasons[0].code == "waiting_for_preemption"
    assert diag.estimated_start == 130.0  # b3's GPU is free once its grace ends


def test_unflagged_victim_would_be_stopped_again() -> None:
    """Without the flag the scheduler cannot know: it picks the same victim again."""
    again = plan_for(_borrowed_cluster(1), DEFAULT, now=105.0)
    assert [p.job_id for p in again.preemptions] == ["b3"]


def test_a_second_waiting_job_gets_a_new_victim_not_the_stopping_one() -> None:
    s = _mark_stopping(_borrowed_cluster(2), "b3", stops_by=None)
    plan = plan_for(s, DEFAULT, now=105.0)
    assert [(p.job_id, p.for_job) for p in plan.preemptions] == [("b2", "a1")]
    assert all(p.job_id != "b3" for p in plan.preemptions)
    # no stops_by: gone at the latest one grace period from now
    assert plan.diagnoses["a0"].estimated_start == 105.0 + DEFAULT.grace_s


def test_stopping_defaults_to_false() -> None:
    rj = running(job("x"), "n", (0,))
    assert isinstance(rj, RunningJob) and rj.stopping is False and rj.stops_by is None


def _with_grace(s: Snapshot, grace: dict[str, float]) -> Snapshot:
    run = tuple(
        dataclasses.replace(rj, job=dataclasses.replace(rj.job, stop_grace_s=grace[rj.job.id]))
        if rj.job.id in grace
        else rj
        for rj in s.running
    )
    return dataclasses.replace(s, running=run)


def test_victim_gets_its_own_stop_grace_and_the_estimate_waits_for_it() -> None:
    """The Preemption carries the victim's stop_grace_s (not the profile's grace_s), and the
    waiting job's estimated start is when that grace ends."""
    s = _with_grace(_borrowed_cluster(1), {"b3": 120.0})
    plan = plan_for(s, DEFAULT, now=100.0)
    assert [(p.job_id, p.grace_s) for p in plan.preemptions] == [("b3", 120.0)]
    assert plan.diagnoses["a0"].estimated_start == 100.0 + 120.0
    # a job that asks for no grace of its own gets the profile's
    plain = plan_for(_borrowed_cluster(1), DEFAULT, now=100.0)
    assert [(p.job_id, p.grace_s) for p in plain.preemptions] == [("b3", DEFAULT.grace_s)]
    assert plain.diagnoses["a0"].estimated_start == 100.0 + DEFAULT.grace_s


def test_stopping_job_without_stops_by_is_gone_after_its_own_grace() -> None:
    s = _mark_stopping(_with_grace(_borrowed_cluster(2), {"b3": 5.0}), "b3", stops_by=None)
    plan = plan_for(s, DEFAULT, now=105.0)
    assert plan.diagnoses["a0"].estimated_start == 105.0 + 5.0
