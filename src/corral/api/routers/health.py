"""`/healthz` (liveness: the process answers) and `/readyz` (readiness: the database answers and
the server's background loops are alive), unauthenticated, for load balancers and systemd.

`/readyz` tells anyone whether the server is ready and which parts are not; the text of what
failed (a database error names its host, port and role, a loop's exception whatever its message
holds) only to an admin's credential or the metrics scrape token, and to the server log
(docs/security.md, "API and login").

The loops live in the server process (corral.server.runner), which this layer does not import:
the server puts a callable on `app.state.loop_health` returning objects shaped like
`LoopStatus`. An app without it (the API alone, as in tests) has no loops to report on."""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from corral.api.deps import bearer_token, principal_or_none, session_secret
from corral.api.metrics_auth import metrics_token
from corral.services.auth import cached_principal, sha256_hex
from corral.services.errors import ServiceError

router = APIRouter(tags=["health"])
log = logging.getLogger("corral.api.health")


class LoopStatus(Protocol):
    name: str
    ok: bool
    last_ok_s_ago: float
    stall_after_s: float
    error: str | None


LoopHealth = Callable[[], Sequence[LoopStatus]]


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """200 as long as the process serves requests; touches nothing else."""
    return {"status": "ok"}


def database_error(db_engine: sa.Engine) -> str | None:
    """None when one trivial query against the Corral schema succeeds, else why not."""
    try:
        with db_engine.connect() as conn:
            conn.execute(sa.text("SELECT COUNT(*) FROM leases"))
        return None
    except Exception as exc:  # any failure means "not ready"; say which
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:500]


def may_see_errors(request: Request) -> bool:
    """Whether the caller is shown what failed: the metrics scrape token (which works while the
    database does not) or an admin's API token or portal session (only while it answers). The
    Authorization header is read as authentication reads it (deps.bearer_token: the scheme in any
    case, blanks around the token dropped); one that is no `Bearer <token>` (an empty `Bearer`,
    another scheme) is no credential, and no attempt at one either: the API answers such a
    request 401 whatever cookie comes with it, so it is shown the names only, without a look at
    the scrape token's file or the database (a probe with a stray header costs what an anonymous
    one does)."""
    header = request.headers.get("authorization")
    if not header:
        if session_secret(request) is None:
            return False  # an anonymous probe (most of them): no file read, no database
    else:
        token = bearer_token(header)
        if token is None:
            return False
        try:
            scrape = metrics_token(request.app.state.settings)
        except ValueError:  # its file went away since start-up (which checked it): no scrape token
            scrape = None
        if scrape is not None and hmac.compare_digest(token.encode(), scrape.encode()):
            return True
        # a token seen in the last seconds: no database query
        cached = cached_principal(sha256_hex(token), time.time())
        if cached is not None:
            return cached.is_admin
    try:
        with request.app.state.session_factory() as db:
            principal = principal_or_none(request, db)
    except (ServiceError, sa.exc.SQLAlchemyError):  # no database to ask
        return False
    return principal is not None and principal.is_admin


_last_logged: dict[str, str | None] = {"database": None}


def _log_database_error(error: str | None) -> None:
    """Into the server log once per new error, not on every probe (one every few seconds)."""
    if error is not None and error != _last_logged["database"]:
        log.warning("readyz: the database is not ready: %s", error)
    _last_logged["database"] = error


@router.get("/readyz", responses={503: {"description": "not ready: the body names what is not"}})
def readyz(request: Request) -> JSONResponse:
    """200 `{"ready": true, ...}` or 503 naming what is not ready: the database, or loops that
    have had no good pass for too long (stuck in a tick or failing every tick). The `error`
    texts only for an admin or the metrics token; to anyone else the names alone."""
    started = time.perf_counter()
    db_error = database_error(request.app.state.db_engine)
    _log_database_error(db_error)
    loop_health: LoopHealth | None = getattr(request.app.state, "loop_health", None)
    loops = list(loop_health()) if loop_health is not None else []
    not_ready = (["database"] if db_error else []) + [f"loop {lp.name}" for lp in loops if not lp.ok]
    checked_in_s = round(time.perf_counter() - started, 4)
    database: dict[str, Any] = {"ok": db_error is None, "checked_in_s": checked_in_s}
    loop_views: dict[str, dict[str, Any]] = {
        lp.name: {"ok": lp.ok, "last_ok_s_ago": lp.last_ok_s_ago, "stall_after_s": lp.stall_after_s}
        for lp in loops
    }
    if may_see_errors(request):
        database["error"] = db_error
        for lp in loops:
            loop_views[lp.name]["error"] = lp.error
    body = {"ready": not not_ready, "not_ready": not_ready, "database": database, "loops": loop_views}
    return JSONResponse(body, status_code=503 if not_ready else 200)
