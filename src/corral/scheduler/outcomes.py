"""What each stage of a cycle decided about a waiting job, kept in one place: the reasons the
stages gave are the reasons the diagnoses report (nothing is worked out twice)."""

from __future__ import annotations

from dataclasses import dataclass, field

from corral.scheduler.types import Job, Reason


@dataclass(slots=True)
class Verdicts:
    why: dict[str, Reason] = field(default_factory=dict)  # job id -> why it waits (stage's reason)
    unschedulable: dict[str, tuple[Reason, ...]] = field(default_factory=dict)  # can never run

    # written out, as in types.py (one per cycle); None: a new empty dict, as the default factories
    def __init__(
        self,
        why: dict[str, Reason] | None = None,
        unschedulable: dict[str, tuple[Reason, ...]] | None = None,
    ) -> None:
        self.why = {} if why is None else why
        self.unschedulable = {} if unschedulable is None else unschedulable

    def wait_or_never(self, job: Job, reason: Reason, never: bool) -> None:
        if never:
            self.unschedulable[job.id] = (reason,)
        else:
            self.why[job.id] = reason
