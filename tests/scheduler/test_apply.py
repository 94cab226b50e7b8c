"""apply_plan: the one sequence the live loop and the simulator carry a plan out with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from corral.scheduler import ANY_MODEL, PROFILES, Applied, apply_plan
from corral.scheduler.types import Assignment, Diagnosis, Preemption
from tests.scheduler.builders import gpu_node, group, job, plan_for, running, snap


class Recorder:
    """A PlanSink that refuses what it is told to refuse and records the calls in order."""

    def __init__(self, refuse: set[str]) -> None:
        self.refuse = refuse
        self.calls: list[tuple[str, object]] = []

    def assign(self, assignments: Sequence[Assignment]) -> int:
        self.calls.append(("assign", [a.job_id for a in assignments]))
        return sum(a.job_id not in self.refuse for a in assignments)

    def preempt(self, preemption: Preemption) -> bool:
        self.calls.append(("preempt", preemption.job_id))
        return preemption.job_id not in self.refuse

    def diagnose(self, diagnoses: Mapping[str, Diagnosis], planned: Set[str]) -> None:
        self.calls.append(("diagnose", (sorted(k for k in diagnoses if k not in planned), sorted(planned))))


def test_assignments_then_preemptions_then_diagnoses_of_the_jobs_still_waiting() -> None:
    # b holds 3 of the 4 GPUs on borrowed quota; a (guarantee 2) takes the free one for a0, and a1
    # reclaims a GPU from b
    groups = [group("a", guaranteed={ANY_MODEL: 2}), group("b", guaranteed={})]
    run = [running(job(f"b{i}", group="b", runtime=1e4), "n", (i,), borrowed=True) for i in range(3)]
    queued = [job("a0", group="a", gpus=1), job("a1", group="a", gpus=1, submit=1)]
    plan = plan_for(snap([gpu_node("n", gpus=4)], queued, groups, run), PROFILES["default"], now=50.0)
    assert [a.job_id for a in plan.assignments] == ["a0"] and plan.preemptions
    sink = Recorder(refuse={plan.preemptions[0].job_id})
    done = apply_plan(plan, sink)
    victims = [p.job_id for p in plan.preemptions]
    assert sink.calls == [
        ("assign", ["a0"]),
        *(("preempt", v) for v in victims),
        ("diagnose", (["a1"], ["a0"])),
    ]
    assert done == Applied(assigned=1, preempted=len(victims) - 1)


def test_an_empty_plan_asks_only_for_diagnoses() -> None:
    plan = plan_for(snap([gpu_node("n", gpus=1)], [job("big", gpus=2)]), PROFILES["fifo"])
    sink = Recorder(refuse=set())
    assert apply_plan(plan, sink) == Applied(0, 0)
    assert sink.calls == [("diagnose", (["big"], []))]
