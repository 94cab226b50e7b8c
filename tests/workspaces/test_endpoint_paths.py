"""Workspace sockets whose path is too long for a socket address (corral.workspaces.endpoint):
reached through a directory fd that is open for one connection only, and known everywhere else by
the real path. A long-lived fd closed in bulk (the earlier design) had its number reused for
another attempt's directory while the proxy's pool of kept-alive connections still stood under
the name made from it: a request for one workspace went to another user's JupyterLab."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from corral.workspaces import proxy, upstream
from corral.workspaces.endpoint import MAX_SOCKET_PATH, jupyter_upstream


def attempt_dir(root: Path, attempt: str) -> Path:
    work = root / attempt / "work" / "0"
    work.mkdir(parents=True)
    return work


async def serve(work: Path, name: str) -> asyncio.AbstractServer:
    """An HTTP server on <work>/jupyter.sock answering every request with `name`."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            body = name.encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = os.open(work, os.O_PATH | os.O_DIRECTORY)  # the path is too long to bind by name
    try:
        sock.bind(f"/proc/self/fd/{fd}/jupyter.sock")
    finally:
        os.close(fd)
    return await asyncio.start_unix_server(answer, sock=sock)


async def ask(upstream: object) -> str:
    response = await proxy._pool(upstream).request("GET", "/", [("host", "localhost")])  # type: ignore[arg-type]
    body = await response.read()
    await response.aclose()  # the connection goes back to the pool, kept alive
    return body.decode()


def open_dirs_under(root: Path) -> list[str]:
    """What this process has open below `root` (the directory fds a long path is reached by)."""
    targets = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            targets.append(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            continue
    return [t for t in targets if t.startswith(str(root))]


def test_long_socket_paths_reach_their_own_jupyterlab_and_keep_no_fd(tmp_path: Path) -> None:
    root = tmp_path / ("long-home-" + "x" * 80) / "engine" / "attempts"
    engine = SimpleNamespace(name="local", attempts_dir=root)
    a, b = attempt_dir(root, "1.1"), attempt_dir(root, "2.1")
    assert len(os.fsencode(str(a / "jupyter.sock"))) >= MAX_SOCKET_PATH

    async def scenario() -> list[str]:
        servers = [await serve(a, "alice's"), await serve(b, "bob's")]
        answers = [await ask(jupyter_upstream(engine, "1.1", None))]
        for i in range(256):  # other workspaces' attempts looked up meanwhile (the old bulk close: 257)
            attempt_dir(root, f"{100 + i}.1")
            jupyter_upstream(engine, f"{100 + i}.1", None)
        answers.append(await ask(jupyter_upstream(engine, "2.1", None)))
        answers.append(await ask(jupyter_upstream(engine, "1.1", None)))
        answers.append(f"{len(open_dirs_under(root))} directories open")
        for pool in list(proxy._pools.values()):
            await pool.aclose()
        proxy._pools.clear()
        for server in servers:
            server.close()
        return answers

    assert asyncio.run(scenario()) == ["alice's", "bob's", "alice's", "0 directories open"]


def test_an_upstream_that_takes_no_connection_fails_after_the_connect_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A workspace's node that went dead (its port never answers the handshake; TCP's own retries
    last about two minutes) fails the request with a reason after CONNECT_TIMEOUT_S."""
    monkeypatch.setattr(upstream, "CONNECT_TIMEOUT_S", 0.3)
    attempts: list[tuple[str, int]] = []

    async def never_connects(host: str, port: int, **kwargs: object) -> None:
        attempts.append((host, port))
        await asyncio.sleep(3600)

    monkeypatch.setattr(upstream.asyncio, "open_connection", never_connects)

    async def request() -> str:
        try:
            pool = upstream.HttpPool(None, "node7", 8888, fingerprint="0" * 64)
            await pool.request("GET", "/", [("host", "node7")])
        except upstream.UpstreamError as exc:
            return str(exc)
        return "answered"

    assert asyncio.run(asyncio.wait_for(request(), 5)) == "no connection within 0.3 s"
    assert attempts == [("node7", 8888)]
