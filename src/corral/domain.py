"""Typed models of the JSON that Corral stores in its own tables: an attempt's placement and a
waiting job's diagnosis (the job spec's model is `corral.spec.JobSpecV1`).

They are parsed once, where a row is read (the column types in `corral.db.jsontypes`), so the
control loops, services and engines pass these objects, never untyped dicts. The JSON shape on
disk is unchanged: the same keys the API has always returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict


@dataclass(frozen=True, slots=True)
class InstancePlacement:
    """One task instance of an attempt as the scheduler placed it."""

    role: str
    index: int  # within its role
    rank: int  # global rank: roles in spec order, then index (0 = master)
    node: str
    gpu_indices: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    cpus: float
    memory_mib: int


Placement = tuple[InstancePlacement, ...]  # in rank order


class InstancePlacementJSON(TypedDict):
    """`InstancePlacement` as stored and as the API returns it."""

    role: str
    index: int
    rank: int
    node: str
    gpu_indices: list[int]
    gpu_uuids: list[str]
    cpus: float
    memory_mib: int


def placement_to_json(placement: Placement) -> list[InstancePlacementJSON]:
    return [
        {
            "role": p.role,
            "index": p.index,
            "rank": p.rank,
            "node": p.node,
            "gpu_indices": list(p.gpu_indices),
            "gpu_uuids": list(p.gpu_uuids),
            "cpus": p.cpus,
            "memory_mib": p.memory_mib,
        }
        for p in placement
    ]


def placement_nodes(placement: Placement) -> list[str]:
    """The nodes an attempt runs on, each once, in rank order."""
    return list(dict.fromkeys(p.node for p in placement))


@dataclass(frozen=True, slots=True)
class PendingReason:
    code: str  # stable machine code, e.g. "gpu_fragmented"
    source: str  # the filter or admission stage that gave it
    message: str  # plain sentence for the user


# Reason codes of a job held back by its group's quota (GPUs or storage) or its user's cap whatever
# GPUs are free: its diagnosis gives no estimated start (the scheduler cannot tell when the group's
# or the user's own running jobs will free enough, or the group free storage), only that reason.
HELD_CODES = frozenset({"user_cap", "quota_exhausted", "quota_max", "storage_quota"})
# The reason of a job on hold (`corral hold`, services.views.effective_diagnosis): its only reason,
# never the scheduler's (a held job is no input to it). Held too, as Slurm's and Kueue's users read
# "held": no time by design, until someone releases it.
ON_HOLD_CODE = "on_hold"


@dataclass(frozen=True, slots=True)
class JobDiagnosis:
    """Why a queued job waits, as the schedule loop last wrote it (`Job.diagnosis`)."""

    reasons: tuple[PendingReason, ...]
    queue_position: int | None  # in the order the scheduler takes waiting jobs (fair share included)
    estimated_start: float | None
    unschedulable: bool = False
    # (early, late) estimated start with runtimes at their history's 25th/75th percentiles
    start_range: tuple[float, float] | None = None

    @property
    def held(self) -> bool:
        """No estimated start, by design: on hold (`corral hold`: reason `on_hold`, until it is
        released) or held back by its group's quota (GPUs or storage) or its user's cap (a
        HELD_CODES reason, until its group's or user's own jobs free enough). The reasons say which."""
        return any(r.code in HELD_CODES or r.code == ON_HOLD_CODE for r in self.reasons)

    @property
    def on_hold(self) -> bool:
        """Held by someone (`corral hold`), not by a quota or cap."""
        return any(r.code == ON_HOLD_CODE for r in self.reasons)


class PendingReasonJSON(TypedDict):
    code: str
    source: str
    message: str


class JobDiagnosisJSON(TypedDict):
    reasons: list[PendingReasonJSON]
    queue_position: int | None
    estimated_start: float | None
    unschedulable: bool
    start_range: list[float] | None
    held: bool


def span_text(seconds: float) -> str:
    """ "45 s", "12 min", "2 h 10 min", "3 d 4 h": a duration said the way people say it."""
    s = max(0, round(seconds))
    if s < 90:
        return f"{s} s"
    m = round(s / 60)
    if m < 90:
        return f"{m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min" if m else f"{h} h"
    d, h = divmod(h, 24)
    return f"{d} d {h} h" if h else f"{d} d"


def start_text(estimated: float | None, start_range: Sequence[float] | None, now: float) -> str:
    """ "in ~2 h 10 min (likely 1 h 30 min to 3 h)": an estimated start with its uncertainty."""
    if estimated is None:
        return "unknown"
    text = f"in ~{span_text(estimated - now)}"
    if start_range is not None and start_range[1] - start_range[0] >= 60:
        text += f" (likely {span_text(start_range[0] - now)} to {span_text(start_range[1] - now)})"
    return text


def diagnosis_to_json(diagnosis: JobDiagnosis) -> JobDiagnosisJSON:
    return {
        "reasons": [{"code": r.code, "source": r.source, "message": r.message} for r in diagnosis.reasons],
        "queue_position": diagnosis.queue_position,
        "estimated_start": diagnosis.estimated_start,
        "unschedulable": diagnosis.unschedulable,
        "start_range": None if diagnosis.start_range is None else list(diagnosis.start_range),
        "held": diagnosis.held,
    }
