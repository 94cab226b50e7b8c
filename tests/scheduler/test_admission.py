"""Admission rules: quotas, borrowing, user caps, priorities, fair share, ordering, backfill."""

from __future__ import annotations

import pytest

from corral.scheduler import ANY_MODEL, PROFILES, Priority, Usage, decay_usage
from tests.scheduler.builders import apply_plan, gpu_node, group, job, plan_for, running, snap

DEFAULT = PROFILES["default"]


def test_group_max_is_never_exceeded_and_says_why() -> None:
    groups = [group("vision", guaranteed={"A100": 2}, max={"A100": 3})]
    queued = [job(f"j{i}", group="vision", submit=i) for i in range(5)]
    plan = plan_for(snap([gpu_node("n")], queued, groups), DEFAULT)
    assert len(plan.assignments) == 3
    assert [a.borrowed for a in plan.assignments] == [False, False, True]
    assert plan.diagnoses["j3"].reasons[0].code == "quota_max"
    assert plan.diagnoses["j3"].reasons[0].source == "quota"


def test_no_borrowing_stops_at_guarantee() -> None:
    groups = [group("vision", guaranteed={ANY_MODEL: 2}, borrowing=False)]
    queued = [job(f"j{i}", group="vision", submit=i) for i in range(3)]
    plan = plan_for(snap([gpu_node("n")], queued, groups), DEFAULT)
    assert len(plan.assignments) == 2
    reason = plan.diagnoses["j2"].reasons[0]
    assert reason.code == "quota_exhausted" and "borrowing is off" in reason.message


def test_non_preemptible_jobs_do_not_borrow() -> None:
    groups = [group("g", guaranteed={ANY_MODEL: 1})]
    queued = [job("a", submit=0, preemptible=False), job("b", submit=1, preemptible=False)]
    plan = plan_for(snap([gpu_node("n")], queued, groups), DEFAULT)
    assert [a.job_id for a in plan.assignments] == ["a"]
    assert "not preemptible" in plan.diagnoses["b"].reasons[0].message


def test_user_cap() -> None:
    groups = [group("g", user_max_gpus=2)]
    # b as large as a: the same size class, so a (older) goes first under the default's size order
    ann = [job("a", gpus=2, user="ann"), job("b", gpus=2, user="ann", submit=1)]
    queued = [*ann, job("c", user="bob", submit=2)]
    plan = plan_for(snap([gpu_node("n")], queued, groups), DEFAULT)
    assert sorted(a.job_id for a in plan.assignments) == ["a", "c"]
    assert plan.diagnoses["b"].reasons[0].code == "user_cap"
    huge = plan_for(snap([gpu_node("n")], [job("h", gpus=4)], groups), DEFAULT)
    assert huge.diagnoses["h"].unschedulable


def test_no_work_is_preempted_for_a_job_its_user_cap_holds_back() -> None:
    """A job within its group's guarantee but over its user's cap stops nobody: the cap would
    still hold it back once the victims are gone. Work of the same user of lower priority still
    makes room under the cap."""
    groups = [group("g", guaranteed={ANY_MODEL: 4}, user_max_gpus=2), group("b")]
    mine = running(job("mine", gpus=2, group="g", user="ann"), "n", (0, 1))
    lent = running(job("lent", gpus=2, group="b", user="bob"), "n", (2, 3), borrowed=True)
    queued = [job("w", gpus=2, group="g", user="ann", submit=10)]
    plan = plan_for(snap([gpu_node("n", gpus=4)], queued, groups, run=[mine, lent]), DEFAULT)
    assert plan.preemptions == ()
    low = running(job("low", gpus=2, group="g", user="ann", priority=Priority.LOW), "n", (0, 1))
    high = [job("high", gpus=2, group="g", user="ann", submit=10, priority=Priority.HIGH)]
    bob = running(job("bob", gpus=2, group="g", user="bob"), "n", (2, 3))
    plan = plan_for(snap([gpu_node("n", gpus=4)], high, groups, run=[low, bob]), DEFAULT)
    assert [(p.job_id, p.for_job) for p in plan.preemptions] == [("low", "high")]


def test_priority_within_group_goes_first() -> None:
    queued = [job("low", priority=Priority.LOW, submit=0), job("high", priority=Priority.HIGH, submit=5)]
    plan = plan_for(snap([gpu_node("n", gpus=1)], queued, [group("g")]), DEFAULT)
    assert [a.job_id for a in plan.assignments] == ["high"]
    assert plan.diagnoses["low"].queue_position == 1


def test_fair_share_prefers_group_with_less_decayed_usage() -> None:
    queued = [job("heavy", group="a", submit=0), job("light", group="b", submit=10)]
    usage = Usage(by_group={"a": 1e6, "b": 10.0})
    plan = plan_for(snap([gpu_node("n", gpus=1)], queued, [group("a"), group("b")], usage=usage), DEFAULT)
    assert [a.job_id for a in plan.assignments] == ["light"]


def test_fair_share_interleaves_groups_within_a_cycle() -> None:
    queued = [job(f"a{i}", group="a", submit=i) for i in range(4)] + [
        job(f"b{i}", group="b", submit=10 + i) for i in range(4)
    ]
    plan = plan_for(snap([gpu_node("n", gpus=4)], queued, [group("a"), group("b")]), DEFAULT)
    got = sorted(a.job_id for a in plan.assignments)
    assert got == ["a0", "a1", "b0", "b1"]


def test_fair_share_weight() -> None:
    queued = [job(f"a{i}", group="a", submit=i) for i in range(6)] + [
        job(f"b{i}", group="b", submit=i) for i in range(6)
    ]
    groups = [group("a", weight=2.0), group("b", weight=1.0)]
    plan = plan_for(snap([gpu_node("n", gpus=6)], queued, groups), DEFAULT)
    assert sum(a.job_id.startswith("a") for a in plan.assignments) == 4


def test_decay_usage_halves_per_half_life() -> None:
    assert decay_usage(100.0, 3600.0, 3600.0) == 50.0
    assert decay_usage(100.0, 7200.0, 3600.0) == 25.0
    assert decay_usage(100.0, 0.0, 3600.0) == 100.0


def test_fifo_blocks_head_of_line() -> None:
    nodes = [gpu_node("n", gpus=4)]
    queued = [job("small0", gpus=2, submit=0), job("big", gpus=4, submit=1), job("small1", gpus=1, submit=2)]
    plan = plan_for(snap(nodes, queued), PROFILES["fifo"])
    assert [a.job_id for a in plan.assignments] == ["small0"]
    assert plan.diagnoses["small1"].reasons[0].code == "blocked_by_head"


def test_easy_backfill_lets_short_jobs_pass_but_not_long_ones() -> None:
    nodes = [gpu_node("n", gpus=4)]
    occ = job("occ", gpus=2, runtime=1000.0)
    run = [running(occ, "n", (0, 1), start=0.0)]  # ends at t=1000
    queued = [
        job("big", gpus=4, submit=0),  # head: reserved at t=1000
        job("long", gpus=2, submit=1, runtime=5000.0),  # would end after 1000: delays big
        job("short", gpus=1, submit=2, runtime=100.0),  # ends at 600: harmless
    ]
    plan = plan_for(snap(nodes, queued, run=run), PROFILES["fifo-backfill"], now=500.0)
    assert [a.job_id for a in plan.assignments] == ["short"]
    reason = plan.diagnoses["long"].reasons[0]
    assert reason.code == "backfill_would_delay" and "big" in reason.message
    assert plan.diagnoses["big"].estimated_start == 1000.0
    # when, as people read it (it said "reserved to start at 1000": unix seconds on the platform),
    # as a clock time that stays put while the reservation does (the stored diagnosis is rewritten
    # whenever its text changes)
    assert (
        reason.message == "starting now would delay job big, reserved to start at about 1970-01-01 00:16 UTC"
    )
    later = plan_for(snap(nodes, queued, run=run), PROFILES["fifo-backfill"], now=560.0)
    assert later.diagnoses["long"].reasons[0] == reason


def test_sjf_orders_by_estimate() -> None:
    queued = [job("long", submit=0, runtime=1000.0), job("short", submit=1, runtime=10.0)]
    plan = plan_for(snap([gpu_node("n", gpus=1)], queued), PROFILES["sjf"])
    assert [a.job_id for a in plan.assignments] == ["short"]


def test_las_prefers_least_attained_and_preempts() -> None:
    old = job("old", attained=100000.0)
    fresh = job("fresh", attained=0.0)
    s = snap([gpu_node("n", gpus=1)], [fresh], run=[running(old, "n", (0,), start=0.0)])
    plan = plan_for(s, PROFILES["las"], now=10.0)
    assert [p.job_id for p in plan.preemptions] == ["old"]
    nxt = apply_plan(s, plan, 40.0)
    plan2 = plan_for(nxt, PROFILES["las"], now=40.0)
    assert [a.job_id for a in plan2.assignments] == ["fresh"]


def test_guarantee_reclaims_borrowed_work_youngest_first() -> None:
    groups = [group("a", guaranteed={ANY_MODEL: 2}), group("b", guaranteed={})]
    b_jobs = [job(f"b{i}", group="b") for i in range(4)]
    run = [running(j, "n", (i,), start=float(i), borrowed=True) for i, j in enumerate(b_jobs)]
    s = snap([gpu_node("n", gpus=4)], [job("a0", group="a", submit=0)], groups, run)
    plan = plan_for(s, DEFAULT, now=100.0)
    assert [p.job_id for p in plan.preemptions] == ["b3"]
    assert plan.preemptions[0].grace_s == DEFAULT.grace_s
    assert plan.preemptions[0].for_job == "a0"
    assert plan.diagnoses["a0"].reasons[0].code == "waiting_for_preemption"


def test_high_priority_preempts_low_priority_of_own_group_only() -> None:
    groups = [group("g"), group("other")]
    low = job("low", priority=Priority.LOW)
    other = job("otherlow", group="other", priority=Priority.LOW)
    run = [running(low, "n", (0,)), running(other, "n", (1,))]
    s = snap([gpu_node("n", gpus=2)], [job("hi", priority=Priority.HIGH)], groups, run)
    plan = plan_for(s, DEFAULT)
    assert [p.job_id for p in plan.preemptions] == ["low"]


@pytest.mark.parametrize("free", [0, 2])
def test_a_job_its_quota_holds_displaces_lower_priority_work_of_its_group_free_gpus_or_not(free: int) -> None:
    """Held by its group's quota (not preemptible, so no borrowing) behind two low-priority jobs
    of its group: on a full node it stopped one of them, but with 2 GPUs free it looked for no
    victim and waited (quota_exhausted) until they ended, free GPUs making it wait longer."""
    groups = [group("g", guaranteed={ANY_MODEL: 2})]
    lows = [job(f"low{i}", priority=Priority.LOW, user="d") for i in range(2)]
    run = [running(j, "n", (i,)) for i, j in enumerate(lows)]
    hi = job("hi", preemptible=False, user="f")
    plan = plan_for(snap([gpu_node("n", gpus=2 + free)], [hi], groups, run), DEFAULT, now=100.0)
    assert [p.job_id for p in plan.preemptions] == ["low0"]  # one is enough (same start: by id)
    assert plan.diagnoses["hi"].reasons[0].code == "waiting_for_preemption"


@pytest.mark.parametrize("free", [0, 1])
def test_a_job_its_user_cap_holds_displaces_the_users_lower_priority_work_free_gpus_or_not(free: int) -> None:
    groups = [group("g", user_max_gpus=1)]
    run = [running(job("low", priority=Priority.LOW, user="d"), "n", (0,))]
    s = snap([gpu_node("n", gpus=1 + free)], [job("hi", priority=Priority.HIGH, user="d")], groups, run)
    plan = plan_for(s, DEFAULT, now=100.0)
    assert [p.job_id for p in plan.preemptions] == ["low"]


def test_no_preemption_without_reason() -> None:
    groups = [group("a", guaranteed={ANY_MODEL: 1}), group("b", guaranteed={ANY_MODEL: 1})]
    run = [running(job("b0", group="b"), "n", (0,)), running(job("a0", group="a"), "n", (1,))]
    s = snap([gpu_node("n", gpus=2)], [job("a1", group="a")], groups, run)
    plan = plan_for(s, DEFAULT)
    assert plan.preemptions == ()
    assert plan.diagnoses["a1"].reasons[0].code == "insufficient_gpus"


def test_las_queues_without_duration_knowledge() -> None:
    queued = [
        job("served", submit=0, attained=50000.0, runtime=1.0),
        job("new", submit=5, attained=0.0, runtime=1e9),
    ]
    plan = plan_for(snap([gpu_node("n", gpus=1)], queued), PROFILES["las"])
    assert [a.job_id for a in plan.assignments] == ["new"]


def test_quota_per_model_key_and_any_model() -> None:
    from tests.scheduler.builders import gpu_node as node

    groups = [group("g", guaranteed={"A100": 1, ANY_MODEL: 1}, max={"A100": 1, ANY_MODEL: 2})]
    nodes = [node("a", gpus=4, model="A100"), node("v", gpus=4, model="V100M32")]
    queued = [job(f"j{i}", submit=i) for i in range(5)]
    plan = plan_for(snap(nodes, queued, groups), DEFAULT)
    models = sorted("A100" if a.allocation.instances[0].node == "a" else "V100" for a in plan.assignments)
    assert models == ["A100", "V100", "V100"]  # A100 capped at 1; other models share "*" up to 2


def test_guaranteed_work_goes_before_borrowing() -> None:
    groups = [group("a", guaranteed={ANY_MODEL: 1}), group("b", guaranteed={})]
    usage = Usage(by_group={"a": 1e9, "b": 0.0})  # b is far ahead on fair share
    queued = [job("b0", group="b", submit=0), job("a0", group="a", submit=5)]
    plan = plan_for(snap([gpu_node("n", gpus=1)], queued, groups, usage=usage), DEFAULT)
    assert [(a.job_id, a.borrowed) for a in plan.assignments] == [("a0", False)]


HELD = {  # a group whose quota or cap holds its 4-GPU job while it runs 4 GPUs: (group, code)
    "borrowing off": (group("a", guaranteed={ANY_MODEL: 4}, borrowing=False), "quota_exhausted"),
    "at its max": (group("a", guaranteed={ANY_MODEL: 2}, max={ANY_MODEL: 4}), "quota_max"),
    "user cap": (group("a", user_max_gpus=4), "user_cap"),
    # below its guarantee (so not parked for the borrowing pass) but too close to its max for it
    "deferred, at its max": (group("a", guaranteed={ANY_MODEL: 6}, max={ANY_MODEL: 6}), "quota_max"),
}


@pytest.mark.parametrize("case", sorted(HELD))
def test_a_job_its_quota_holds_reserves_nothing_and_gets_its_quota_reason(case: str) -> None:
    """A full cluster: group a's job waits for a's quota (or its user's cap), which it would wait
    for even with every GPU free. It gets that reason and no time, and holds no backfill reservation
    (Kueue and Slurm check the quota first): group b's 1-GPU job, which ends after the GPUs a
    reservation would wait for come back, starts on the one free GPU."""
    held_group, code = HELD[case]
    run = [
        running(job("ra", gpus=4, group="a", runtime=5000.0, preemptible=False), "n", (0, 1, 2, 3)),
        running(job("rb", gpus=3, group="b", runtime=1100.0, preemptible=False), "n", (4, 5, 6)),
    ]
    queued = [job("held", gpus=4, group="a", submit=1), job("small", group="b", submit=2, runtime=500.0)]
    usage = Usage(by_group={"b": 1e9})  # group a's turn comes first
    s = snap([gpu_node("n", gpus=8)], queued, [held_group, group("b")], run=run, usage=usage)
    plan = plan_for(s, PROFILES["default"], now=1000.0)
    assert [a.job_id for a in plan.assignments] == ["small"]
    d = plan.diagnoses["held"]
    assert [r.code for r in d.reasons] == [code]
    assert d.estimated_start is None and not d.unschedulable


def test_a_guarantee_cut_after_placement_lets_the_lender_reclaim_the_work_it_no_longer_covers() -> None:
    """Group a's two 4-GPU jobs were placed within its guarantee (not marked borrowed); the
    guarantee has since been cut to 4. Its younger job now runs beyond it: group b, below its own
    guarantee, reclaims that one (as any borrowed work) and not the older one, which a still
    covers. Without the cut nothing is reclaimed."""
    old = running(job("old", gpus=4, group="a"), "n", (0, 1, 2, 3), start=0.0)
    young = running(job("young", gpus=4, group="a"), "n", (4, 5, 6, 7), start=500.0)
    queued = [job("wb", gpus=4, group="b", submit=600)]
    b = group("b", guaranteed={ANY_MODEL: 4})
    for guarantee, victims in ((8, []), (4, ["young"])):
        groups = [group("a", guaranteed={ANY_MODEL: guarantee}), b]
        plan = plan_for(snap([gpu_node("n", gpus=8)], queued, groups, run=[old, young]), DEFAULT)
        assert [p.job_id for p in plan.preemptions] == victims
        assert plan.diagnoses["wb"].reasons[0].code == (
            "waiting_for_preemption" if victims else "insufficient_gpus"
        )
