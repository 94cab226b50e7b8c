"""`GET /admin/sim-export` (admins only): the platform's job history as a simulator trace plus the
current cluster and quotas, for `corral sim --from-cluster`. Logic: corral.services.sim_export.
It hands out the whole platform's history, so every export is recorded in the audit log."""

from __future__ import annotations

import time
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from corral.api.deps import DB, Admin, fast_json
from corral.services import audit
from corral.services import sim_export as svc
from corral.services.policy import active_profile

router = APIRouter(tags=["simulator"])


@router.get("/admin/sim-export")
def sim_export(
    request: Request,
    db: DB,
    principal: Admin,
    since: Annotated[
        str,
        Query(
            description="jobs submitted since: an age such as '30d' or '12h', unix seconds, or ISO time",
            max_length=64,
        ),
    ] = "30d",
    anonymise: Annotated[bool, Query(description="users, groups and job names as pseudonyms")] = False,
    unfinished: Annotated[
        bool, Query(description="also jobs still running or waiting (censored at the export time)")
    ] = False,
) -> Any:
    now = time.time()
    start = svc.parse_since(since, now)
    export = svc.export_history(
        db,
        since=start,
        now=now,
        profile=active_profile(request.app.state.settings),
        anonymise=anonymise,
        unfinished=unfinished,
    )
    audit.record(
        db,
        actor=principal,
        action="cluster.history.export",
        target_kind="cluster",
        target_id="jobs",
        after={"since": start, "until": now, "anonymised": anonymise, "unfinished": unfinished}
        | {"jobs": export["counts"]["jobs"]},
    )
    db.commit()
    return fast_json(export)
