"""`/healthz` (liveness: the process answers) and `/readyz` (readiness: the database answers and
the server's background loops are alive), unauthenticated, for load balancers and systemd.

The loops live in the server process (corral.server.runner), which this layer does not import:
the server puts a callable on `app.state.loop_health` returning objects shaped like
`LoopStatus`. An app without it (the API alone, as in tests) has no loops to report on."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import sqlalchemy as sa
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

router = APIRouter(tags=["health"])


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


@router.get("/readyz", responses={503: {"description": "not ready: the body names what is not"}})
def readyz(request: Request) -> JSONResponse:
    """200 `{"ready": true, ...}` or 503 naming what is not ready: the database, or loops that
    have had no good pass for too long (stuck in a tick or failing every tick)."""
    started = time.perf_counter()
    db_error = database_error(request.app.state.db_engine)
    loop_health: LoopHealth | None = getattr(request.app.state, "loop_health", None)
    loops = list(loop_health()) if loop_health is not None else []
    not_ready = (["database"] if db_error else []) + [f"loop {lp.name}" for lp in loops if not lp.ok]
    body = {
        "ready": not not_ready,
        "not_ready": not_ready,
        "database": {
            "ok": db_error is None,
            "error": db_error,
            "checked_in_s": round(time.perf_counter() - started, 4),
        },
        "loops": {
            lp.name: {
                "ok": lp.ok,
                "last_ok_s_ago": lp.last_ok_s_ago,
                "stall_after_s": lp.stall_after_s,
                "error": lp.error,
            }
            for lp in loops
        },
    }
    return JSONResponse(body, status_code=503 if not_ready else 200)
