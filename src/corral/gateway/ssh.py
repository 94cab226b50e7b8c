"""The SSH gateway: one port (Settings.ssh_gateway_port, default 2222) into running jobs and
workspaces, on asyncssh. It runs inside the server process, on a thread with its own event loop
(an API burst does not slow a terminal, nor the reverse); a server restart drops open SSH
connections, and a new `ssh` connects as soon as the server is back.

- Login `<user>+job-<id>` or `<user>+<workspace>` (resolver.py). Public-key authentication only,
  against the keys that user registered (`corral key add`), read at each login, and the key
  that logged in checked again at each new channel (a removed key opens no more); no passwords,
  no keyboard-interactive. The host key is kept at <home>/ssh/gateway_host_ed25519_key.
- Every session channel (shell with or without a PTY, exec command, the `sftp` subsystem, which
  scp uses too) and every local port forward (`ssh -L`) is one process inside the job's sandbox,
  started through the engine's exec_command: the job's namespaces, cgroup, mounts, uid and GPUs.
  SFTP is OpenSSH's own sftp-server run in the sandbox; a forward is a relay to 127.0.0.1:<port>
  in the job's network namespace. No agent, X11 or remote (-R) forwarding. One connection
  holds at most MAX_SESSIONS (10) session channels and MAX_FORWARDS (64) forwards open at once;
  one more is refused as "administratively prohibited", with a message saying why.
- Each channel is resolved afresh (a restarted workspace is found on the next channel) and is in
  the audit log as job.ssh or job.port_forward.
- A connection ends (the client is disconnected, its processes killed) within seconds of its key
  being removed or its user deactivated: it is held in the server's OpenSessions by that key.
- Each channel open into a job is counted in the server's SessionUse, open and then closed (its
  close time): idle reclamation counts it as the workspace's use (corral.services.session_use).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import asyncssh
import uvloop
from sqlalchemy.orm import Session, sessionmaker

from corral.config import Settings
from corral.engine.base import Engine, ExecCommand, ExecRefused
from corral.gateway import resolver
from corral.gateway.spawn import STDERR, SandboxProcess
from corral.services.errors import ServiceError
from corral.services.open_sessions import ENDED_MESSAGE, Holder, OpenSessions
from corral.services.sandbox_exec import record_entry, relay_argv
from corral.services.session_use import SessionUse

log = logging.getLogger(__name__)
SFTP_SERVER = "/usr/lib/openssh/sftp-server"  # Debian's openssh-sftp-server, run in the sandbox
LOGIN_SHELL = ["/bin/sh", "-c", "if [ -x /bin/bash ]; then exec /bin/bash -l; fi; exec /bin/sh -l"]
# Every session channel (shell, command, sftp/scp) starts in the user's home, as under sshd: the
# job's own working dir is the attempt's private /job, which a workspace loses at each stop, so
# `scp f alice+nb:` or `echo x > notes` there would be gone after `corral ws stop`/`start`.
TERM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")  # xterm-256color, screen.xterm
IN_HOME = ["/bin/sh", "-c", 'cd "${HOME:-/}" 2>/dev/null || cd /; exec "$@"', "sh"]
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "ip6-localhost")
# AES-GCM first and no chacha20-poly1305: a client's own preference wins the negotiation, and
# asyncssh's chacha20 runs per packet in Python (scp downloads at a fraction of sshd's speed),
# where AES-GCM is one call into OpenSSL per packet.
ENCRYPTION_ALGS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com", "aes128-ctr", "aes256-ctr")
INBOX_HIGH_WATER = 64  # chunks of client input queued before the channel stops reading
# Channels open at once on one connection, each a process in the job's sandbox: without a cap one
# connection could start them without end. Sessions (shell, command, sftp) as OpenSSH's
# MaxSessions default; forwards (`ssh -L`, one per TCP connection: a browser or VS Code opens
# several at once) more.
MAX_SESSIONS = 10
MAX_FORWARDS = 64


class EntryRefused(Exception):
    """Why a channel cannot enter its job, in words for the SSH user."""


class Gateway:
    def __init__(
        self,
        settings: Settings,
        session_factory: sessionmaker[Session],
        engine: Engine,
        use: SessionUse | None = None,
        sessions: OpenSessions | None = None,
    ) -> None:
        self.host = settings.ssh_gateway_host or settings.host
        self.port = settings.ssh_gateway_port
        self.key_path = settings.home / "ssh" / "gateway_host_ed25519_key"
        self.session_factory = session_factory
        self.engine = engine
        # uvloop (libuv): its transports and subprocess pipes cost less per SSH packet and per
        # pipe read than asyncio's own loop; scp into a sandbox moves every byte through both.
        self.loop = uvloop.new_event_loop()
        self._server: asyncssh.SSHAcceptor | None = None
        self.use = use if use is not None else SessionUse()  # the server's, shared with exec
        # The server's open sessions by credential: a connection ends when its key is removed or
        # its user deactivated (corral.services.open_sessions), not only its next channel refused.
        self.sessions = sessions if sessions is not None else OpenSessions()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Binds the port (OSError when it cannot) and serves on a daemon thread."""
        host_key = load_host_key(self.key_path)
        self._server = self.loop.run_until_complete(
            asyncssh.create_server(
                lambda: GatewayServer(self),
                self.host,
                self.port,
                server_host_keys=[host_key],
                encoding=None,
                password_auth=False,
                kbdint_auth=False,
                agent_forwarding=False,
                x11_forwarding=False,
                allow_scp=False,
                line_editor=False,
                encryption_algs=ENCRYPTION_ALGS,
            )
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self.loop.run_forever, name="ssh-gateway", daemon=True)
        self._thread.start()
        log.info("SSH gateway listening on %s:%d", self.host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self.loop.call_soon_threadsafe(self._server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- called on worker threads (database and engine work is blocking) ----------------------

    def keys_of(self, user: str) -> list[str]:
        with self.session_factory() as db:
            return resolver.authorized_keys(db, user)

    def still_registered(self, username: str, fingerprint: str) -> bool:
        """Whether the key a connection logged in with is still one of its user's keys."""
        try:
            keys = self.keys_of(resolver.parse_login(username).user)
        except ServiceError:
            return False
        return fingerprint in _fingerprints(keys)

    def enter(self, username: str, source: str, argv: Sequence[str], how: str) -> tuple[ExecCommand, int]:
        """The command entering the job `username` names (and that job's id), audited;
        EntryRefused saying why not."""
        try:
            login = resolver.parse_login(username)
            with self.session_factory() as db:
                principal = resolver.principal_for(db, login.user, source)
                target = resolver.resolve(db, principal, login)
                run = [*IN_HOME, *argv] if how == "ssh" else argv
                cmd = self.engine.exec_command(target.attempt_id, target.rank, run)
                shown = argv if how == "ssh" else [f"127.0.0.1:{argv[-1]}"]
                record_entry(db, principal, target, how, shown)
                return cmd, target.job_id
        except ServiceError as exc:
            raise EntryRefused(exc.message)
        except ExecRefused as exc:
            raise EntryRefused(str(exc))


def _fingerprints(keys: Sequence[str]) -> set[str]:
    """The SHA256 fingerprints of registered public keys (one that does not parse: none)."""
    out = set()
    for text in keys:
        try:
            out.add(asyncssh.import_public_key(text).get_fingerprint("sha256"))
        except (asyncssh.KeyImportError, ValueError):
            continue
    return out


def load_host_key(path: Path) -> asyncssh.SSHKey:
    """The gateway's host key, made once (0600) and kept: clients remember it."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = asyncssh.generate_private_key("ssh-ed25519")
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.export_private_key())
        os.replace(tmp, path)
    return asyncssh.read_private_key(str(path))


class GatewayServer(asyncssh.SSHServer):
    """One client connection: authentication, then a SandboxSession or RelaySession per channel."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.username = ""
        self.source = "unknown"
        self._registered: set[str] = set()  # fingerprints of the keys that may log in
        self.key_fingerprint = ""  # the key this connection logged in with
        self.open_channels = {"session": 0, "forward": 0}  # counted until each one's connection_lost
        self._held: int | None = None  # its entry in the gateway's open sessions, once logged in

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        self.conn = conn
        peer = conn.get_extra_info("peername")
        self.source = str(peer[0]) if peer else "unknown"

    def auth_completed(self) -> None:
        """Logged in: held open by this user's key until either loses access."""
        holder = Holder(resolver.parse_login(self.username).user, f"ssh-key:{self.key_fingerprint}")
        loop = self.gateway.loop
        self._held = self.gateway.sessions.add(holder, lambda: loop.call_soon_threadsafe(self._end))

    def _end(self) -> None:
        self.conn.disconnect(asyncssh.DISC_BY_APPLICATION, ENDED_MESSAGE)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._held is not None:
            self.gateway.sessions.discard(self._held)

    async def begin_auth(self, username: str) -> bool:
        self.username = username
        try:
            login = resolver.parse_login(username)
            keys = await asyncio.to_thread(self.gateway.keys_of, login.user)
        except ServiceError:
            keys = []
        # No keys: nothing can authenticate (the client learns no more than "denied").
        self._registered = _fingerprints(keys)
        return True

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key: asyncssh.SSHKey) -> bool:
        """Whether `key` is one of the user's (asyncssh checks the signature). Which key logged
        in is kept: each channel checks it is still registered (Gateway.still_registered)."""
        fingerprint = key.get_fingerprint("sha256")
        if fingerprint not in self._registered:
            return False
        self.key_fingerprint = fingerprint
        return True

    def password_auth_supported(self) -> bool:
        return False

    def session_requested(self) -> SandboxSession:
        self._admit("session", MAX_SESSIONS)
        return SandboxSession(self)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int) -> Any:
        if dest_host not in LOOPBACK_NAMES:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"only localhost inside the job can be forwarded to, not {dest_host}",
            )
        self._admit("forward", MAX_FORWARDS)
        return RelaySession(self, dest_port)

    def _admit(self, kind: str, limit: int) -> None:
        if self.open_channels[kind] >= limit:
            raise asyncssh.ChannelOpenError(
                asyncssh.OPEN_ADMINISTRATIVELY_PROHIBITED,
                f"this connection already has {limit} {kind}s open, the gateway's limit per"
                " connection: close one, or open another connection",
            )
        self.open_channels[kind] += 1

    def channel_closed(self, kind: str) -> None:
        self.open_channels[kind] -= 1

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no remote (-R) forwarding

    async def enter(self, argv: Sequence[str], how: str) -> tuple[ExecCommand, int]:
        # Keys are read at login; a connection outlives that (VS Code, ssh ControlMaster) and
        # opens a channel for each shell, command, scp or forward: a removed key opens no more.
        still = self.gateway.still_registered
        if not await asyncio.to_thread(still, self.username, self.key_fingerprint):
            raise EntryRefused("the SSH key this connection logged in with is no longer registered")
        return await asyncio.to_thread(self.gateway.enter, self.username, self.source, argv, how)


class ChannelClosed(Exception):
    """The client closed the channel while its process was being started."""


class _Channel:
    """What sessions and relays share: ordered, flow-controlled input to the process."""

    chan: Any = None
    proc: SandboxProcess | None = None
    server: GatewayServer
    job_id: int | None = None  # counted in the gateway's open sessions while set
    closed = False  # set by connection_lost, which may come while _start awaits
    kind = "session"  # which of the connection's channel limits it counts against

    async def _start(
        self,
        argv: Sequence[str],
        how: str,
        tty: bool = False,
        rows: int = 24,
        cols: int = 80,
        term: str | None = None,
    ) -> SandboxProcess:
        cmd, job_id = await self.server.enter(argv, how)
        if self.closed:  # connection_lost came during enter: nothing to start, nothing to count
            raise ChannelClosed
        if term is not None and TERM_NAME.fullmatch(term):
            # The one variable of the client's that goes in, beside the job's own: on the local
            # engine the root programs on the way in see it (the job's env is stashed from them,
            # isolation/root_env.py), so only a terminal type's name, which none of them reads
            cmd = replace(cmd, env={**cmd.env, "TERM": term})
        proc = await SandboxProcess.start(cmd, tty=tty, rows=rows, cols=cols)
        if self.closed:  # ... or during the spawn: connection_lost had no process to kill yet
            proc.kill()
            raise ChannelClosed
        self.proc, self.job_id = proc, job_id
        self.server.gateway.use.opened(job_id)
        return proc

    def _untrack(self) -> None:
        if self.job_id is not None:
            self.server.gateway.use.closed(self.job_id, time.time())
            self.job_id = None

    def _init_channel(self) -> None:
        self._inbox: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._writable = asyncio.Event()
        self._writable.set()
        self._feeder: asyncio.Task[None] | None = None

    def data_received(self, data: bytes, datatype: int | None = None) -> None:
        self._inbox.put_nowait(data)
        if self._inbox.qsize() > INBOX_HIGH_WATER and self.chan is not None:
            self.chan.pause_reading()

    def eof_received(self) -> bool:
        self._inbox.put_nowait(None)
        return True  # keep the channel open for the process' output and exit status

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.server.channel_closed(self.kind)
        self.closed = True
        self._untrack()
        if self.proc is not None:
            self.proc.kill()
        if self._feeder is not None:
            self._feeder.cancel()

    async def _feed(self, proc: SandboxProcess) -> None:
        """Client input to the process, in order; what queued up meanwhile goes in one write
        (SFTP clients send many small requests at once)."""
        while True:
            chunks: list[bytes] = []
            item = await self._inbox.get()
            while item is not None:
                chunks.append(item)
                if self._inbox.empty():
                    break
                item = self._inbox.get_nowait()
            if chunks:
                await proc.write(b"".join(chunks))
            if self._inbox.qsize() < INBOX_HIGH_WATER // 2 and self.chan is not None:
                self.chan.resume_reading()
            if item is None:
                break
        proc.close_stdin()

    async def _pump_output(self, proc: SandboxProcess) -> int:
        self._feeder = asyncio.ensure_future(self._feed(proc))
        while (item := await proc.read()) is not None:
            await self._writable.wait()
            channel, data = item
            if channel == STDERR and hasattr(self.chan, "write_stderr"):
                self.chan.write_stderr(data)
            elif channel == STDERR:  # a forward's channel has no stderr: it is not the service's data
                log.info(
                    "ssh -L to port %s: %s", getattr(self, "port", "?"), data.decode(errors="replace").strip()
                )
            else:
                self.chan.write(data)
        return await proc.wait()


class SandboxSession(_Channel, asyncssh.SSHServerSession[bytes]):
    """A shell, a command or the sftp subsystem, run inside the job's sandbox."""

    def __init__(self, server: GatewayServer) -> None:
        self.server = server
        self.argv: list[str] = LOGIN_SHELL
        self.term: tuple[str, int, int] | None = None  # (TERM, rows, cols) with a PTY
        self._init_channel()

    def connection_made(self, chan: Any) -> None:
        self.chan = chan

    def pty_requested(self, term_type: str, term_size: tuple[int, int, int, int], term_modes: Any) -> bool:
        cols, rows = term_size[0] or 80, term_size[1] or 24
        self.term = (term_type or "xterm", rows, cols)
        return True

    def shell_requested(self) -> bool:
        self.argv = LOGIN_SHELL
        return True

    def exec_requested(self, command: str) -> bool:
        self.argv = ["/bin/sh", "-c", command]
        return True

    def subsystem_requested(self, subsystem: str) -> bool:
        if subsystem != "sftp":
            return False
        self.argv, self.term = [SFTP_SERVER], None
        return True

    def terminal_size_changed(self, width: int, height: int, pixwidth: int, pixheight: int) -> None:
        if self.proc is not None:
            self.proc.resize(height, width)

    def session_started(self) -> None:
        self._runner = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            rows, cols = (self.term[1], self.term[2]) if self.term else (24, 80)
            term = self.term[0] if self.term else None
            proc = await self._start(self.argv, "ssh", self.term is not None, rows, cols, term)
        except ChannelClosed:
            return
        except (EntryRefused, OSError) as exc:
            self.chan.write_stderr(f"corral: {exc}\r\n".encode())
            self.chan.exit(1)
            return
        except Exception:  # not a refusal (the database is down, say): tell the client and end
            # the channel, or it would wait forever for a process that never starts
            log.exception("SSH gateway: %s could not enter its job", self.server.username)
            self.chan.write_stderr(b"corral: could not enter the job (a server error, in its log)\r\n")
            self.chan.exit(1)
            return
        try:
            code = await self._pump_output(proc)
        finally:  # uncounted however the pump ends (an error, a cancel), not only at its exit
            self._untrack()
        self.chan.exit(code & 0xFF)


class RelaySession(_Channel, asyncssh.SSHTCPSession[bytes]):
    """`ssh -L`: one connection to 127.0.0.1:<port> in the job's network namespace."""

    kind = "forward"

    def __init__(self, server: GatewayServer, port: int) -> None:
        self.server = server
        self.port = port
        self._init_channel()

    def connection_made(self, chan: Any) -> None:
        self.chan = chan

    def session_started(self) -> None:
        self._runner = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        try:
            proc = await self._start(relay_argv(self.port), "port_forward")
        except ChannelClosed:
            return
        except (EntryRefused, ServiceError, OSError) as exc:
            log.info("ssh -L to port %d refused: %s", self.port, exc)
            self.chan.close()
            return
        except Exception:  # as for a session: the forward's channel must end, not hang
            log.exception("SSH gateway: %s could not forward to port %d", self.server.username, self.port)
            self.chan.close()
            return
        try:
            await self._pump_output(proc)
        finally:
            self._untrack()
        self.chan.write_eof()
        self.chan.close()


def start_gateway(
    settings: Settings,
    session_factory: sessionmaker[Session],
    engine: Engine,
    use: SessionUse | None = None,
    sessions: OpenSessions | None = None,
) -> Gateway | None:
    """The running gateway, or None when it is off (port 0) or its port cannot be bound (logged:
    the API keeps serving without it)."""
    if not settings.ssh_gateway_port:
        return None
    gateway = Gateway(settings, session_factory, engine, use, sessions)
    try:
        gateway.start()
    except OSError as exc:
        log.error("SSH gateway not started: cannot listen on %s:%d: %s", gateway.host, gateway.port, exc)
        gateway.loop.close()
        return None
    return gateway
