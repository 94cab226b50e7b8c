"""Incidents and remediation rules (admins): thin over corral.services.incidents and
corral.services.remediation. Every change is audited."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query
from pydantic import ConfigDict, Field

from corral.api.deps import DB, Admin
from corral.api.schemas import RequestBody
from corral.services import audit, remediation
from corral.services import incidents as svc
from corral.services.remediation_rules import parse_or_invalid

router = APIRouter(tags=["incidents"])
IncidentId = Annotated[int, Path(ge=1, le=2**31 - 1)]
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"description": "no such incident"}}
CONFLICT: dict[int | str, dict[str, Any]] = {**NOT_FOUND, 409: {"description": "not allowed in its state"}}
REFUSED: dict[int | str, dict[str, Any]] = {422: {"description": "the file is refused: its line and why"}}
NO_VERSION: dict[int | str, dict[str, Any]] = {404: {"description": "no such version"}}
Text = Annotated[str, Field(min_length=1, max_length=10_000)]


def _after(db: DB, incident_id: int, action: str, admin: Admin, before: str, **extra: Any) -> dict[str, Any]:
    incident = svc.get(db, incident_id)
    audit.record(db, actor=admin, action=f"incident.{action}", target_kind="incident", target_id=incident_id,
                 before={"state": before}, after={"state": incident.state, **extra})  # fmt: skip
    db.commit()
    return svc.view(incident, time.time())


@router.get("/incidents")
def list_incidents(
    db: DB,
    _admin: Admin,
    state: Literal["triggered", "acknowledged", "mitigated", "resolved", "closed"] | None = None,
    severity: Literal["SEV1", "SEV2", "SEV3", "SEV4"] | None = None,
    node: str | None = Query(None, min_length=1, max_length=128),
    open: bool = Query(False, description="only triggered, acknowledged or mitigated ones"),
    flapping: bool | None = Query(
        None,
        description="true: only flapping ones (reopening too often: `flapping` in each item); "
        "false: only those not flapping; left out: both",
    ),
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=2**31 - 1),
) -> dict[str, Any]:
    """Incidents, newest first, with their SLA countdowns."""
    rows, total = svc.list_incidents(
        db,
        state=state,
        severity=severity,
        node=node,
        open_only=open,
        flapping=flapping,
        limit=limit,
        offset=offset,
    )
    now = time.time()
    return {"items": [svc.view(r, now) for r in rows], "total": total}


@router.get("/incidents/{incident_id}", responses=NOT_FOUND)
def show_incident(incident_id: IncidentId, db: DB, _admin: Admin) -> dict[str, Any]:
    """One incident with its timeline and postmortem."""
    return svc.detail(db, incident_id, time.time())


@router.post("/incidents/{incident_id}/ack", responses=CONFLICT)
def ack_incident(incident_id: IncidentId, db: DB, admin: Admin) -> dict[str, Any]:
    before = svc.get(db, incident_id).state
    svc.acknowledge(db, incident_id, admin.name, time.time())
    return _after(db, incident_id, "ack", admin, before)


class Note(RequestBody):
    model_config = ConfigDict(extra="forbid")
    note: str = Field("", max_length=10_000)


class Comment(RequestBody):
    model_config = ConfigDict(extra="forbid")
    text: Text


@router.post("/incidents/{incident_id}/comment", responses=NOT_FOUND)
def comment_incident(incident_id: IncidentId, body: Comment, db: DB, admin: Admin) -> dict[str, Any]:
    before = svc.get(db, incident_id).state
    svc.comment(db, incident_id, admin.name, body.text, time.time())
    return _after(db, incident_id, "comment", admin, before)


@router.post("/incidents/{incident_id}/mitigate", responses=CONFLICT)
def mitigate_incident(incident_id: IncidentId, body: Note, db: DB, admin: Admin) -> dict[str, Any]:
    before = svc.get(db, incident_id).state
    svc.mitigate(db, incident_id, admin.name, time.time(), body.note)
    return _after(db, incident_id, "mitigate", admin, before)


@router.post("/incidents/{incident_id}/resolve", responses=CONFLICT)
def resolve_incident(incident_id: IncidentId, body: Note, db: DB, admin: Admin) -> dict[str, Any]:
    before = svc.get(db, incident_id).state
    svc.resolve(db, incident_id, admin.name, time.time(), body.note)
    return _after(db, incident_id, "resolve", admin, before)


@router.post("/incidents/{incident_id}/close", responses=CONFLICT)
def close_incident(incident_id: IncidentId, db: DB, admin: Admin) -> dict[str, Any]:
    """Resolved -> closed; SEV1 and SEV2 need their postmortem first (409 otherwise)."""
    before = svc.get(db, incident_id).state
    svc.close(db, incident_id, admin.name, time.time())
    return _after(db, incident_id, "close", admin, before)


class IncidentEdit(RequestBody):
    model_config = ConfigDict(extra="forbid")
    severity: Literal["SEV1", "SEV2", "SEV3", "SEV4"] | None = None
    owner: str | None = Field(None, max_length=64)


@router.patch("/incidents/{incident_id}", responses=NOT_FOUND)
def edit_incident(incident_id: IncidentId, body: IncidentEdit, db: DB, admin: Admin) -> dict[str, Any]:
    """Correct the severity or set the owner."""
    before = svc.get(db, incident_id).state
    svc.edit(db, incident_id, admin.name, time.time(), severity=body.severity, owner=body.owner)
    return _after(db, incident_id, "edit", admin, before, **body.model_dump(exclude_none=True))


class ActionItem(RequestBody):
    model_config = ConfigDict(extra="forbid")
    what: Text
    owner: str = Field(min_length=1, max_length=64)
    due: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$", description="YYYY-MM-DD")


class PostmortemIn(RequestBody):
    model_config = ConfigDict(extra="forbid")
    summary: Text
    impact: Text
    root_cause: Text
    action_items: list[ActionItem] = Field(default_factory=list, max_length=100)


@router.put("/incidents/{incident_id}/postmortem", responses=NOT_FOUND)
def put_postmortem(incident_id: IncidentId, body: PostmortemIn, db: DB, admin: Admin) -> dict[str, Any]:
    """Write (or replace) the postmortem: summary, impact, root cause, action items."""
    before = svc.get(db, incident_id).state
    items = [i.model_dump() for i in body.action_items]
    svc.write_postmortem(db, incident_id, admin.name, time.time(), summary=body.summary, impact=body.impact,
                         root_cause=body.root_cause, action_items=items)  # fmt: skip
    return _after(db, incident_id, "postmortem", admin, before)


# -- remediation rules ---------------------------------------------------------------------------


@router.get("/remediation/rules")
def get_rules(db: DB, _admin: Admin) -> dict[str, Any]:
    """The active rules file and its version (0: the shipped defaults)."""
    version, text = remediation.active_text(db)
    return {"version": version, "text": text}


class RulesIn(RequestBody):
    model_config = ConfigDict(extra="forbid")
    text: str = Field(max_length=256 * 1024)


@router.put(
    "/remediation/rules", responses={**REFUSED, 409: {"description": "another version was applied meanwhile"}}
)
def put_rules(body: RulesIn, db: DB, admin: Admin) -> dict[str, Any]:
    """Apply a new rules file as the next version; a refused one leaves the active version."""
    parse_or_invalid(body.text)
    before = remediation.active_version(db)
    version = remediation.apply_rules(db, body.text, admin.name, time.time())
    audit.record(db, actor=admin, action="remediation.rules.apply", target_kind="rules", target_id=version,
                 before={"version": before}, after={"version": version})  # fmt: skip
    db.commit()
    return {"version": version}


@router.get("/remediation/rules/history")
def rules_history(db: DB, _admin: Admin) -> dict[str, Any]:
    rows = remediation.history(db)
    return {"items": [{"version": r.version, "author": r.author, "created_at": r.created_at} for r in rows]}


@router.get("/remediation/rules/{version}", responses=NO_VERSION)
def rules_version(version: Annotated[int, Path(ge=0, le=2**31 - 1)], db: DB, _admin: Admin) -> dict[str, Any]:
    return {"version": version, "text": remediation.version_text(db, version)}


@router.get("/remediation/runs")
def remediation_runs(
    db: DB,
    _admin: Admin,
    limit: int = Query(100, ge=1, le=1000),
    rule: str | None = Query(None, max_length=64),
) -> dict[str, Any]:
    """The latest rule runs (dry runs included): what each did or would have done."""
    return {"items": remediation.recent_runs(db, limit=limit, rule=rule)}
