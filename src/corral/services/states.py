"""Job, attempt, node and GPU states and the moves allowed between them: what they are, not how
they change. services/lifecycle.py is the one writer (compare-and-set against these tables) and
re-exports every name here, so callers import them from either."""

from __future__ import annotations

from enum import StrEnum

from corral.scheduler.types import NodeState


class JobState(StrEnum):
    QUEUED = "queued"
    SCHEDULED = "scheduled"
    STARTING = "starting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def active(self) -> bool:
        """Holds (or is about to hold) resources."""
        return self in (JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING, JobState.PREEMPTED)


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})


class AttemptState(StrEnum):
    SCHEDULED = "scheduled"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    PREEMPTED = "preempted"
    LOST = "lost"

    @property
    def finished(self) -> bool:
        return self not in (AttemptState.SCHEDULED, AttemptState.STARTING, AttemptState.RUNNING)


class GpuHealth(StrEnum):
    HEALTHY = "healthy"  # the scheduler may place work on it (if the engine also reports it healthy)
    QUARANTINED = "quarantined"  # kept out of placement while it is examined
    LOST = "lost"  # gone for good until an operator says otherwise


_J = JobState
JOB_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    _J.QUEUED: frozenset({_J.SCHEDULED, _J.CANCELLED, _J.FAILED}),
    _J.SCHEDULED: frozenset({_J.STARTING, _J.QUEUED, _J.FAILED, _J.CANCELLED}),
    # PREEMPTED: a node drained while the job was starting (services.remediation): the reconcile
    # loop stops its attempt, whatever the engine reports it doing, and requeues it.
    _J.STARTING: frozenset({_J.RUNNING, _J.SUCCEEDED, _J.FAILED, _J.CANCELLED, _J.QUEUED, _J.PREEMPTED}),
    _J.RUNNING: frozenset({_J.SUCCEEDED, _J.FAILED, _J.CANCELLED, _J.PREEMPTED, _J.QUEUED}),
    # SUCCEEDED: an attempt that exited 0 before its preemption stop was sent (rule 1 above).
    _J.PREEMPTED: frozenset({_J.QUEUED, _J.CANCELLED, _J.FAILED, _J.SUCCEEDED}),
    _J.SUCCEEDED: frozenset(),
    _J.FAILED: frozenset(),
    _J.CANCELLED: frozenset(),
}
_A = AttemptState
_ENDED = frozenset({_A.SUCCEEDED, _A.FAILED, _A.CANCELLED, _A.PREEMPTED, _A.LOST})
ATTEMPT_TRANSITIONS: dict[AttemptState, frozenset[AttemptState]] = {
    _A.SCHEDULED: frozenset({_A.STARTING, _A.FAILED, _A.CANCELLED, _A.LOST}),
    _A.STARTING: frozenset({_A.RUNNING}) | _ENDED,
    _A.RUNNING: _ENDED,
    **{state: frozenset() for state in _ENDED},
}
_N = NodeState
NODE_TRANSITIONS: dict[NodeState, frozenset[NodeState]] = {
    _N.READY: frozenset({_N.CORDONED, _N.DRAINING, _N.DOWN, _N.UNKNOWN}),
    _N.CORDONED: frozenset({_N.READY, _N.DRAINING, _N.DOWN, _N.UNKNOWN}),
    _N.DRAINING: frozenset({_N.READY, _N.CORDONED, _N.DOWN, _N.UNKNOWN}),
    _N.DOWN: frozenset(
        {_N.READY, _N.CORDONED, _N.DRAINING}
    ),  # down stays down when the engine is unreachable
    _N.UNKNOWN: frozenset({_N.READY, _N.CORDONED, _N.DRAINING, _N.DOWN}),
}
_G = GpuHealth
GPU_TRANSITIONS: dict[GpuHealth, frozenset[GpuHealth]] = {
    _G.HEALTHY: frozenset({_G.QUARANTINED, _G.LOST}),
    _G.QUARANTINED: frozenset({_G.HEALTHY, _G.LOST}),
    _G.LOST: frozenset({_G.HEALTHY}),
}


class InvalidTransition(ValueError):
    def __init__(self, job_id: int | str, current: str, target: str, what: str = "job") -> None:
        super().__init__(f"{what} {job_id} cannot go from {current} to {target}")
        self.job_id = job_id
        self.current = current
        self.target = target


def can_transition(current: JobState, target: JobState) -> bool:
    return target in JOB_TRANSITIONS[current]
