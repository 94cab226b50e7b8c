"""The proxy connects (as root) only to a JupyterLab run by the workspace job's own uid
(corral.workspaces.endpoint.check_peer): the job owns the dir its socket lies in and may put a
symlink there instead, naming any socket of the host, which connect() would follow."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from pathlib import Path

import pytest

from corral.workspaces import activity
from corral.workspaces.endpoint import Upstream, open_unix_socket

JOB_UID = 300_123

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a job's uid other than ours: needs root")


def job_work_dir(tmp_path: Path) -> Path:
    work = tmp_path / "attempts" / "1.1" / "work" / "0"
    work.mkdir(parents=True)
    os.chown(work, JOB_UID, JOB_UID)  # as the local engine leaves it for a sandboxed job
    return work


def listen_as(uid: int, path: Path) -> int:
    """A child process listening on `path` as `uid` (it binds as root, then drops to `uid` before
    listen(): the credentials a client's SO_PEERCRED reads); it serves one connection."""
    ready_r, ready_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(str(path))
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            server.listen(1)
            os.write(ready_w, b"x")
            conn, _ = server.accept()
            conn.recv(1)
        finally:
            os._exit(0)
    os.close(ready_w)
    assert os.read(ready_r, 1) == b"x"
    os.close(ready_r)
    return pid


def test_a_symlink_in_place_of_the_socket_reaches_no_socket_of_roots(tmp_path: Path) -> None:
    work = job_work_dir(tmp_path)
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # e.g. a root daemon's HTTP socket
    host.bind(str(tmp_path / "root-daemon.sock"))
    host.listen(1)
    (work / "jupyter.sock").symlink_to(tmp_path / "root-daemon.sock")  # what the job can do
    try:
        with pytest.raises(OSError, match="not by its job's"):
            asyncio.run(open_unix_socket(str(work / "jupyter.sock")))
    finally:
        host.close()


def test_the_jobs_own_jupyterlab_is_reached(tmp_path: Path) -> None:
    work = job_work_dir(tmp_path)
    pid = listen_as(JOB_UID, work / "jupyter.sock")
    try:
        sock = asyncio.run(open_unix_socket(str(work / "jupyter.sock")))
        sock.sendall(b"x")
        sock.close()
    finally:
        os.waitpid(pid, 0)


def test_the_idle_check_sends_no_request_through_a_symlink_to_roots_socket(tmp_path: Path) -> None:
    """The idle policy's JupyterLab activity check (corral.workspaces.activity) connects as root
    too: through a symlink the job put in place of its socket, root's own HTTP socket would get
    the request (and the workspace's credential). It is refused before anything is sent."""
    work = job_work_dir(tmp_path)
    host = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # e.g. a root daemon's HTTP socket
    host.bind(str(tmp_path / "root-daemon.sock"))
    host.listen(1)
    host.settimeout(5)
    (work / "jupyter.sock").symlink_to(tmp_path / "root-daemon.sock")
    received: list[bytes] = []

    def serve() -> None:
        with contextlib.suppress(OSError):
            conn, _ = host.accept()
            with conn:
                conn.settimeout(2)
                while request := conn.recv(4096):  # answers what it is asked, as a daemon would
                    received.append(request)
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n[]")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        upstream = Upstream(socket=str(work / "jupyter.sock"))
        with pytest.raises(OSError, match="not by its job's"):
            activity.jupyter_last_activity(upstream, "/ws/1/", "the-workspace-credential", now=1e10)
    finally:
        thread.join(10)
        host.close()
    assert received == [], f"root's socket was sent {received!r}"
