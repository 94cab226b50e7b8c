"""Usage accounting (GPU-hours and CPU-hours per user or group). Logic: corral.services.usage."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from corral.api.deps import DB, CurrentUser
from corral.api.schemas import UsageOut
from corral.services import usage as svc

router = APIRouter(tags=["usage"])
MAX_UNIX_S = 1e11  # the year 5138: bounds the window (no inf, no nan)


@router.get("/usage", response_model=UsageOut)
def usage(
    db: DB,
    principal: CurrentUser,
    since: Annotated[
        float | None, Query(ge=0, le=MAX_UNIX_S, description="unix seconds; default: until - 30 days")
    ] = None,
    until: Annotated[
        float | None, Query(ge=0, le=MAX_UNIX_S, description="unix seconds; default: now")
    ] = None,
    by: Annotated[Literal["user", "group"], Query(description="user or group")] = "user",
) -> UsageOut:
    """Members see their own usage, group admins also their groups', admins everyone's."""
    report = svc.usage_report(db, principal, since=since, until=until, by=by)
    return UsageOut.model_validate(asdict(report))
