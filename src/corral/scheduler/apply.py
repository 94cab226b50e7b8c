"""Carrying out a Plan, defined once for the live loop and the simulator: each implements a
`PlanSink` (the database in `server/scheduling.py`, in-memory state in `sim/replay.py`) and calls
`apply_plan`, so both apply assignments, preemptions and diagnoses in the same order and with the
same rules about what is still waiting."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Protocol

from corral.scheduler.diagnosis import LazyDiagnoses
from corral.scheduler.types import Assignment, Diagnosis, Plan, Preemption


class PlanSink(Protocol):
    def assign(self, assignments: Sequence[Assignment]) -> int:
        """Start these jobs where they were placed (in one go where the sink can); how many
        started (an assignment that no longer fits is skipped, not half-applied)."""
        ...

    def preempt(self, preemption: Preemption) -> bool:
        """Ask a running job to stop within its grace; False when it is no longer running."""
        ...

    def diagnose(self, diagnoses: Mapping[str, Diagnosis], planned: Set[str]) -> None:
        """Record why jobs wait; `planned` are the jobs the plan assigned (not waiting, whether or
        not their start took): their entries, if any, are to be ignored."""
        ...


@dataclass(frozen=True, slots=True)
class Applied:
    assigned: int
    preempted: int

    def __init__(self, assigned: int, preempted: int) -> None:  # written out, as in types.py
        object.__setattr__(self, "assigned", assigned)
        object.__setattr__(self, "preempted", preempted)


def apply_plan(plan: Plan, sink: PlanSink) -> Applied:
    """Assignments first (they use only capacity that is free now), then preemptions (their
    victims keep their resources through the grace period), then the diagnoses of waiting jobs."""
    assigned = sink.assign(plan.assignments) if plan.assignments else 0
    preempted = sum(sink.preempt(p) for p in plan.preemptions)
    sink.diagnose(plan.diagnoses, {a.job_id for a in plan.assignments})
    return Applied(assigned, preempted)


def estimated_starts(diagnoses: Mapping[str, Diagnosis], job_ids: Collection[str]) -> dict[str, float | None]:
    """Several waiting jobs' estimated starts at the cost of rolling the plan forward only as far
    as the last of them, when the plan's diagnoses are still lazy."""
    if isinstance(diagnoses, LazyDiagnoses):
        return diagnoses.estimated_starts(job_ids)
    return {j: estimated_start(diagnoses, j) for j in job_ids}


def estimated_start(diagnoses: Mapping[str, Diagnosis], job_id: str) -> float | None:
    """A waiting job's estimated start, without building its reasons when the plan's diagnoses
    are still lazy (None when it is not waiting or has no estimate)."""
    if isinstance(diagnoses, LazyDiagnoses):
        return diagnoses.estimated_start(job_id)
    found = diagnoses.get(job_id)
    return None if found is None else found.estimated_start
