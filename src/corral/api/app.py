"""The FastAPI application factory. No background work here: the server process (corral.server)
runs migrations, bootstraps the admin and starts the control loops around this app.

State the routers read:
- `app.state.settings`: Settings
- `app.state.db_engine` / `app.state.session_factory`: the database
- `app.state.engine`: the execution engine (corral.engine.base.Engine) or None (pure API tests);
  the server may set it after startup. Endpoints that need it answer 503 while it is None.
- `app.state.notifier`: told what the services committed (corral.services.notify); the app's
  sessions carry it. The server passes its loop waker; by default nobody is told.
"""

from __future__ import annotations

import asyncio
import importlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio.to_thread
import sqlalchemy as sa
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from corral import __version__
from corral.api import conformance, limits, pattern_words
from corral.api.metrics_auth import MetricsGuard, metrics_token
from corral.config import Settings
from corral.db.session import make_engine, make_session_factory
from corral.engine.base import Engine
from corral.monitor.middleware import install as install_request_metrics
from corral.services.errors import Invalid, ServiceError
from corral.services.lifecycle import InvalidTransition
from corral.services.notify import NO_NOTIFIER, Notifier
from corral.services.notify import bind as bind_notifier

API_PREFIX = "/api/v1"
API_ROUTER_MODULES = (
    "auth",
    "jobs",
    "nodes",
    "groups",
    "users",
    "tokens",
    "cluster",
    "usage",
    "storage",
    "audit",
    "secrets",
    "datasets",
    "exec",
    "environments",
    "templates",  # job templates (corral.catalog)
    "models",  # the model registry (corral.catalog)
    "oncall",
    "workspaces",
    "incidents",
    "sim_export",  # GET /admin/sim-export: job history as a simulator trace
)
ROOT_ROUTER_MODULES = ("health",)  # not under /api/v1: /healthz, /readyz
# Other areas' routers, imported by module name so that they can grow without touching this file.
# A module may also export FRONT_MIDDLEWARE, an ASGI middleware run before the API's own.
EXTERNAL_ROUTERS = (
    "corral.monitor.api",
    "corral.monitor.risk",
    "corral.monitor.runbooks",
    "corral.workspaces.proxy",  # /ws/<id>/: JupyterLab of a workspace (before the portal's catch-all)
    "corral.web.routes",
)


def create_app(
    settings: Settings,
    *,
    engine: Engine | None = None,
    db_engine: sa.Engine | None = None,
    notifier: Notifier = NO_NOTIFIER,
) -> FastAPI:
    """Build the app. `engine` is the execution engine (None: logs answer 503); `db_engine` is the
    database (default: made from settings.db_url; the schema must already be migrated: init_db);
    `notifier` is told each change the app's services commit (the server wakes its loops)."""
    app = FastAPI(
        lifespan=partial(_process_setup, threads=settings.worker_threads),
        title="Corral",
        version=__version__,
        description="Queue, schedule, run and observe deep-learning jobs on a shared GPU cluster.",
        docs_url="/docs",
        openapi_url="/openapi.json",
    )
    db = db_engine if db_engine is not None else make_engine(settings.db_url)
    app.state.settings = settings
    app.state.db_engine = db
    app.state.session_factory = make_session_factory(db)
    app.state.engine = engine
    app.state.notifier = notifier
    bind_notifier(app.state.session_factory, notifier)
    for name in API_ROUTER_MODULES:
        module = importlib.import_module(f"corral.api.routers.{name}")
        app.include_router(module.router, prefix=API_PREFIX)
    for name in ROOT_ROUTER_MODULES:
        app.include_router(importlib.import_module(f"corral.api.routers.{name}").router)
    front_doors = []  # an external module's own middleware, e.g. the workspace proxy's
    for module_name in EXTERNAL_ROUTERS:
        module = importlib.import_module(module_name)
        app.include_router(module.router)
        if getattr(module, "FRONT_MIDDLEWARE", None) is not None:
            front_doors.append(module.FRONT_MIDDLEWARE)
    _install_error_handlers(app)
    # Every route's errors, links and 405s documented and answered alike (new routers included).
    conformance.install(app, settings)
    app.add_middleware(ConcurrencyLimit, limit=settings.api_max_concurrency)
    # Outside the concurrency limit: a slow or oversized upload never holds an admission slot.
    limits.install(app, settings)
    metrics_token(settings)  # an unreadable token file refuses start-up, not the first scrape
    app.add_middleware(MetricsGuard, settings=settings)
    # An external module's own front door (the workspace proxy: /ws/<id>/ past the limits and
    # the router), inside the request metrics.
    for front in front_doors:
        app.add_middleware(front)
    # Monitoring's request metrics, outermost so that they include waiting for admission.
    install_request_metrics(app)
    if settings.ssl_certfile is not None:  # Corral serves TLS itself (a proxy in front sends its own)
        app.add_middleware(StrictTransportSecurity)
    return app


HSTS = (b"strict-transport-security", b"max-age=31536000")  # a year; no includeSubDomains: not ours


class StrictTransportSecurity:
    """Every https answer, of both listeners, tells browsers to reach this host by https only:
    else an attacker on the network path could answer a plain-http request for it and set
    cookies there (the workspace origin's `__Host-` ones excepted; docs/security.md)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("scheme") != "https":
            await self.app(scope, receive, send)
            return

        async def send_with_hsts(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), HSTS]}
            await send(message)

        await self.app(scope, receive, send_with_hsts)


@asynccontextmanager
async def _process_setup(_app: FastAPI, *, threads: int) -> AsyncIterator[None]:
    """At start-up: run blocking work (sync endpoints) on `threads` worker threads instead of
    anyio's 40. (The server process also tunes the garbage collector: corral.server.run.tune_gc;
    not here, because tests build many apps in one process.)"""
    anyio.to_thread.current_default_thread_limiter().total_tokens = threads
    # Built now rather than by the first request's middleware (conformance.LiteralPaths): it
    # walks every route's effective context, ~0.1 s of CPU that the first submissions waited for.
    conformance.literal_paths(_app)
    yield


class ConcurrencyLimit:
    """Lets at most `limit` requests in at once; the rest wait on the event loop holding nothing.

    Why: a sync endpoint hops between worker threads (dependencies, handler, response
    validation) while its DB session may hold a pooled connection. Under a burst, every thread
    can end up waiting for a connection held by a request that waits for a thread: a deadlock.
    Admitting fewer requests than there are threads and connections makes that impossible."""

    def __init__(self, app: Any, limit: int) -> None:
        self.app = app
        self.limit = limit
        self._semaphore: asyncio.Semaphore | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._semaphore is None:  # created lazily: it must belong to the server's event loop
            self._semaphore = asyncio.Semaphore(self.limit)
        async with self._semaphore:
            await self.app(scope, receive, send)


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ServiceError)
    async def service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        retry_after = getattr(exc, "retry_after_s", None)  # 429s say when to come back
        if retry_after is not None:
            headers = {"Retry-After": str(retry_after)}
        detail: Any = exc.message
        if isinstance(exc, Invalid):
            detail = [{"loc": list(loc), "msg": message, "type": "value_error"} for loc, message in exc.items]
        return JSONResponse({"detail": detail}, status_code=exc.status_code, headers=headers)

    @app.exception_handler(InvalidTransition)
    async def invalid_transition(_request: Request, exc: InvalidTransition) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(RecursionError)
    async def too_deep(_request: Request, _exc: RecursionError) -> JSONResponse:
        # The last line of defence behind corral.api.limits' bracket count: a parser (PyYAML's
        # block style, say) that recursed past Python's limit on a deeply nested body.
        return JSONResponse(
            {"detail": "the request body is nested too deeply to parse (limit: CORRAL_API_MAX_JSON_DEPTH)"},
            status_code=400,
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": plain_errors(exc.errors())}, status_code=422)

    @app.exception_handler(sa.exc.DataError)
    async def nul_in_text(request: Request, exc: sa.exc.DataError) -> JSONResponse:
        # PostgreSQL stores no NUL in text (psycopg refuses it before sending), SQLite does: a
        # NUL in a free-text field (a description, a token's or key's name, a quota's GPU model,
        # an email) was a 500 on PostgreSQL only. The statement's parameters name the column.
        if "NUL" not in str(exc.orig):
            raise exc
        rows = exc.params if isinstance(exc.params, (list, tuple)) else [exc.params]
        names = sorted(
            {
                re.sub(r"_\d+$", "", k)
                for row in rows
                if isinstance(row, dict)
                for k, v in row.items()
                if _has_nul(v)
            }
        )
        what = f"{', '.join(repr(n) for n in names)} holds" if names else "a value holds"
        where = "body" if request.method in ("POST", "PUT", "PATCH") else "query"
        msg = f"{what} a NUL character (\\x00), which the database cannot store or search for"
        return JSONResponse(
            {"detail": [{"loc": [where], "msg": msg, "type": "value_error"}]}, status_code=422
        )


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, (list, tuple)):
        return any(_has_nul(v) for v in value)
    return False


def plain_errors(errors: Any) -> list[dict[str, Any]]:
    """Pydantic errors as `{loc, msg, type}` with plain sentences (no "Value error, " prefix)."""
    out: list[dict[str, Any]] = []
    for err in errors:
        loc = list(err.get("loc", ()))
        msg = str(err.get("msg", "invalid value"))
        kind = str(err.get("type", "value_error"))
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        if kind == "extra_forbidden" and loc:
            msg = f"unknown field {loc[-1]!r}; check its spelling"  # (any body: not only a job spec)
        elif kind == "missing" and loc and loc[-1] == "tasks":  # a job spec: its other form too
            msg = "the field 'tasks' is required (or, for a job of one task, 'command' at the top level)"
        elif kind == "missing" and loc:
            msg = f"the field {loc[-1]!r} is required"
        elif kind == "string_pattern_mismatch" and loc[:1] == ["body"] and _has_nul(err.get("input")):
            # the NUL is what is wrong, said as RequestBody's own check says it (a field's pattern
            # that leaves NUL out, as the email's, says so in the schema and is checked first)
            msg = f"{loc[-1]!r} holds a NUL character (\\x00), which the database cannot store"
        elif kind == "string_pattern_mismatch" and loc:
            pattern = (err.get("ctx") or {}).get("pattern", "")
            words = pattern_words.WORDS.get(pattern, f"does not match pattern {pattern}")
            msg = f"{_where(loc)} {err.get('input')!r} {words}"
        elif kind in ("string_too_short", "too_short") and loc and not err.get("input"):
            msg = f"{_where(loc)} is empty"
        out.append({"loc": loc, "msg": msg, "type": kind})
    return out


def _where(loc: list[Any]) -> str:
    """("path", "name") -> "path parameter 'name'"; ("body", "value") -> "field 'value'"."""
    if loc[0] in ("path", "query") and len(loc) > 1:
        return f"{loc[0]} parameter {loc[-1]!r}"
    return f"field {loc[-1]!r}"
