"""Where the server reaches a running workspace's JupyterLab.

Local engine: the Unix socket `jupyter.sock` in the attempt's rank-0 work dir
(`<home>/engine/attempts/<attempt>/work/0/`, `/job` inside the sandbox), 0600 and owned by the
job's uid: only the job and root (the server) can connect, whatever network namespace the job
has. A socket path is limited to 107 bytes; a longer one is reached through a directory fd
(`/proc/self/fd/<n>/jupyter.sock`), kept open while the attempt is looked up.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from corral.workspaces.launch import SOCKET_NAME

MAX_SOCKET_PATH = 100
_dir_fds: dict[str, int] = {}


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
