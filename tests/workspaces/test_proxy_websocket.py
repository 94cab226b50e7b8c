"""The proxy's WebSocket side (corral.workspaces.proxy) against a real `websockets` server on a
Unix socket standing in for JupyterLab; the authorization decision is stubbed (the API tests and
tests/web/test_workspaces.py cover it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from websockets.asyncio.server import ServerConnection

from corral.workspaces import proxy
from corral.workspaces.endpoint import Upstream
from tests.workspaces.unix_ws import serve_on_unix


@pytest.fixture
def jupyter(tmp_path: Path) -> Iterator[str]:
    """A WebSocket server on a Unix socket that answers each connection with the request
    target it was asked for."""
    yield from _jupyter(tmp_path, keep_open=False)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[str]:
    """The same, then echoing what it is sent until the other side closes (a kernel's channels)."""
    yield from _jupyter(tmp_path, keep_open=True)


def _jupyter(tmp_path: Path, keep_open: bool) -> Iterator[str]:
    async def answer(connection: ServerConnection) -> None:
        await connection.send(connection.request.path if connection.request else "")
        if keep_open:
            async for message in connection:
                await connection.send(message)

    yield from serve_on_unix(str(tmp_path / "jupyter.sock"), answer)


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


def test_a_kernel_websocket_ends_when_its_holder_loses_access(kernel: str, monkeypatch: Any) -> None:
    """The proxy registers each WebSocket under the credential that let it in; ending that holder
    (what OpenSessions.check does for a revoked token) closes the browser's side, while another
    holder's WebSocket stays open."""
    from starlette.websockets import WebSocketDisconnect

    from corral.services.open_sessions import Holder, OpenSessions

    async def allowed(_app: Any, _headers: Any, _cookies: Any, ws_id: int, *_: Any) -> proxy.Decision:
        holder = Holder("alice" if ws_id == 5 else "bob", f"token:{ws_id}")
        return proxy.Decision(200, upstream=Upstream(socket=kernel), token="t", holder=holder)

    monkeypatch.setattr(proxy, "authorize", allowed)
    app = FastAPI()
    app.include_router(proxy.router)
    sessions = OpenSessions()
    app.state.open_sessions = sessions
    origin = {"origin": "http://testserver"}
    with TestClient(app) as client:
        with (
            client.websocket_connect("/ws/5/api/kernels/k1/channels", headers=origin) as mine,
            client.websocket_connect("/ws/6/api/kernels/k2/channels", headers=origin) as other,
        ):
            assert mine.receive_text() == "/ws/5/api/kernels/k1/channels"
            assert other.receive_text() == "/ws/6/api/kernels/k2/channels"
            assert sessions.holders() == {Holder("alice", "token:5"), Holder("bob", "token:6")}
            assert sessions.end([Holder("alice", "token:5")]) == 1
            with pytest.raises(WebSocketDisconnect):
                mine.receive_text()
            assert sessions.holders() == {Holder("bob", "token:6")}
            other.send_text("still here")  # the other holder's WebSocket is untouched
            assert other.receive_text() == "still here"
        assert sessions.holders() == set()  # each one discarded when it closed
