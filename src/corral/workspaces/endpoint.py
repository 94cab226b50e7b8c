"""Where the server reaches a running workspace's JupyterLab (`jupyter_upstream`).

Local engine: the Unix socket `jupyter.sock` in the attempt's rank-0 work dir
(`<home>/engine/attempts/<attempt>/work/0/`, `/job` inside the sandbox), 0600 and owned by the
job's uid: only the job and root (the server) can connect, whatever network namespace the job
has. A socket path is limited to 107 bytes; a longer one is reached through a directory fd
(`/proc/self/fd/<n>/jupyter.sock`), kept open while the attempt is looked up.

Slurm engine: JupyterLab runs on a compute node and listens on that node's address and a free
port (corral.workspaces.launch, `CORRAL_WORKSPACE_LISTEN=tcp`). The host is the node's address as
Corral knows it (the Node row, from Slurm's NodeAddr), never something the job says; only the
port comes from the job, from `jupyter.endpoint` in its rank-0 work dir on the shared storage,
read like the job's logs (a plain file owned by the job's uid, no symlink followed) and accepted
only as a port number >= 1024. The job owner can point it at another port of their own node, no
further: the proxy sends that port only the owner's own per-start credential.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.engine.slurm.state import read_job_file
from corral.workspaces.launch import ENDPOINT_NAME, SOCKET_NAME

MAX_SOCKET_PATH = 100
_dir_fds: dict[str, int] = {}


@dataclass(frozen=True, slots=True)
class Upstream:
    """A Unix socket path (local engine), or a node's host and port (Slurm)."""

    socket: str | None = None
    host: str = "localhost"
    port: int | None = None  # None with a socket

    @property
    def authority(self) -> str:
        """host[:port] for URLs: "localhost" over a socket."""
        if self.socket is not None:
            return "localhost"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def jupyter_upstream(engine: Any, attempt_id: str, node_address: str | None) -> Upstream | None:
    """Where the attempt's JupyterLab listens; None when there is no such place (yet)."""
    if getattr(engine, "name", "") == "slurm":
        port = _slurm_port(engine, attempt_id)
        return Upstream(host=node_address, port=port) if port is not None and node_address else None
    socket = jupyter_socket(engine, attempt_id)
    return Upstream(socket=socket) if socket is not None else None


def _slurm_port(engine: Any, attempt_id: str) -> int | None:
    record = engine.store.load(attempt_id)
    if record is None or record.uid is None:
        return None
    path = engine.store.job_dir(attempt_id) / "work" / "0" / ENDPOINT_NAME
    try:
        data, _, _ = read_job_file(path, record.uid, limit=16)
        port = int(data.decode().strip())
    except (OSError, ValueError):  # not written yet (JupyterLab starting), or not a number
        return None
    return port if 1024 <= port <= 65535 else None


def jupyter_socket(engine: Any, attempt_id: str) -> str | None:
    """The socket path to connect to, or None when this engine has no such place (Slurm, none)."""
    attempts_dir = getattr(engine, "attempts_dir", None)
    if engine is None or getattr(engine, "name", "") != "local" or not isinstance(attempts_dir, Path):
        return None
    work_dir = attempts_dir / attempt_id / "work" / "0"
    path = str(work_dir / SOCKET_NAME)
    if len(os.fsencode(path)) < MAX_SOCKET_PATH:
        return path
    return f"/proc/self/fd/{_dir_fd(str(work_dir))}/{SOCKET_NAME}"


def _dir_fd(directory: str) -> int:
    fd = _dir_fds.get(directory)
    if fd is not None:
        try:
            os.fstat(fd)
            return fd
        except OSError:
            _dir_fds.pop(directory, None)
    if len(_dir_fds) > 256:  # ended attempts: close them all, reopening is cheap
        for old in _dir_fds.values():
            os.close(old)
        _dir_fds.clear()
    fd = _dir_fds[directory] = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    return fd
