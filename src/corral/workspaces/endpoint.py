"""Where the server reaches a running workspace's JupyterLab (`jupyter_upstream`).

Local engine: the Unix socket `jupyter.sock` in the attempt's rank-0 work dir
(`<home>/engine/attempts/<attempt>/work/0/`, `/job` inside the sandbox), 0600 and owned by the
job's uid: only the job and root (the server) can connect, whatever network namespace the job
has; and the server talks only to a socket served by the job's uid (`check_peer`). A socket
address is limited to 107 bytes; a longer path is reached through a directory fd
(`/proc/self/fd/<n>/jupyter.sock`) that is open only while one connection is made
(`reachable_path`, `open_unix_socket`). Everything else (the proxy's connection pools, its cached
decisions) knows the socket by its real path: an fd number kept for longer, and closed in bulk,
could be reused for another attempt's directory while a name made from it still stood for the
first, and a request would reach another user's JupyterLab.

Slurm engine: JupyterLab runs on a compute node and listens on that node's address and a free
port, with TLS under a certificate made at its start (corral.workspaces.launch,
`CORRAL_WORKSPACE_LISTEN=tcp`). The host is the node's address as Corral knows it (the Node row,
from Slurm's NodeAddr), never something the job says; the port and the certificate's SHA-256 come
from the job, from `jupyter.endpoint` in its rank-0 work dir on the shared storage (`<port>
<sha256>`), read like the job's logs (a plain file owned by the job's uid, no symlink followed:
only the job's own account can have written it) and accepted only as a port number >= 1024 and
64 hex digits. The server then talks to that port only over TLS pinned to that certificate
(corral.workspaces.labtls): a process of another user holding the port (JupyterLab not yet
listening, or gone while its job lives on) gets no request and no credential. The job owner can
point the file at another port of their own node, no further.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.engine.slurm.state import read_job_file
from corral.workspaces.labtls import FINGERPRINT
from corral.workspaces.launch import ENDPOINT_NAME, SOCKET_NAME

MAX_SOCKET_PATH = 100
MAX_ENDPOINT_BYTES = 128  # "<port> <64 hex digits>\n", with room to spare


class EndpointUnusable(ValueError):
    """The job's endpoint file is there but names no place the server may talk to."""


@dataclass(frozen=True, slots=True)
class Upstream:
    """A Unix socket path (local engine), or a node's host and port and the TLS certificate its
    JupyterLab answers with (Slurm)."""

    socket: str | None = None
    host: str = "localhost"
    port: int | None = None  # None with a socket
    fingerprint: str | None = None  # TCP: the SHA-256 of JupyterLab's certificate (labtls)

    @property
    def authority(self) -> str:
        """host[:port] for URLs: "localhost" over a socket."""
        if self.socket is not None:
            return "localhost"
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def jupyter_upstream(engine: Any, attempt_id: str, node_address: str | None) -> Upstream | None:
    """Where the attempt's JupyterLab listens; None when there is no such place (yet).
    EndpointUnusable (saying why) for a Slurm endpoint file that names no usable place."""
    if getattr(engine, "name", "") == "slurm":
        found = _slurm_endpoint(engine, attempt_id)
        if found is None or not node_address:
            return None
        return Upstream(host=node_address, port=found[0], fingerprint=found[1])
    socket = jupyter_socket(engine, attempt_id)
    return Upstream(socket=socket) if socket is not None else None


def _slurm_endpoint(engine: Any, attempt_id: str) -> tuple[int, str] | None:
    """(port, certificate fingerprint) from the job's endpoint file; None while it is not there
    (JupyterLab starting) or is not a plain file of the job's uid (a symlink, or written by
    anyone else: not the job's word)."""
    record = engine.store.load(attempt_id)
    if record is None or record.uid is None:
        return None
    path = engine.store.job_dir(attempt_id) / "work" / "0" / ENDPOINT_NAME
    try:
        data, _, _ = read_job_file(path, record.uid, limit=MAX_ENDPOINT_BYTES)
    except OSError:
        return None
    return parse_endpoint(data)


def parse_endpoint(data: bytes) -> tuple[int, str]:
    """(port, fingerprint) from an endpoint file's bytes; EndpointUnusable naming what is wrong."""
    fields = data.decode("ascii", "replace").split()
    if len(fields) == 1 and fields[0].isdigit():
        raise EndpointUnusable(
            "its JupyterLab gave a port without a TLS certificate (a launcher older than this "
            "server's): the server does not talk to it in clear text; restart the workspace"
        )
    if len(fields) != 2 or not fields[0].isdigit() or FINGERPRINT.fullmatch(fields[1]) is None:
        raise EndpointUnusable(
            f"its endpoint file says {data[:80]!r}, not '<port> <certificate sha256>': restart the workspace"
        )
    port = int(fields[0])
    if not 1024 <= port <= 65535:
        raise EndpointUnusable(f"its endpoint file names port {port}, outside 1024-65535")
    return port, fields[1]


def jupyter_socket(engine: Any, attempt_id: str) -> str | None:
    """The socket's path, or None when this engine has no such place (Slurm, none). May be too
    long for a socket address: connect through `reachable_path` / `open_unix_socket`."""
    attempts_dir = getattr(engine, "attempts_dir", None)
    if engine is None or getattr(engine, "name", "") != "local" or not isinstance(attempts_dir, Path):
        return None
    return str(attempts_dir / attempt_id / "work" / "0" / SOCKET_NAME)


@contextlib.contextmanager
def reachable_path(path: str) -> Iterator[str]:
    """`path` as a socket address for the `with`: itself, or when too long, the same socket through
    its directory's fd, which is open for the `with` only (its number is not reused meanwhile)."""
    if len(os.fsencode(path)) < MAX_SOCKET_PATH:
        yield path
        return
    directory, name = os.path.split(path)
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)


async def open_unix_socket(path: str) -> socket.socket:
    """A socket connected to the Unix socket at `path`, however long the path, and answered by
    the owner of the socket's directory (OSError if not: check_peer)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        with reachable_path(path) as address:
            await asyncio.get_running_loop().sock_connect(sock, address)
        check_peer(sock, path)
    except BaseException:
        sock.close()
        raise
    return sock


def check_peer(sock: socket.socket, path: str) -> None:
    """OSError unless the process listening on the connected `sock` runs as the owner of the
    socket's directory: the job's uid, which owns its work dir and so may put a symlink where its
    socket was, to any socket of the host (root's included); connect() follows it, as root. The
    peer's credentials are those of the socket actually reached, whatever the path named."""
    owner = os.lstat(os.path.dirname(path)).st_uid
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    if uid != owner:
        raise ConnectionRefusedError(
            errno.ECONNREFUSED,
            f"{path} is answered by uid {uid}, not by its job's ({owner}): not the job's JupyterLab",
        )
