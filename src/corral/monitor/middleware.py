"""API request latency and error metrics, as a plain ASGI middleware (no per-request task or body
buffering, unlike BaseHTTPMiddleware). Install once in the app factory: `install(app)`."""

from __future__ import annotations

import time
from typing import Any

from fastapi import FastAPI
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral.monitor.metrics import API_ERRORS_TOTAL, API_REQUEST_SECONDS, API_REQUESTS_TOTAL

UNMATCHED_ROUTE = "(unmatched)"  # 404s keep one label value, not one per scanned URL


class MetricsMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500
        method = str(scope.get("method", "GET"))

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception:
            status = 500
            raise
        finally:
            route = route_template(scope)
            API_REQUEST_SECONDS.labels(method, route).observe(time.perf_counter() - started)
            API_REQUESTS_TOTAL.labels(method, route, str(status)).inc()
            if status >= 500:
                API_ERRORS_TOTAL.labels(method, route, str(status)).inc()


def route_template(scope: Scope) -> str:
    """The matched route's path template (`/api/v1/jobs/{job_id}`), so label values stay few."""
    route: Any = scope.get("route")
    if route is not None and getattr(route, "path", None):
        return str(route.path)
    app = scope.get("app")
    router = getattr(app, "router", None)
    for candidate in getattr(router, "routes", ()):
        match, _ = candidate.matches(scope)
        if match is Match.FULL:
            return str(getattr(candidate, "path", UNMATCHED_ROUTE))
    return UNMATCHED_ROUTE


def install(app: FastAPI) -> None:
    """Add the metrics middleware to `app` (idempotent)."""
    if getattr(app.state, "corral_metrics_middleware", False):
        return
    app.add_middleware(MetricsMiddleware)
    app.state.corral_metrics_middleware = True
