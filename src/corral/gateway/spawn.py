"""Runs an engine's ExecCommand (a process inside a job's sandbox) under asyncio, with pipes or a
PTY, for the exec WebSocket and the SSH gateway alike.

Pipes: stdout and stderr apart, stdin closable (EOF). PTY: one stream (the terminal), the child a
session leader with the PTY as its controlling terminal (`setsid --ctty`), resizable. Either way
`read()` yields (channel, data) until every output stream has ended, then `wait()` gives the
exit code (128+N for a signal, as a shell reports it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import pty
import signal
import struct
import termios

from corral.engine.base import ExecCommand

STDOUT, STDERR = 1, 2
SETSID = "/usr/bin/setsid"
READ_CHUNK = 1 << 16


class SandboxProcess:
    def __init__(self, proc: asyncio.subprocess.Process, master: int | None) -> None:
        self.proc = proc
        self.master = master  # the PTY's master side; None with pipes
        self._out: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue(maxsize=16)
        self._open_streams = 1 if master is not None else 2
        self._killed = False
        self._tasks = self._readers()

    @classmethod
    async def start(
        cls, cmd: ExecCommand, *, tty: bool = False, rows: int = 24, cols: int = 80
    ) -> SandboxProcess:
        if not tty:
            proc = await asyncio.create_subprocess_exec(
                *cmd.argv,
                env=dict(cmd.env),
                cwd=cmd.cwd,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,  # not in the server's process group (its Ctrl-C)
            )
            return cls(proc, None)
        master, slave = pty.openpty()
        try:
            _set_size(master, rows, cols)
            proc = await asyncio.create_subprocess_exec(
                SETSID, "--ctty", "--wait", *cmd.argv, env=dict(cmd.env), cwd=cmd.cwd,
                stdin=slave, stdout=slave, stderr=slave,
            )  # fmt: skip
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        os.set_blocking(master, False)
        return cls(proc, master)

    def _readers(self) -> list[asyncio.Future[None]]:
        if self.master is not None:
            return [asyncio.ensure_future(self._pump_pty(self.master))]
        assert self.proc.stdout is not None and self.proc.stderr is not None
        return [
            asyncio.ensure_future(self._pump(self.proc.stdout, STDOUT)),
            asyncio.ensure_future(self._pump(self.proc.stderr, STDERR)),
        ]

    async def _pump(self, stream: asyncio.StreamReader, channel: int) -> None:
        try:
            while data := await stream.read(READ_CHUNK):
                await self._out.put((channel, data))
        finally:
            await self._mark_end(channel)

    async def _pump_pty(self, master: int) -> None:
        loop = asyncio.get_running_loop()
        readable = asyncio.Event()
        loop.add_reader(master, readable.set)
        try:
            while True:
                await readable.wait()
                readable.clear()
                try:
                    data = os.read(master, READ_CHUNK)
                except BlockingIOError:
                    continue
                except OSError:  # EIO: every process holding the terminal has closed it
                    break
                if not data:
                    break
                await self._out.put((STDOUT, data))
        finally:
            loop.remove_reader(master)
            await self._mark_end(STDOUT)

    async def _mark_end(self, channel: int) -> None:
        """The stream's end, which read() counts. After kill() nobody may read any more (the
        client left): unread output is dropped to make room, where waiting for room in a full
        queue left this reader pending for ever, holding the output."""
        if not self._killed:
            await self._out.put((channel, b""))
            return
        ends = []
        while not self._out.empty():
            item = self._out.get_nowait()
            if not item[1]:
                ends.append(item)  # the other stream's end: read() must still count it
        for item in (*ends, (channel, b"")):
            self._out.put_nowait(item)

    async def read(self) -> tuple[int, bytes] | None:
        """The next (channel, data) of output; None once all output has ended."""
        while self._open_streams:
            channel, data = await self._out.get()
            if data:
                return channel, data
            self._open_streams -= 1
        return None

    async def write(self, data: bytes) -> None:
        if self.master is None:
            assert self.proc.stdin is not None
            self.proc.stdin.write(data)
            await self.proc.stdin.drain()
            return
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(self.master, view) :]
            except BlockingIOError:
                await asyncio.sleep(0.005)  # the terminal's input buffer is full: let it drain

    def close_stdin(self) -> None:
        """EOF on stdin (pipes); on a terminal, the EOF character, as a user typing Ctrl-D."""
        if self.master is None:
            if self.proc.stdin is not None and not self.proc.stdin.is_closing():
                self.proc.stdin.close()
        else:
            with contextlib.suppress(OSError):
                os.write(self.master, b"\x04")

    def resize(self, rows: int, cols: int) -> None:
        if self.master is not None:
            _set_size(self.master, rows, cols)
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGWINCH)

    async def wait(self) -> int:
        code = await self.proc.wait()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._close_master()
        return 128 - code if code < 0 else code

    def kill(self) -> None:
        """Ends the process (the client went away): its whole host-side session, then the pty."""
        self._killed = True
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        for task in self._tasks:
            task.cancel()
        self._close_master()
        # Nobody reads its pipes any more: close them. A pipe paused on unread output never saw
        # its end, so its fd stayed open and (Python 3.11, which waits for the pipes) wait()
        # never returned. (asyncio's Process has no public close; this is what its GC does.)
        transport = getattr(self.proc, "_transport", None)
        if transport is not None:
            transport.close()

    def _close_master(self) -> None:
        if self.master is not None:
            with contextlib.suppress(OSError):
                os.close(self.master)
            self.master = None


def _set_size(fd: int, rows: int, cols: int) -> None:
    rows, cols = max(1, min(rows, 1000)), max(1, min(cols, 1000))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
