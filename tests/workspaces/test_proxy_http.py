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


def test_an_answer_carries_no_empty_allow_origin_and_no_second_server_header(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """JupyterLab answers a token-authenticated request (the proxy's) with
    `Access-Control-Allow-Origin: <the request's Origin>`, empty when it has none, and with its own
    `Server: TornadoServer`; both were passed on, so an answer through the proxy carried an empty
    allow-origin and two server headers (uvicorn adds its own to every answer)."""
    path = str(tmp_path / "jupyter.sock")
    head = (
        b"HTTP/1.1 200 OK\r\nServer: TornadoServer/6.5\r\nAccess-Control-Allow-Origin: \r\n"
        b"Access-Control-Allow-Credentials: true\r\nContent-Length: 2\r\n\r\nok"
    )

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(head)
        await writer.drain()
        writer.close()

    async def allowed(*_: Any) -> proxy.Decision:
        return proxy.Decision(200, upstream=Upstream(socket=path), token="t")

    monkeypatch.setattr(proxy, "authorize", allowed)
    app = FastAPI()
    app.include_router(proxy.router)

    async def get() -> httpx.Response:
        server = await asyncio.start_unix_server(answer, path)
        transport = httpx.ASGITransport(app=app)
        async with server, httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            return await asyncio.wait_for(client.get("/ws/5/api/contents"), 5)

    r = asyncio.run(get())
    assert r.status_code == 200 and r.text == "ok", r.text
    assert "access-control-allow-origin" not in r.headers, r.headers
    assert "server" not in r.headers, r.headers  # the serving uvicorn's is the one
    assert r.headers["access-control-allow-credentials"] == "true"
