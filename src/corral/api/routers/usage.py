"""Usage accounting (GPU-hours and CPU-hours per user or group). Logic: corral.services.usage."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Annotated, Literal

from fastapi import APIRouter, Query

from corral.api.deps import DB, CurrentUser
from corral.api.schemas import UsageOut
from corral.services import usage as svc

router = APIRouter(tags=["usage"])
TIME_FORMS = (
    "an age such as '7d', '12h' or '30m' (that long before now), unix seconds, "
    "or an ISO time (UTC unless it says otherwise)"
)


@router.get("/usage", response_model=UsageOut)
def usage(
    db: DB,
    principal: CurrentUser,
    since: Annotated[
        str | None, Query(description=f"{TIME_FORMS}; default: until - 30 days", max_length=64)
    ] = None,
    until: Annotated[str | None, Query(description="as `since`; default: now", max_length=64)] = None,
    by: Annotated[Literal["user", "group"], Query(description="user or group")] = "user",
) -> UsageOut:
    """Members see their own usage, group admins also their groups', admins everyone's."""
    now = time.time()
    report = svc.usage_report(
        db,
        principal,
        since=svc.parse_bound(since, now, "since"),
        until=svc.parse_bound(until, now, "until"),
        by=by,
        now=now,
    )
    return UsageOut.model_validate(asdict(report))
