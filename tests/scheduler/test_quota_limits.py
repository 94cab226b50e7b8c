"""Hard quota limits: CPU and memory limits per group, and `quota_refusals` (what the API refuses at
submit) agreeing with what the cycle marks unschedulable."""

from __future__ import annotations

import itertools

from corral.scheduler import ANY_MODEL, PROFILES
from corral.scheduler.admission import quota_refusals
from tests.scheduler.builders import cpu_node, gpu_node, group, job, plan_for, running, snap

DEFAULT = PROFILES["default"]


def test_group_at_its_cpu_max_waits_while_gpus_are_free() -> None:
    groups = [group("vision", cpus_max=10), group("nlp")]
    held = running(job("held", group="vision", cpus=8), "n", (0,))
    queued = [job("next", group="vision", cpus=4, submit=1), job("other", group="nlp", cpus=4, submit=2)]
    plan = plan_for(snap([gpu_node("n")], queued, groups, [held]), DEFAULT)
    assert [a.job_id for a in plan.assignments] == ["other"]
    d = plan.diagnoses["next"]
    assert not d.unschedulable
    assert d.reasons[0].code == "cpu_quota" and d.reasons[0].source == "quota:cpu_memory"
    assert d.reasons[0].message == "group vision may hold 10 CPUs; it holds 8; this job needs 4"


def test_cpu_and_memory_limits_count_what_the_cycle_placed() -> None:
    groups = [group("g", cpus_max=10), group("h", memory_max_mib=3000)]
    queued = [job(f"g{i}", gpus=0, group="g", cpus=4, submit=i) for i in range(3)]
    queued += [job(f"h{i}", gpus=0, group="h", memory_mib=1024, submit=10 + i) for i in range(3)]
    plan = plan_for(snap([cpu_node("c", cpus=64)], queued, groups), DEFAULT)
    assert sorted(a.job_id for a in plan.assignments) == ["g0", "g1", "h0", "h1"]
    assert plan.diagnoses["g2"].reasons[0].code == "cpu_quota"
    assert plan.diagnoses["h2"].reasons[0].code == "memory_quota"
    assert "may hold 3000 MiB of memory; it holds 2048 MiB" in plan.diagnoses["h2"].reasons[0].message


def test_a_job_larger_than_its_groups_cpu_or_memory_max_is_unschedulable() -> None:
    groups = [group("g", cpus_max=4, memory_max_mib=2048)]
    queued = [
        job("cpus", gpus=0, cpus=2, instances=3),
        job("mem", gpus=0, memory_mib=4096, submit=1),
        job("fits", gpus=0, cpus=4, memory_mib=2048, submit=2),
    ]
    plan = plan_for(snap([cpu_node("c")], queued, groups), DEFAULT)
    assert [a.job_id for a in plan.assignments] == ["fits"]
    assert plan.diagnoses["cpus"].unschedulable and plan.diagnoses["cpus"].reasons[0].code == "cpu_quota"
    assert plan.diagnoses["mem"].unschedulable and plan.diagnoses["mem"].reasons[0].code == "memory_quota"


def test_no_cpu_or_memory_limit_and_profiles_without_quotas_change_nothing() -> None:
    queued = [job(f"j{i}", gpus=0, cpus=8, submit=i) for i in range(4)]
    unlimited = plan_for(snap([cpu_node("c")], queued, [group("g")]), DEFAULT)
    assert len(unlimited.assignments) == 4
    limited = snap([cpu_node("c")], queued, [group("g", cpus_max=8)])
    assert len(plan_for(limited, DEFAULT).assignments) == 1
    assert len(plan_for(limited, PROFILES["fifo"]).assignments) == 4  # fifo applies no quotas


GROUPS = [
    group("a", guaranteed={ANY_MODEL: 2}),
    group("b", guaranteed={"A100": 2}, max={"A100": 4}),
    group("c", guaranteed={"A100": 1}, max={ANY_MODEL: 3}, borrowing=False),
    group("d", max={"V100": 0, ANY_MODEL: 6}, user_max_gpus=5),
    group("e", guaranteed={"V100": 8}, max={"V100": 8, "A100": 1}),
]


def test_quota_refusals_match_what_the_cycle_marks_unschedulable() -> None:
    """The submit check and the cycle give the same verdict on every combination: one rule."""
    nodes = [gpu_node("a1", model="A100"), gpu_node("v1", model="V100")]
    checked = 0
    for g, gpus, model, preemptible in itertools.product(
        GROUPS, (1, 2, 3, 4, 5, 6, 8), (None, "A100", "V100", "A100|V100"), (True, False)
    ):
        j = job("j", gpus=gpus, group=g.name, model=model, preemptible=preemptible)
        models = sorted({"A100", "V100"} if model is None else set(model.split("|")))
        refused = quota_refusals(j, g, models)
        plan = plan_for(snap(nodes, [j], [g]), DEFAULT)
        diagnosis = plan.diagnoses.get("j")
        unschedulable = diagnosis is not None and diagnosis.unschedulable
        assert bool(refused) == unschedulable, (g, gpus, model, preemptible, refused, diagnosis)
        if refused:
            assert diagnosis is not None and diagnosis.reasons[0].code == refused[0].code
        checked += bool(refused)
    assert checked > 20  # the grid has plenty of refusals, not only admissions


def test_quota_refusals_give_the_numbers() -> None:
    (r,) = quota_refusals(job("j", gpus=5, group="b", model="A100"), GROUPS[1], ["A100"])
    assert r.message == "it needs 5 GPUs; group b may hold at most 4 A100 (its max)"
    (r,) = quota_refusals(job("j", gpus=2, group="c", model="A100"), GROUPS[2], ["A100"])
    assert r.message == (
        "it needs 2 GPUs; group c guarantees 1 A100 and borrowing is off for the group, "
        "so it may not borrow beyond the guarantee"
    )
    cap, gpu_max = quota_refusals(job("j", gpus=7, group="d"), GROUPS[3], ["A100", "V100"])
    assert cap.code == "user_cap" and "caps each user at 5 GPUs" in cap.message
    assert gpu_max.message == "it needs 7 GPUs; group d may hold at most 6 A100, 0 V100 (its max)"
    limited = group("g", cpus_max=4, memory_max_mib=1000)
    codes = [r.code for r in quota_refusals(job("j", gpus=0, cpus=5, memory_mib=2000), limited, [])]
    assert codes == ["cpu_quota", "memory_quota"]
