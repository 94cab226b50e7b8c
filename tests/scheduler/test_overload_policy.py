"""The default policy under overload: smaller estimated jobs first inside a group, the starvation
guard (a job waiting longer than `starvation_s` goes first and holds its group's guarantee), and
the bound on preemptions per job."""

from __future__ import annotations

import dataclasses

import pytest

from corral.scheduler import ANY_MODEL, PROFILES, Usage
from tests.scheduler.builders import gpu_node, group, job, plan_for, running, snap

DEFAULT = PROFILES["default"]
NOW = 10 * 86400.0
OLD = NOW - DEFAULT.starvation_s - 1.0  # submitted before the guard's cut-off


def test_smaller_estimated_job_goes_first_inside_a_group() -> None:
    queued = [job("long", submit=0, runtime=36000.0), job("short", submit=10, runtime=600.0)]
    s = snap([gpu_node("n", gpus=1)], queued, [group("g", guaranteed={ANY_MODEL: 1})])
    assert [a.job_id for a in plan_for(s, DEFAULT, now=100).assignments] == ["short"]
    by_submit = dataclasses.replace(DEFAULT, size_order=False)
    assert [a.job_id for a in plan_for(s, by_submit, now=100).assignments] == ["long"]


def test_size_is_gpu_time_and_unknown_runtime_counts_as_the_default() -> None:
    # 4 GPUs x 300 s = 1,200 GPU-s is smaller than 1 GPU x 3,600 s (no estimate: default_runtime_s)
    queued = [job("unknown", submit=0, runtime=None), job("wide", gpus=4, submit=5, runtime=300.0)]
    s = snap([gpu_node("n", gpus=4)], queued, [group("g", guaranteed={ANY_MODEL: 4})])
    assert [a.job_id for a in plan_for(s, DEFAULT, now=100).assignments] == ["wide"]


def test_starving_job_goes_before_groups_with_a_lower_share() -> None:
    groups = [group("a", guaranteed={ANY_MODEL: 8}), group("b", guaranteed={ANY_MODEL: 8})]
    queued = [job("gang", gpus=8, group="a", submit=OLD), job("young", group="b", submit=NOW - 10)]
    usage = Usage(by_group={"a": 1e9})  # a has used far more: fair share alone serves b first
    s = snap([gpu_node("n")], queued, groups, usage=usage)
    assert [a.job_id for a in plan_for(s, DEFAULT, now=NOW).assignments] == ["gang"]
    off = dataclasses.replace(DEFAULT, starvation_s=0.0)
    assert [a.job_id for a in plan_for(s, off, now=NOW).assignments] == ["young"]


def test_starving_job_holds_its_groups_guarantee() -> None:
    """The group's own younger, smaller jobs may not take back the guarantee the starving gang
    waits for as the group's running work ends."""
    groups = [group("g", guaranteed={ANY_MODEL: 8}, borrowing=False)]
    mine = job("r", gpus=4, runtime=1e6)
    queued = [job("gang", gpus=8, submit=OLD), job("small", gpus=2, submit=NOW - 10)]
    s = snap([gpu_node("n"), gpu_node("m")], queued, groups, run=[running(mine, "n", (0, 1, 2, 3))])
    plan = plan_for(s, DEFAULT, now=NOW)
    assert plan.assignments == ()
    assert plan.diagnoses["small"].reasons[0].code == "quota_exhausted"
    off = dataclasses.replace(DEFAULT, starvation_s=0.0)
    assert [a.job_id for a in plan_for(s, off, now=NOW).assignments] == ["small"]


def test_a_job_preempted_max_preemptions_times_is_no_victim() -> None:
    groups = [group("lender", guaranteed={ANY_MODEL: 8}), group("borrower")]
    waiting = [job("mine", gpus=8, group="lender", submit=NOW - 10)]
    for count, victims in ((DEFAULT.max_preemptions - 1, ["b"]), (DEFAULT.max_preemptions, [])):
        b = dataclasses.replace(job("b", gpus=8, group="borrower", runtime=1e6), preemptions=count)
        s = snap([gpu_node("n")], waiting, groups, run=[running(b, "n", tuple(range(8)), borrowed=True)])
        assert [p.job_id for p in plan_for(s, DEFAULT, now=NOW).preemptions] == victims, count
    assert DEFAULT.max_preemptions == 16


def test_the_policy_knobs_parse_from_the_command_line() -> None:
    from corral.sim.runner import PolicyError, parse_knobs

    assert parse_knobs(["size_order=0", "starvation_s=0", "max_preemptions=3"]) == {
        "size_order": False,
        "starvation_s": 0,
        "max_preemptions": 3,
    }
    with pytest.raises(PolicyError, match="size_order=2"):
        parse_knobs(["size_order=2"])
    assert parse_knobs(["eta_roll=pooled"]) == {"eta_roll": "pooled"}  # the previous ETA walk, a baseline
    with pytest.raises(PolicyError, match="eta_roll is one of backfill, pooled"):
        parse_knobs(["eta_roll=fifo"])
