"""A port forward to a port nothing listens on in the job: `corral port-forward 18 16012:6999`
then a client connecting to 127.0.0.1:16012 received the in-sandbox relay's Python traceback
("Traceback (most recent call last): ... ConnectionRefusedError: [Errno 111] Connection refused")
as if the service had answered it, and the CLI said nothing; `ssh -L` wrote the same into the
forwarded channel. The relay now says it in one line on stderr and exits RELAY_NO_LISTENER; the CLI
prints that line and the gateway logs it, and neither sends it down the forwarded connection."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from typing import Any

import pytest

from corral.cli import sandbox
from corral.exec_client import STDERR, STDOUT
from corral.gateway.ssh import RelaySession
from corral.services.sandbox_exec import RELAY_NO_LISTENER, relay_argv


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns


def test_the_relay_says_nothing_listens_in_one_line() -> None:
    port = _closed_port()
    done = subprocess.run(relay_argv(port), capture_output=True, stdin=subprocess.DEVNULL, timeout=30)
    assert done.returncode == RELAY_NO_LISTENER and done.stdout == b""
    assert done.stderr.decode() == f"nothing answers on port {port} in the job (Connection refused)\n"


class _Session:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def recv(self) -> Any:
        return self.items.pop(0)

    def send(self, data: bytes) -> None:
        return None

    def close_stdin(self) -> None:
        return None

    def close(self) -> None:
        return None


class _Client:
    def __init__(self, session: _Session) -> None:
        self.session = session

    def port_relay(self, job_id: int, port: int, *, rank: int = 0) -> _Session:
        return self.session


def test_port_forward_prints_the_relays_word_and_sends_only_data(capsys: pytest.CaptureFixture[str]) -> None:
    mine, theirs = socket.socketpair()
    items = [
        (STDOUT, b"data"),
        (STDERR, b"nothing answers on port 6999 in the job (Connection refused)\n"),
        3,
    ]
    sandbox._relay(_Client(_Session(items)), 18, 6999, 0, theirs)
    received = b""
    while chunk := mine.recv(4096):
        received += chunk
    assert received == b"data"
    assert "job 18: nothing answers on port 6999 in the job (Connection refused)" in capsys.readouterr().err


class _Proc:
    def __init__(self, items: list[tuple[int, bytes]]) -> None:
        self.items = items

    async def read(self) -> tuple[int, bytes] | None:
        return self.items.pop(0) if self.items else None

    async def write(self, data: bytes) -> None:
        return None

    def close_stdin(self) -> None:
        return None

    async def wait(self) -> int:
        return RELAY_NO_LISTENER


class _TcpChannel:  # an SSH direct-tcpip channel: no write_stderr
    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(data)


def test_ssh_dash_l_keeps_the_relays_stderr_out_of_the_forwarded_channel() -> None:
    async def run() -> tuple[int, list[bytes]]:
        relay = RelaySession(server=None, port=6999)  # type: ignore[arg-type]  # _pump_output needs none
        relay.chan = _TcpChannel()
        proc = _Proc([(STDOUT, b"data"), (STDERR, b"nothing answers on port 6999 in the job\n")])
        code = await relay._pump_output(proc)  # type: ignore[arg-type]
        if relay._feeder is not None:
            relay._feeder.cancel()
        return code, relay.chan.written

    code, written = asyncio.run(run())
    assert code == RELAY_NO_LISTENER and written == [b"data"]
