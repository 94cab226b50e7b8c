"""The estimated-start roll kept across cycles (eta_kept.py, `Profile.eta_reuse_s`): a later
cycle continues it only while nothing it was built from changed in a way that matters; every
such change rolls afresh, giving exactly a fresh Scheduler's estimates."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from corral.scheduler import PROFILES, NodeState, Scheduler, Snapshot
from corral.scheduler.apply import estimated_starts
from corral.scheduler.types import Job
from tests.scheduler.builders import gpu_node, group, job, running, snap

PROFILE = PROFILES["default"]


# One 8-GPU node held by two 4-GPU jobs (ending at 100 and 300: no spread, so their ends do not
# move with `now`); the same objects in every snapshot, as a caller that keeps them passes them
NODES = (gpu_node("n1"),)
RUNNING = (
    running(job("r1", gpus=4, runtime=100.0), "n1", (0, 1, 2, 3)),
    running(job("r2", gpus=4, runtime=300.0), "n1", (4, 5, 6, 7)),
)
GROUPS = (group("g"),)


def _first(queued: list[Job]) -> Snapshot:
    """The cluster above with 4-GPU jobs of one user waiting."""
    return snap(NODES, queued, GROUPS, RUNNING)


WAITING = [job(f"w{i}", gpus=4, submit=float(i)) for i in range(1, 4)]  # kept across cycles too
W4 = job("w4", gpus=4, submit=15.0)


def _eta(scheduler: Scheduler, s: Snapshot, now: float, job_id: str) -> float | None:
    plan = scheduler.schedule(s, now, random.Random(0))
    return estimated_starts(plan.diagnoses, [job_id])[job_id]


def _fresh(s: Snapshot, now: float, job_id: str) -> float | None:
    return _eta(Scheduler(replace(PROFILE, eta_reuse_s=0.0)), s, now, job_id)


def _kept_then(s2: Snapshot, now2: float, profile_reuse: float = 60.0) -> tuple[Scheduler, float | None]:
    """A Scheduler that read w3's estimate at now 10, then reads the last queued job's in `s2`."""
    scheduler = Scheduler(replace(PROFILE, eta_reuse_s=profile_reuse))
    s1 = _first(WAITING)
    assert _eta(scheduler, s1, 10.0, "w3") == _fresh(s1, 10.0, "w3") == 300.0
    return scheduler, _eta(scheduler, s2, now2, s2.queued[-1].id)


def test_a_new_arrival_behind_the_kept_jobs_continues_the_roll() -> None:
    s2 = _first([*WAITING, W4])
    scheduler, eta = _kept_then(s2, 20.0)
    assert scheduler.kept_rolls.reused == 1
    # the kept roll's start for w4 (300, as a fresh roll at now 20 gives) seen 10 s later: a
    # continued roll takes every expected end as 10 s later too (right for a running job with a
    # spread that has run long, 10 s too late here, where no running job has one)
    assert _fresh(s2, 20.0, "w4") == 300.0
    assert eta == 310.0
    s3 = _first([*s2.queued, job("w5", gpus=4, submit=25.0)])  # and again, from the same roll
    assert _eta(scheduler, s3, 30.0, "w5") == 420.0
    assert scheduler.kept_rolls.reused == 2


def test_a_job_with_room_now_is_told_the_first_return_after_now() -> None:
    """A job with room at the kept roll's now by the count of free GPUs (but not on one node) is
    told, as by a fresh roll, neither now nor a start in the past, but the first GPU return after
    now (shifted as the rest of the continued roll)."""
    nodes = (gpu_node("n1"), gpu_node("n2"))
    held = (  # 2 GPUs free on each node until 1000
        running(job("r1", gpus=6, runtime=1000.0), "n1", (0, 1, 2, 3, 4, 5)),
        running(job("r2", gpus=6, runtime=1000.0), "n2", (0, 1, 2, 3, 4, 5)),
    )
    big = job("big", gpus=8, submit=1.0)
    s1 = snap(nodes, [big], GROUPS, held)
    s2 = snap(nodes, [big, job("four", gpus=4, submit=15.0)], GROUPS, held)
    scheduler = Scheduler(replace(PROFILE, eta_reuse_s=60.0))
    assert _eta(scheduler, s1, 10.0, "big") == 1000.0
    assert _fresh(s2, 20.0, "four") == 1000.0
    assert _eta(scheduler, s2, 20.0, "four") == 1010.0
    assert scheduler.kept_rolls.reused == 1


def _changed_cases() -> dict[str, tuple[Snapshot, float]]:
    base = _first([*WAITING, W4])
    r1, r2 = base.running
    return {
        # a running job asked to stop (a new RunningJob object): its GPUs come back earlier
        "stopping": (replace(base, running=(replace(r1, stopping=True, stops_by=40.0), r2)), 20.0),
        # a running job ended: the cycle starts w1 on its GPUs
        "ended": (replace(base, running=(r2,)), 20.0),
        # later than eta_reuse_s after the kept roll
        "too_late": (base, 71.0),
        # a job the kept roll placed left the queue (cancelled), and two arrived
        "left": (replace(base, queued=(*base.queued[1:], job("w5", gpus=4, submit=16.0))), 20.0),
        # a new job passes the kept ones (its group runs nothing: its turn comes first)
        "passes": (
            replace(
                _first([*WAITING, job("h4", gpus=4, submit=15.0, group="h"), job("w5", gpus=4, submit=16.0)]),
                groups=(*GROUPS, group("h")),
            ),
            20.0,
        ),
        # a node went down (another nodes tuple, other free GPUs)
        "node": (
            replace(base, nodes=(base.nodes[0], gpu_node("n2", state=NodeState.DOWN))),
            20.0,
        ),
    }


@pytest.mark.parametrize("case", sorted(_changed_cases()))
def test_a_change_the_roll_was_built_from_rolls_afresh(case: str) -> None:
    s2, now2 = _changed_cases()[case]
    scheduler, eta = _kept_then(s2, now2)
    assert scheduler.kept_rolls.reused == 0
    assert eta == _fresh(s2, now2, s2.queued[-1].id)


def test_eta_reuse_off_never_continues() -> None:
    s2 = _first([*WAITING, W4])
    scheduler, eta = _kept_then(s2, 20.0, profile_reuse=0.0)
    assert scheduler.kept_rolls.reused == 0
    assert scheduler.kept_rolls.kept is None  # nothing kept either
    assert eta == _fresh(s2, 20.0, "w4")


def test_a_continued_roll_drifts_by_the_running_jobs_spread_only() -> None:
    """With a spread, a running job's expected end moves with now: the continued estimate is the
    kept roll's (of now 10), a fresh one is of now 20, and both are close."""
    spread = (50.0, 200.0)
    a = job("r1", gpus=4, runtime=100.0)
    b = replace(job("r2", gpus=4, runtime=300.0), runtime_spread=spread)
    run = (running(a, "n1", (0, 1, 2, 3)), running(b, "n1", (4, 5, 6, 7)))
    s1 = replace(_first(WAITING), running=run)
    s2 = replace(s1, queued=(*s1.queued, W4))
    scheduler = Scheduler(replace(PROFILE, eta_reuse_s=60.0))
    _eta(scheduler, s1, 10.0, "w3")
    continued = _eta(scheduler, s2, 20.0, "w4")
    fresh = _fresh(s2, 20.0, "w4")
    assert scheduler.kept_rolls.reused == 1
    assert continued is not None and fresh is not None
    assert continued != fresh and abs(continued - fresh) < 10.0


def test_the_default_profile_keeps_the_roll_and_the_others_do_not() -> None:
    """The sixteenth round's decision (docs/simulator.md): `default` continues a kept roll for
    60 s; the other profiles roll from scratch."""
    assert PROFILES["default"].eta_reuse_s == 60.0
    assert {name: p.eta_reuse_s for name, p in PROFILES.items() if name != "default"} == {
        "fifo": 0.0,
        "fifo-backfill": 0.0,
        "sjf": 0.0,
        "las": 0.0,
    }


def _shown(scheduler: Scheduler, s: Snapshot, now: float) -> dict[str, float | None]:
    """Every waiting job's estimated start as the live loop reads them: the plan's diagnoses
    iterated (server/scheduling.py writes them all, every tick)."""
    plan = scheduler.schedule(s, now, random.Random(0))
    return {job_id: d.estimated_start for job_id, d in plan.diagnoses.items()}


def test_the_live_loops_full_diagnoses_never_continue_a_kept_roll() -> None:
    """The live loop keeps one Scheduler of the `default` profile (knob on) tick after tick and
    reads every diagnosis: each tick's estimates equal a fresh Scheduler's with the knob off, none
    is before `now`, and each is rolled again after a start or an end, also while a targeted
    read (the simulator's) holds a kept roll that a later targeted read continues."""
    spread = (50.0, 400.0)  # r2's expected end moves with now: a continued roll would drift
    run = (
        running(job("r1", gpus=4, runtime=100.0), "n1", (0, 1, 2, 3)),
        running(replace(job("r2", gpus=4, runtime=300.0), runtime_spread=spread), "n1", (4, 5, 6, 7)),
    )
    s1 = replace(_first(WAITING), running=run)
    s2 = replace(s1, queued=(*s1.queued, W4))
    live = Scheduler(PROFILE)
    assert PROFILE.eta_reuse_s > 0
    _eta(live, s1, 10.0, "w3")  # a targeted read keeps a roll
    assert live.kept_rolls.kept is not None
    for now, s in ((20.0, s2), (40.0, s2), (65.0, s2)):
        shown = _shown(live, s, now)
        fresh = _shown(Scheduler(replace(PROFILE, eta_reuse_s=0.0)), s, now)
        assert shown == fresh
        assert all(at is not None and at >= now for at in shown.values())
    # the targeted read on the same Scheduler still continues the kept roll (it differs from the
    # fresh one: the live view above did not take the kept roll's numbers)
    continued = _eta(live, s2, 30.0, "w4")
    assert live.kept_rolls.reused == 1
    assert continued != _fresh(s2, 30.0, "w4")
    # r1 ended: w1 starts on its GPUs; the jobs still waiting are rolled afresh from the new
    # running set (w1's start and r2's end), as a fresh Scheduler's
    ended = replace(s2, running=(run[1],))
    shown = _shown(live, ended, 50.0)
    assert "w1" not in shown
    assert shown == _shown(Scheduler(replace(PROFILE, eta_reuse_s=0.0)), ended, 50.0)
    assert all(at is not None and at >= 50.0 for at in shown.values())
