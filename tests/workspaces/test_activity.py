"""The idle policy's reading of JupyterLab activity (corral.workspaces.activity) against Tornado
on a Unix socket standing in for the workspaces' JupyterLabs; the database lookups are stubbed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web

from corral.services.workspaces import ProxyTarget
from corral.workspaces import activity
from corral.workspaces.endpoint import Upstream

ANSWERS = {
    # What the workspace owner's own process on the socket may answer: it is theirs to run.
    1: {"kernels": {"message": "not a list"}, "terminals": []},
    2: {"kernels": [7, "x"], "terminals": []},
    3: {"kernels": [{"execution_state": "idle", "last_activity": "2026-01-02T03:04:05Z"}], "terminals": []},
}


class Listing(tornado.web.RequestHandler):
    def get(self, ws: str, kind: str) -> None:
        self.write(json.dumps(ANSWERS[int(ws)][kind]))


@pytest.fixture
def jupyters(tmp_path: Path) -> Iterator[str]:
    sock = str(tmp_path / "jupyter.sock")
    loop = asyncio.new_event_loop()
    ready = threading.Event()

    def serve() -> None:
        asyncio.set_event_loop(loop)
        app = tornado.web.Application([(r"/ws/([0-9]+)/api/(kernels|terminals)", Listing)])
        server = tornado.httpserver.HTTPServer(app)
        server.add_socket(tornado.netutil.bind_unix_socket(sock))
        ready.set()
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    yield sock
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def test_an_answer_that_is_not_a_kernel_list_is_no_evidence_for_that_workspace_alone(
    jupyters: str, monkeypatch: Any
) -> None:
    """A workspace's JupyterLab answering JSON of another shape (the owner runs what listens on
    the socket) gives no reading for it; it used to raise AttributeError out of last_activity,
    which failed the whole idle pass: no workspace anywhere was reclaimed while it answered so."""
    monkeypatch.setattr(activity, "workspace_job_ids", lambda session: {10 + ws: ws for ws in ANSWERS})
    target = lambda session, ws: ProxyTarget(ws, 1, 10 + ws, f"{10 + ws}.1", "t")  # noqa: E731
    monkeypatch.setattr(activity, "proxy_target", target)
    monkeypatch.setattr(activity, "jupyter_upstream", lambda engine, attempt, node: Upstream(socket=jupyters))
    factory: Any = lambda: contextlib.nullcontext(None)  # noqa: E731
    found = activity.last_activity(factory, None, [11, 12, 13], now=1e10)
    assert found == {13: 1767323045.0}
