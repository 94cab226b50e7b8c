"""The idle policy's reading of JupyterLab activity (corral.workspaces.activity) against Tornado
on a Unix socket standing in for the workspaces' JupyterLabs; the database lookups are stubbed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
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


def test_hung_jupyterlabs_are_asked_at_once_so_a_pass_takes_about_one_timeout(
    jupyters: str, tmp_path: Path, monkeypatch: Any
) -> None:
    """Eight JupyterLabs that take the connection and never answer (listening sockets nobody
    accepts on) and one that answers: the pass waits about one timeout, not eight in turn (30
    hung labs made one idle pass take a minute), and the answering one still counts."""
    hung = []
    for ws in range(20, 28):
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(tmp_path / f"hung{ws}.sock"))
        listener.listen(4)
        hung.append(listener)
    sockets = {13: jupyters} | {10 + ws: str(tmp_path / f"hung{ws}.sock") for ws in range(20, 28)}
    monkeypatch.setattr(activity, "TIMEOUT_S", 1.0)
    monkeypatch.setattr(activity, "workspace_job_ids", lambda session: {job: job - 10 for job in sockets})
    target = lambda session, ws: ProxyTarget(ws, 1, 10 + ws, f"{10 + ws}.1", "t")  # noqa: E731
    monkeypatch.setattr(activity, "proxy_target", target)
    upstream = lambda engine, attempt, node: Upstream(socket=sockets[int(attempt.split(".")[0])])  # noqa: E731
    monkeypatch.setattr(activity, "jupyter_upstream", upstream)
    factory: Any = lambda: contextlib.nullcontext(None)  # noqa: E731
    try:
        began = time.monotonic()
        found = activity.last_activity(factory, None, list(sockets), now=1e10)
        took = time.monotonic() - began
    finally:
        for listener in hung:
            listener.close()
    assert found == {13: 1767323045.0}
    # in turn: 8 s at least; at once: one timeout and the clients' set-up (about 1.5 s here)
    assert took < 4.0, f"{took:.1f} s: the hung JupyterLabs were asked in turn"
