"""Typed models of the JSON that Corral stores in its own tables: an attempt's placement and a
waiting job's diagnosis (the job spec's model is `corral.spec.JobSpecV1`).

They are parsed once, where a row is read (the column types in `corral.db.jsontypes`), so the
control loops, services and engines pass these objects, never untyped dicts. The JSON shape on
disk is unchanged: the same keys the API has always returned.
"""

from __future__ import annotations

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


@dataclass(frozen=True, slots=True)
class JobDiagnosis:
    """Why a queued job waits, as the schedule loop last wrote it (`Job.diagnosis`)."""

    reasons: tuple[PendingReason, ...]
    queue_position: int | None
    estimated_start: float | None
    unschedulable: bool = False


class PendingReasonJSON(TypedDict):
    code: str
    source: str
    message: str


class JobDiagnosisJSON(TypedDict):
    reasons: list[PendingReasonJSON]
    queue_position: int | None
    estimated_start: float | None
    unschedulable: bool


def diagnosis_to_json(diagnosis: JobDiagnosis) -> JobDiagnosisJSON:
    return {
        "reasons": [{"code": r.code, "source": r.source, "message": r.message} for r in diagnosis.reasons],
        "queue_position": diagnosis.queue_position,
        "estimated_start": diagnosis.estimated_start,
        "unschedulable": diagnosis.unschedulable,
    }
