"""The SSH gateway's count of open sessions per job (what idle reclamation reads): a real
asyncssh server and client on loopback, the gateway's database and engine steps replaced by
stand-ins (tests/server/test_sandbox_entry.py drives the whole path into real sandboxes)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, cast

import asyncssh
import psutil
import pytest

from corral.config import Settings
from corral.engine.base import ExecCommand
from corral.gateway import ssh
from corral.gateway.ssh import Gateway
from tests.server.fakes import FakeEngine

JOB_ID = 7


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Gateway, asyncssh.SSHKey]]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    settings = Settings(home=tmp_path, ssh_gateway_port=0)
    gw = Gateway(settings, cast(Any, None), FakeEngine())
    gw.keys_of = lambda user: [key.export_public_key().decode()]  # type: ignore[method-assign]
    gw.start()
    yield gw, key
    gw.stop()


def entering(
    argv: Sequence[str],
    entered: threading.Event,
    release: threading.Event,
    returned: threading.Event | None = None,
) -> Callable[[str, str, Sequence[str], str], tuple[ExecCommand, int]]:
    def enter(username: str, source: str, _argv: Sequence[str], how: str) -> tuple[ExecCommand, int]:
        entered.set()
        assert release.wait(10)
        if returned is not None:
            returned.set()
        return ExecCommand(argv=tuple(argv), env={}), JOB_ID

    return enter


def connect(gw: Gateway, key: asyncssh.SSHKey) -> Any:
    return asyncssh.connect(
        gw.host, gw.port, username=f"alice+job-{JOB_ID}", client_keys=[key], known_hosts=None
    )


def test_a_channel_closed_while_entering_its_job_is_never_counted(
    gateway: tuple[Gateway, asyncssh.SSHKey],
) -> None:
    """The client closes the channel while the gateway is still resolving its job: the process
    is not started (or is killed) and the job's open-session count does not stay at 1."""
    gw, key = gateway
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()
    gw.enter = entering(["/bin/sleep", "31.5"], entered, release, returned)  # type: ignore[method-assign]

    def sleepers() -> list[psutil.Process]:
        """The job's process, while it lives (killed and not yet reaped: a zombie, gone)."""
        alive = []
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.status() != psutil.STATUS_ZOMBIE and "31.5" in proc.cmdline():
                    alive.append(proc)
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                pass
        return alive

    async def client() -> list[dict[int, int]]:
        async with connect(gw, key) as conn:
            chan, _ = await conn.create_session(asyncssh.SSHClientSession, "sleep 31.5")
            assert await asyncio.to_thread(entered.wait, 10)
            chan.close()
            await chan.wait_closed()
            release.set()
            assert await asyncio.to_thread(returned.wait, 10)  # the gateway's _start resumes now
            counts = []
            for _ in range(10):  # a count taken after the close would show within this second
                await asyncio.sleep(0.1)
                counts.append(gw.use.open_counts())
            return counts

    assert asyncio.run(client()) == [{}] * 10
    deadline = time.time() + 5
    while sleepers() and time.time() < deadline:  # never started, or killed on the close
        time.sleep(0.05)
    assert sleepers() == []


def test_a_short_command_leaves_its_close_time_as_the_jobs_last_use(
    gateway: tuple[Gateway, asyncssh.SSHKey],
) -> None:
    """`ssh ws true` is open at no idle check: its close time is what the idle check reads."""
    gw, key = gateway
    entered, release = threading.Event(), threading.Event()
    release.set()
    gw.enter = entering(["/bin/true"], entered, release)  # type: ignore[method-assign]

    async def client() -> int:
        async with connect(gw, key) as conn:
            result = await conn.run("true")
            return int(result.exit_status or 0)

    before = time.time()
    assert asyncio.run(client()) == 0
    deadline = time.time() + 5
    while gw.use.open_counts() and time.time() < deadline:
        time.sleep(0.05)  # the gateway's side of the close may trail the client's
    assert gw.use.open_counts() == {}
    (job_id, used_at), *more = gw.use.last_use(now=time.time() + 3600).items()
    assert more == [] and job_id == JOB_ID and before <= used_at <= time.time()


def test_a_failure_while_entering_ends_the_channel_with_a_message(
    gateway: tuple[Gateway, asyncssh.SSHKey],
) -> None:
    """Entering fails with something other than a refusal (the database is down, PostgreSQL
    refuses `alice+job-9999999999` as out of its integer range): the client is told and the
    channel ends with status 1, instead of waiting forever for a process that never starts."""
    gw, key = gateway

    def enter(username: str, source: str, argv: Sequence[str], how: str) -> tuple[ExecCommand, int]:
        raise RuntimeError("could not connect to the database")

    gw.enter = enter  # type: ignore[method-assign]

    async def client() -> tuple[int, str]:
        async with connect(gw, key) as conn:
            result = await asyncio.wait_for(conn.run("true"), 10)
            return int(result.exit_status or 0), str(result.stderr)

    code, stderr = asyncio.run(client())
    assert code == 1 and "corral: " in stderr and "could not enter" in stderr
    assert gw.use.open_counts() == {}


def test_a_key_removed_while_connected_opens_no_more_channels(
    gateway: tuple[Gateway, asyncssh.SSHKey],
) -> None:
    """`corral key rm` stops the key at once (docs/workspaces.md): also on a connection it
    opened before (VS Code Remote-SSH, an ssh ControlMaster), whose next shell, command, scp or
    forward is a new channel; another registered key of the user's does not matter."""
    gw, key = gateway
    other = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    entered, release = threading.Event(), threading.Event()
    release.set()
    gw.enter = entering(["/bin/true"], entered, release)  # type: ignore[method-assign]

    async def client() -> tuple[int, int, str]:
        async with connect(gw, key) as conn:
            first = await conn.run("true")
            gw.keys_of = lambda user: [other]  # type: ignore[method-assign]  # this key removed
            second = await asyncio.wait_for(conn.run("true"), 10)
            return int(first.exit_status or 0), int(second.exit_status or 0), str(second.stderr)

    first, second, stderr = asyncio.run(client())
    assert first == 0 and second == 1 and "no longer registered" in stderr


def test_one_connection_opens_at_most_max_sessions_and_max_forwards_at_once(
    gateway: tuple[Gateway, asyncssh.SSHKey], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Like OpenSSH's MaxSessions: the 11th session channel on a connection is refused, saying
    why, and one can be opened again once another closes; forwards have their own cap (2 here,
    64 shipped). Without the cap one connection could start processes in the job without end."""
    gw, key = gateway
    monkeypatch.setattr(ssh, "MAX_FORWARDS", 2, raising=False)
    entered, release = threading.Event(), threading.Event()
    release.set()
    gw.enter = entering(["/bin/sleep", "30"], entered, release)  # type: ignore[method-assign]

    async def refused(opening: Any) -> str:
        with pytest.raises(asyncssh.ChannelOpenError) as refusal:
            await asyncio.wait_for(opening, 10)
        return str(refusal.value.reason)

    async def client() -> tuple[str, str]:
        async with connect(gw, key) as conn:
            sessions = [
                (await conn.create_session(asyncssh.SSHClientSession, "sleep 30"))[0] for _ in range(10)
            ]
            refused_session = await refused(conn.create_session(asyncssh.SSHClientSession, "sleep 30"))
            sessions[0].close()
            await sessions[0].wait_closed()
            for _ in range(50):  # the gateway's side of the close may trail the client's
                try:
                    chan, _ = await conn.create_session(asyncssh.SSHClientSession, "sleep 30")
                    break
                except asyncssh.ChannelOpenError:
                    await asyncio.sleep(0.05)
            else:
                raise AssertionError("no session could be opened after one closed")
            sessions[0] = chan
            for _ in range(2):
                await conn.create_connection(asyncssh.SSHTCPSession, "localhost", 8888)
            refused_forward = await refused(conn.create_connection(asyncssh.SSHTCPSession, "localhost", 8888))
            return refused_session, refused_forward

    session, forward = asyncio.run(client())
    assert session == (
        "this connection already has 10 sessions open, the gateway's limit per connection: close one,"
        " or open another connection"
    )
    assert forward.startswith("this connection already has 2 forwards open")
