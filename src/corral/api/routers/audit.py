"""The admin audit log (admins only): `GET /api/v1/audit`, newest first, with filters and pages.
What is recorded and why: docs/security.md, "Admin audit log"."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel

from corral.api.deps import DB, NO_NUL_TEXT, Admin, fast_json
from corral.services import audit as svc

router = APIRouter(tags=["audit"])


class AuditRecordOut(BaseModel):
    id: int
    at: float
    actor: str  # a user name, or "system:<loop>"
    credential: str | None  # "token:<id>" | "session:<public id>"
    source: str | None  # the client address of the request
    action: str  # e.g. "group.quota.set"
    target_kind: str
    target_id: str
    before: Any | None
    after: Any | None
    detail: str | None


class AuditPageOut(BaseModel):
    items: list[AuditRecordOut]
    total: int
    limit: int
    offset: int


def split_target(target: str | None) -> tuple[str | None, str | None]:
    """ "KIND" or "KIND:ID" (the id may itself hold colons, e.g. "gpu:node1:0")."""
    if target is None or not target.strip():
        return None, None
    kind, sep, ident = target.strip().partition(":")
    return svc.check_target_kind(kind), (ident if sep else None)


@router.get("/audit", response_model=AuditPageOut)
def list_audit(
    db: DB,
    _admin: Admin,
    actor: Annotated[
        str | None, Query(description="exact user name, or system:<loop>", pattern=NO_NUL_TEXT)
    ] = None,
    action: Annotated[
        str | None,
        Query(description="action or dotted prefix, e.g. 'group' or 'token.create'", pattern=NO_NUL_TEXT),
    ] = None,
    target: Annotated[
        str | None, Query(description="KIND or KIND:ID, e.g. 'node' or 'group:vision'", pattern=NO_NUL_TEXT)
    ] = None,
    since: Annotated[
        str | None,
        Query(description="age such as '7d' or '12h', unix seconds, or ISO time", max_length=64),
    ] = None,
    until: Annotated[str | None, Query(description="as `since`; exclusive", max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=svc.MAX_PAGE)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> Any:
    now = time.time()
    kind, ident = split_target(target)
    flt = svc.AuditFilter(
        actor=actor or None,
        action=action or None,
        target_kind=kind,
        target_id=ident,
        since=None if not since else svc.parse_time(since, now, "since"),
        until=None if not until else svc.parse_time(until, now, "until"),
        limit=limit,
        offset=offset,
    )
    rows, total = svc.list_records(db, flt)
    return fast_json(
        {"items": [svc.record_view(r) for r in rows], "total": total, "limit": limit, "offset": offset}
    )
