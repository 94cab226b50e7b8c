"""What each stage of a cycle decided about a waiting job, kept in one place: the reasons the
stages gave are the reasons the diagnoses report (nothing is worked out twice)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

from corral.scheduler.types import Job, Reason

# Verdicts' "left out" defaults: private, compared by identity (a new empty dict each, as the
# default factories give); not None, so the parameters keep the fields' types (review127 #8)
_FRESH_WHY: Final[dict[str, Reason]] = {}
_FRESH_UNSCHEDULABLE: Final[dict[str, tuple[Reason, ...]]] = {}


@dataclass(slots=True)
class Verdicts:
    why: dict[str, Reason] = field(default_factory=dict)  # job id -> why it waits (stage's reason)
    unschedulable: dict[str, tuple[Reason, ...]] = field(default_factory=dict)  # can never run

    # written out, as in types.py (one per cycle); left out: a new empty dict, as the default factories
    def __init__(
        self,
        why: dict[str, Reason] = _FRESH_WHY,
        unschedulable: dict[str, tuple[Reason, ...]] = _FRESH_UNSCHEDULABLE,
    ) -> None:
        self.why = {} if why is _FRESH_WHY else why
        self.unschedulable = {} if unschedulable is _FRESH_UNSCHEDULABLE else unschedulable

    def wait_or_never(self, job: Job, reason: Reason, never: bool) -> None:
        if never:
            self.unschedulable[job.id] = (reason,)
        else:
            self.why[job.id] = reason
