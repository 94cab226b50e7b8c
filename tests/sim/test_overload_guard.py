"""Whole replays of the default policy's guarantees under overload: borrowing jobs (backfilled
or not) never keep a group that is under its guarantee waiting, and the starvation guard bounds
how long a large gang waits behind its own group's stream of smaller jobs."""

from __future__ import annotations

from corral.scheduler import PROFILES
from corral.sim.replay import SimConfig
from corral.sim.runner import simulate
from tests.sim.helpers import cluster, trace

GUARD_S = PROFILES["default"].starvation_s


def test_borrowers_never_starve_a_group_under_its_guarantee() -> None:
    """`borrower` floods the cluster with short 4-GPU jobs (backfill candidates), half of them on
    borrowed quota; every 8-GPU job of `lender`, which holds nothing, starts within its victims'
    stop grace (reclaimed room is claimed for it, not backfilled)."""
    flood = [(f"b{i}", i * 100.0, 1800.0, 4, {"group": "borrower", "user": "bo"}) for i in range(300)]
    mine = [(f"l{i}", 5000.0 + i * 6000.0, 3600.0, 8, {"group": "lender", "user": "le"}) for i in range(4)]
    groups = [{"name": "lender", "guaranteed": 8}, {"name": "borrower", "guaranteed": 8}]
    result = simulate(trace(*flood, *mine), cluster(2, 8, groups), "default", SimConfig())
    jobs = {j.trace.job_id: j for j in result.jobs}
    borrowed_waits = [jobs[f"b{i}"].first_start - jobs[f"b{i}"].trace.submit_time for i in range(300)]
    assert max(borrowed_waits) > 3600  # the borrower really is over-demanding
    for i in range(4):
        lender = jobs[f"l{i}"]
        assert lender.first_start - lender.trace.submit_time <= 60.0, lender.trace.job_id
    assert result.preemptions >= 4  # each lender job took its guarantee back


def test_starvation_guard_bounds_a_gangs_wait_behind_its_own_groups_small_jobs() -> None:
    """Smaller estimated jobs go first inside a group, so a 16-GPU gang never fits while its
    group's stream of 1-GPU jobs keeps part of its 16-GPU guarantee busy. The guard (2 days) holds
    the guarantee for it: it starts within the guard plus the small jobs' runtime (2 h); without
    the guard it waits until the stream ends (6 days)."""
    small = [(f"s{i}", i * 600.0, 7200.0, 1, {"group": "big", "user": "u"}) for i in range(864)]
    gang = ("gang", 3600.0, 3600.0, 16, {"group": "big", "user": "u", "instances": 2})
    # the other group's long jobs carry their user's limit: backfill counts on it (a job without an
    # estimate is taken to end after default_runtime_s, and an overdue one now)
    limit = {"group": "flood", "user": "f", "max_runtime_s": 8 * 86400.0}
    other = [(f"f{i}", 0.0, 8 * 86400.0, 8, limit) for i in range(2)]
    groups = [{"name": "big", "guaranteed": 16}, {"name": "flood", "guaranteed": 16, "borrowing": False}]
    tr, cl = trace(*small, gang, *other), cluster(4, 8, groups)
    waits = {}
    for guard in (GUARD_S, 0.0):
        result = simulate(tr, cl, "default", SimConfig(), {"starvation_s": guard})
        job = next(j for j in result.jobs if j.trace.job_id == "gang")
        waits[guard] = job.first_start - job.trace.submit_time
    assert GUARD_S <= waits[GUARD_S] <= GUARD_S + 2 * 7200.0
    assert waits[0.0] > 5 * 86400.0
