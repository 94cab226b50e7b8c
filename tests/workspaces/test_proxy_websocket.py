"""The proxy's WebSocket side (corral.workspaces.proxy) against a real `websockets` server on a
Unix socket standing in for JupyterLab; the authorization decision is stubbed (the API tests and
tests/web/test_workspaces.py cover it)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from websockets.asyncio.server import ServerConnection, unix_serve

from corral.workspaces import proxy
from corral.workspaces.endpoint import Upstream


@pytest.fixture
def jupyter(tmp_path: Path) -> Iterator[str]:
    """A WebSocket server on a Unix socket that answers each connection with the request
    target it was asked for."""
    sock = str(tmp_path / "jupyter.sock")
    loop = asyncio.new_event_loop()
    ready, stop = threading.Event(), asyncio.Event()

    async def answer(connection: ServerConnection) -> None:
        await connection.send(connection.request.path if connection.request else "")

    async def serve() -> None:
        async with unix_serve(answer, sock):
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield sock
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def test_the_upstream_gets_the_path_as_the_browser_sent_it(jupyter: str, monkeypatch: Any) -> None:
    """Percent-escapes stay escaped, as for HTTP (raw_path): the decoded path turned `%3F` into
    the start of a query and `%23` into a fragment (a refused URI, the handler failing)."""

    async def allowed(*_: Any) -> proxy.Decision:
        return proxy.Decision(200, upstream=Upstream(socket=jupyter), token="t")

    monkeypatch.setattr(proxy, "authorize", allowed)
    app = FastAPI()
    app.include_router(proxy.router)
    origin = {"origin": "http://testserver"}
    with TestClient(app) as client:
        for path in ("api/kernels/k1/channels", "api/x%3Fy/z", "api/a%23b", "files/a%20b/c%2Fd"):
            with client.websocket_connect(f"/ws/5/{path}?session_id=s", headers=origin) as ws:
                assert ws.receive_text() == f"/ws/5/{path}?session_id=s"
