"""The launcher: a small, long-lived fork server that starts supervisors.

Starting a supervisor as a fresh `python` costs ~10 ms of CPU (interpreter start-up) per job; on
a 2-core node that is a fifth of the budget for 50 jobs/s. The launcher pays it once: it has
the supervisor code imported and forks one child per attempt (about 1 ms). Each child starts a
new session and runs `Supervisor(attempt_dir).run()`, exactly what `python -c ...main()` would.

The launcher owns nothing: killing it (or never starting it) only means the engine starts
supervisors the slow way. Its children (the supervisors) are in their own sessions and reaped by
the kernel (SIGCHLD ignored), so they never need it again. So it lives only as long as the server
process that started it: it exits within half a second of that process' death (its parent pid
changes), and after IDLE_EXIT_S without a request; the next launch starts a new one. Protocol over the unix
socket `<home>/engine/launcher.sock`: the client sends an attempt dir, the launcher answers with
the supervisor's pid (ASCII) and closes.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback

from corral.engine.local.supervisor import Supervisor, _signal, write_json

MAX_REQUEST = 4096
IDLE_EXIT_S = 300.0


def _run_child(attempt_dir: str) -> None:
    """In the forked child: become a detached supervisor. Never returns."""
    code = 0
    try:
        os.setsid()
        _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)  # the supervisor waits for its children
        _signal.signal(_signal.SIGTERM, _signal.SIG_DFL)
        fd = os.open(
            os.path.join(attempt_dir, "supervisor.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640
        )
        os.dup2(fd, 2)
        os.close(fd)
        Supervisor(attempt_dir).run()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def serve(sock_path: str) -> None:
    import ctypes  # noqa: F401 - preloaded for the supervisors' become_subreaper()

    os.chdir("/")
    parent = os.getppid()
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # children are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        os.unlink(sock_path)
    except FileNotFoundError:
        pass
    server.bind(sock_path)
    os.chmod(sock_path, 0o600)
    server.listen(128)
    server.settimeout(0.5)
    write_json(sock_path + ".json", {"pid": os.getpid()})
    idle_since = time.monotonic()
    while True:
        try:
            conn, _ = server.accept()
        except TimeoutError:
            if os.getppid() != parent or time.monotonic() - idle_since > IDLE_EXIT_S:
                return  # the server that started us is gone, or nobody needs us
            continue
        idle_since = time.monotonic()
        try:
            conn.settimeout(2.0)
            _handle(server, conn)
        except OSError as exc:
            print(f"corral launcher: {exc}", file=sys.stderr, flush=True)
        finally:
            conn.close()


def _handle(server: socket.socket, conn: socket.socket) -> None:
    attempt_dir = os.path.realpath(conn.recv(MAX_REQUEST).decode())
    # Only attempt dirs of this engine home: the socket is root's and 0600, and this keeps even
    # a confused client from pointing the launcher at a spec planted elsewhere.
    attempts = os.path.join(os.path.dirname(os.path.realpath(server.getsockname())), "attempts")
    if os.path.dirname(attempt_dir) != attempts or not os.path.isfile(
        os.path.join(attempt_dir, "spec.marshal")
    ):
        conn.sendall(f"error: {attempt_dir} is not an attempt dir of {attempts}".encode())
        return
    pid = os.fork()
    if pid == 0:
        server.close()
        conn.close()
        _run_child(attempt_dir)
    conn.sendall(str(pid).encode())


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: launcher <socket path>")
    serve(sys.argv[1])
