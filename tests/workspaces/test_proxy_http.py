"""The proxy's HTTP side (corral.workspaces.proxy) against upstreams that misbehave; the
authorization decision is stubbed as in test_proxy_websocket.py."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
from fastapi import FastAPI

from corral.workspaces import proxy, upstream
from corral.workspaces.endpoint import Upstream


def test_an_upstream_that_accepts_and_never_answers_gets_504_naming_the_workspace(
    tmp_path: Path, monkeypatch: Any
) -> None:
    # A listening socket nobody accepts on: the kernel completes the connect and takes the
    # request's bytes, and no answer ever comes (a JupyterLab stuck in a blocking call).
    path = str(tmp_path / "jupyter.sock")
    hung = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    hung.bind(path)
    hung.listen(16)

    async def allowed(*_: Any) -> proxy.Decision:
        return proxy.Decision(200, upstream=Upstream(socket=path), token="t")

    monkeypatch.setattr(proxy, "authorize", allowed)
    monkeypatch.setattr(upstream, "RESPONSE_HEADERS_TIMEOUT_S", 0.5, raising=False)
    app = FastAPI()
    app.include_router(proxy.router)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            # Without the timeout the request never ends: fail in 5 s instead of hanging.
            return await asyncio.wait_for(client.get("/ws/5/api/contents"), 5)

    try:
        r = asyncio.run(get())
    finally:
        hung.close()
    assert r.status_code == 504, r.text
    assert r.json()["detail"] == "workspace 5's JupyterLab does not answer (no response headers within 0.5 s)"
