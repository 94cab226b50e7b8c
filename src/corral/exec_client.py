"""The client side of the exec WebSocket (corral.api.routers.exec): one session = one process
inside a running job's sandbox, or one TCP relay into its network. Synchronous (the SDK and the
CLI are), on `websockets`' sync client; the protocol is in the router's docstring."""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

STDIN, STDOUT, STDERR = 0, 1, 2


class ExecError(Exception):
    """The server refused the session (message and HTTP-like status say why) or it broke."""

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


@dataclass(frozen=True, slots=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


class ExecSession:
    """An open session: `send` stdin, `recv` output until it returns the exit code (an int)."""

    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        self.exit_code: int | None = None

    @classmethod
    def open(cls, base_url: str, token: str | None, job_id: int, request: dict[str, Any]) -> ExecSession:
        url = base_url.replace("http://", "ws://", 1).replace("https://", "wss://", 1)
        url = f"{url}/api/v1/jobs/{job_id}/exec"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        context = ssl.create_default_context() if url.startswith("wss://") else None
        try:
            conn = connect(
                url, additional_headers=headers, ssl=context, max_size=None, open_timeout=30, legacy=True
            )
        except InvalidStatus as exc:
            raise ExecError(f"the server refused the exec session: HTTP {exc.response.status_code}")
        except OSError as exc:
            raise ExecError(f"cannot reach the Corral server at {base_url}: {exc}")
        session = cls(conn)
        try:
            conn.send(json.dumps(request))
            first = json.loads(conn.recv(timeout=60))
        except (ConnectionClosed, TimeoutError, ValueError) as exc:
            conn.close()
            raise ExecError(f"the exec session ended before it started: {exc}")
        if "error" in first:
            conn.close()
            raise ExecError(str(first["error"]), first.get("status"))
        return session

    def send(self, data: bytes) -> None:
        if data:
            self.conn.send(bytes([STDIN]) + data)

    def close_stdin(self) -> None:
        self.conn.send(json.dumps({"eof": True}))

    def resize(self, rows: int, cols: int) -> None:
        self.conn.send(json.dumps({"resize": [rows, cols]}))

    def recv(self) -> tuple[int, bytes] | int:
        """(stream, data) of output, or the exit code once the process has ended."""
        if self.exit_code is not None:
            return self.exit_code
        while True:
            try:
                message = self.conn.recv()
            except ConnectionClosed:
                raise ExecError("the connection to the server was lost before the process ended")
            if isinstance(message, bytes):
                if message:
                    return message[0], message[1:]
                continue
            control = json.loads(message)
            if "exit" in control:
                self.exit_code = int(control["exit"])
                return self.exit_code
            if "error" in control:
                raise ExecError(str(control["error"]), control.get("status"))

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ExecSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_collect(session: ExecSession, stdin: bytes = b"") -> ExecResult:
    """Feeds `stdin` (then EOF) and collects everything until the exit code."""
    session.send(stdin)
    session.close_stdin()
    out: dict[int, list[bytes]] = {STDOUT: [], STDERR: []}
    while True:
        item = session.recv()
        if isinstance(item, int):
            return ExecResult(item, b"".join(out[STDOUT]), b"".join(out[STDERR]))
        out.setdefault(item[0], []).append(item[1])
