"""Monitoring's HTTP routes: `/metrics` (Prometheus), each GPU's use for the portal
(`/api/v1/gpus`), alerts (`/api/v1/alerts`, the Alertmanager webhook), notification channel status
and the admin chaos endpoints (GPU faults, silenced nodes).

The router's lifespan loads and validates the monitor config when the server starts, so a bad
`monitor.yml` stops start-up with its file and line instead of failing later. Afterwards the
routes read the same reloading source as the loops (`_config_source`): a channel added to the
file while the server runs receives the webhook's alerts without a restart.
"""

from __future__ import annotations

import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, HTTPException, Path, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client import generate_latest
from pydantic import ConfigDict, Field, ValidationError, model_validator

from corral.api.deps import DB, Admin, CurrentUser
from corral.api.schemas import BooleansApart
from corral.config import Settings
from corral.db.models import Node
from corral.monitor.alerts import WebhookPayload, alert_to_dict, ingest_webhook, list_alerts
from corral.monitor.channels import channel_statuses
from corral.monitor.chaos import inject_job_oom, set_node_silenced
from corral.monitor.collector import read_families, render_text
from corral.monitor.config import (
    MonitorConfig,
    MonitorConfigSource,
    config_path,
    webhook_token,
    webhook_token_path,
)
from corral.monitor.gpu import update_fault
from corral.monitor.gpu_usage import GpuUsage, gpu_usage
from corral.monitor.loops import config_source
from corral.monitor.metrics import METRICS_RENDER_SECONDS, REGISTRY
from corral.services import audit
from corral.services.nodes import gpu_or_not_found

log = logging.getLogger("corral.monitor.api")
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings | None = getattr(app.state, "settings", None)
    if settings is not None:
        _config_source(app).current()  # raises: start-up refused
        if webhook_token(settings) is None:
            log.warning(
                "no alert webhook token configured: POST /api/v1/alerts/webhook refuses every request "
                "(set CORRAL_MONITOR_WEBHOOK_TOKEN_FILE, or write %s)",
                webhook_token_path(settings),
            )
    yield


router = APIRouter(lifespan=_lifespan)


def _config_source(app: FastAPI) -> MonitorConfigSource:
    """In the server: the loops' source (one reload for both). An app without the loops (an API
    process of its own, tests) keeps a source of the same kind on its state."""
    ctx = getattr(app.state, "server_context", None)
    if ctx is not None:
        return config_source(ctx)
    source: MonitorConfigSource | None = getattr(app.state, "monitor_config_source", None)
    if source is None:
        source = app.state.monitor_config_source = MonitorConfigSource(config_path(app.state.settings))
    return source


def _config(request: Request) -> MonitorConfig:
    return _config_source(request.app).current()


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, db: DB) -> Response:
    started = time.perf_counter()
    settings: Settings = request.app.state.settings
    families = read_families(db, time.time(), settings.home)
    db.rollback()  # read-only: end the snapshot transaction at once
    body = generate_latest(REGISTRY).decode() + render_text(families)
    METRICS_RENDER_SECONDS.set(time.perf_counter() - started)
    return PlainTextResponse(body, media_type=PROMETHEUS_CONTENT_TYPE)


@router.get("/api/v1/alerts")
def get_alerts(
    db: DB,
    user: CurrentUser,
    status: Literal["firing", "resolved"] | None = None,  # a 422 names both; a pattern showed a regex
    name: str | None = Query(None, min_length=1, max_length=256),
    limit: int = Query(100, ge=1, le=1000),
    offset: int = Query(0, ge=0, le=2**31 - 1),
) -> dict[str, Any]:
    """The alerts the caller may see: a member's own jobs' alerts and cluster-wide ones, a group
    admin's groups' too, an admin all (corral.monitor.alerts.alert_visibility)."""
    rows, total = list_alerts(db, user, status=status, name=name, limit=limit, offset=offset)
    return {"items": [alert_to_dict(a) for a in rows], "total": total}


@router.get("/api/v1/gpus")
def get_gpu_usage(db: DB, user: CurrentUser) -> GpuUsage:
    """Each GPU's holder and latest reading, cut to what the caller may see: a job id only for a
    job the caller may see, a group only to its members (corral.monitor.gpu_usage). The portal's
    utilization figures come from here, so they need no scrape token."""
    usage = gpu_usage(db, user)
    db.rollback()  # read-only
    return usage


@router.get("/api/v1/alerts/channels")
def get_channels(request: Request, db: DB, _user: CurrentUser) -> dict[str, Any]:
    """Each channel's counts and state: `failing` while a notification is being retried or the
    last to settle was given up, else `ok` (docs/metrics.md)."""
    return {"items": [s.as_dict() for s in channel_statuses(db, _config(request))]}


def _unauthorized(reason: str) -> JSONResponse:
    return JSONResponse({"detail": reason}, status_code=401, headers={"WWW-Authenticate": "Bearer"})


@router.post(
    "/api/v1/alerts/webhook",
    responses={
        400: {"description": "the body is not an Alertmanager webhook payload"},
        401: {"description": "missing or wrong webhook token"},
    },
)
async def alert_webhook(request: Request) -> Response:
    """Alertmanager's webhook receiver. Authenticated with the shared secret as a bearer token;
    a bad body is 400 with the reason; either way nothing is stored."""
    expected = webhook_token(request.app.state.settings)
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if expected is None:
        return _unauthorized(
            "the alert webhook has no token configured (CORRAL_MONITOR_WEBHOOK_TOKEN, "
            "CORRAL_MONITOR_WEBHOOK_TOKEN_FILE, or the file alert_webhook_token in CORRAL_HOME)"
        )
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), expected.encode()):
        return _unauthorized("missing or wrong bearer token for the alert webhook")
    raw = await request.body()
    try:
        payload = WebhookPayload.model_validate(json.loads(raw))
    except ValueError as exc:
        return JSONResponse({"detail": f"malformed alert payload: {_reason(exc)}"}, status_code=400)
    try:
        changes = await _store(request, payload)
    except ValueError as exc:  # e.g. a time that is not RFC 3339
        return JSONResponse({"detail": f"malformed alert payload: {exc}"}, status_code=400)
    return JSONResponse({"received": len(changes), "changed": sum(c.changed for c in changes)})


async def _store(request: Request, payload: WebhookPayload) -> list[Any]:
    from starlette.concurrency import run_in_threadpool

    channels = [c.name for c in _config(request).channels]

    def store() -> list[Any]:
        with request.app.state.session_factory() as session:
            try:
                changes = ingest_webhook(session, payload, time.time(), channels)
            except Exception:
                session.rollback()
                raise
            session.commit()
            return changes

    return await run_in_threadpool(store)


def _reason(exc: ValueError) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "body"
        return f"{where}: {err['msg']}"
    if isinstance(exc, json.JSONDecodeError):
        return f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    return str(exc)


class GpuFault(BooleansApart):
    """Fault injection on one (virtual) GPU; unset fields are left as they are."""

    model_config = ConfigDict(extra="forbid")

    temperature_c: float | None = Field(None, ge=-50, le=200)
    utilization_percent: float | None = Field(None, ge=0, le=100)
    ecc_uncorrected: int = Field(0, ge=0)
    ecc_corrected: int = Field(0, ge=0)
    xid: int | None = Field(None, ge=0)
    lost: bool | None = None
    clear: bool = False
    # gradual faults: rates per second from now on (0 stops one); see corral.monitor.gpu
    temperature_ramp_c_per_s: float | None = Field(None, ge=0, le=100)
    ecc_corrected_per_s: float | None = Field(None, ge=0, le=1000)
    flap_period_s: float | None = Field(None, ge=0)
    flap_down_s: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _down_within_period(self) -> GpuFault:
        if self.flap_period_s and self.flap_down_s is not None and self.flap_down_s >= self.flap_period_s:
            raise ValueError("flap_down_s must be shorter than flap_period_s")
        return self


@router.post("/api/v1/chaos/gpus/{node}/{index}")
def inject_gpu_fault(
    node: Annotated[str, Path(min_length=1, max_length=255)],
    index: Annotated[int, Path(ge=0, le=1023)],
    fault: GpuFault,
    request: Request,
    db: DB,
    admin: Admin,
) -> dict[str, Any]:
    """Admin: change what the virtual GPU provider reports for one GPU (read at the next sample)."""
    changes = fault.model_dump(exclude_none=True)
    if not changes.get("clear"):
        changes.pop("clear", None)
        # a fault for a GPU the cluster does not have would be written, reported as injected and
        # never read by any sample (404); clearing stays open: a removed node's stale entry
        gpu_or_not_found(db, node, index)
    entry = update_fault(request.app.state.settings.home, node, index, **changes)
    # The fault file is not transactional: the record follows the write it describes.
    audit.record(
        db,
        actor=admin,
        action="chaos.gpu.clear" if changes.get("clear") else "chaos.gpu.fault",
        target_kind="gpu",
        target_id=f"{node}:{index}",
        after={"requested": changes, "fault": entry},
    )
    db.commit()
    return {"node": node, "index": index, "fault": entry}


@router.post("/api/v1/chaos/nodes/{node}/{action}")
def silence_node(
    node: str, action: Literal["down", "up"], request: Request, db: DB, admin: Admin
) -> dict[str, Any]:
    """Admin: stop (`down`) or resume (`up`) the heartbeats of a node, as if it were cut off;
    after the heartbeat timeout the node loop marks it down and settles its work as lost."""
    if action == "down" and db.get(Node, node) is None:
        raise HTTPException(404, f"no node named {node!r}")
    silenced = set_node_silenced(request.app.state.settings.home, node, action == "down")
    audit.record(  # after the (non-transactional) file write, as for GPU faults
        db,
        actor=admin,
        action=f"chaos.node.{action}",
        target_kind="node",
        target_id=node,
        after={"heartbeats": "stopped" if node in silenced else "flowing"},
    )
    db.commit()
    return {"node": node, "heartbeats": "stopped" if node in silenced else "flowing"}


class JobOom(BooleansApart):
    model_config = ConfigDict(extra="forbid")

    force: bool = Field(False, description="also on real GPUs (an admin's explicit choice)")


@router.post(
    "/api/v1/chaos/jobs/{job_id}/oom",
    responses={
        404: {"description": "no such job"},
        409: {"description": "no running attempt, or real GPUs without force"},
    },
)
def oom_job(
    job_id: Annotated[int, Path(ge=1, le=2**31 - 1)], body: JobOom, request: Request, db: DB, admin: Admin
) -> dict[str, Any]:
    """Admin: end the job's running attempt as an out-of-memory kill (diagnosed `oom`, never
    retried; the CorralJobOOM alert follows). Virtual GPUs only, unless `force`."""
    settings: Settings = request.app.state.settings
    now = time.time()
    attempt_id = inject_job_oom(db, job_id, now, virtual=settings.virtual_gpus is not None, force=body.force)
    audit.record(db, actor=admin, action="chaos.job.oom", target_kind="job", target_id=job_id,
                 after={"attempt": attempt_id, "force": body.force})  # fmt: skip
    db.commit()
    engine = request.app.state.engine
    if engine is not None:  # else the incidents loop sends the stop
        engine.stop(attempt_id, 0.0)
    return {"job": job_id, "attempt": attempt_id, "stopped": engine is not None}
