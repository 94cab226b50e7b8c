"""corral.gateway.spawn.SandboxProcess on its own (a plain host process stands in for the
engine's command into a sandbox)."""

from __future__ import annotations

import asyncio

import pytest

from corral.engine.base import ExecCommand
from corral.gateway.spawn import SandboxProcess


@pytest.mark.parametrize("tty", [False, True])
def test_a_kill_while_output_waits_unread_ends_the_readers(tty: bool) -> None:
    """The client went away while the process wrote faster than it was read (`corral exec`
    of a `cat` of a big file, then Ctrl-C): kill() must end the reader tasks. Their end-of-stream
    marker used to wait for room in the full output queue that nobody reads any more, so each
    such session left its readers pending for ever, holding up to a megabyte of output, and its
    output pipe, paused with nobody reading, open: the fd leaked and wait() never returned."""

    async def scenario() -> list[bool]:
        proc = await SandboxProcess.start(ExecCommand(argv=("yes",), env={"PATH": "/usr/bin:/bin"}), tty=tty)
        for _ in range(200):  # until the output queue is full: the readers wait on it
            if proc._out.full():
                break
            await asyncio.sleep(0.01)
        assert proc._out.full()
        proc.kill()
        await asyncio.wait(proc._tasks, timeout=2)
        done = [task.done() for task in proc._tasks]
        # ... and its pipes closed: wait() returns (it waited for pipes that never ended).
        await asyncio.wait_for(proc.wait(), 5)
        return done

    done = asyncio.run(scenario())
    assert all(done), done


def test_only_a_terminal_types_name_goes_in_as_term() -> None:
    """The SSH client's TERM reaches the root programs on the way into a local sandbox (the job's
    own env is stashed from them): a terminal type's name only (review105)."""
    from corral.gateway.ssh import TERM_NAME

    for name in ("xterm-256color", "screen.xterm-256color", "vt100", "rxvt-unicode+x"):
        assert TERM_NAME.fullmatch(name), name
    for name in ("", "/home/u/terminfo", "x\n", "../x", "a b", "x" * 65):
        assert not TERM_NAME.fullmatch(name), name
