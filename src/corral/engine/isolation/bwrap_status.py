"""Whether a sandbox's command ever ran, in bwrap's own words (local engine).

bwrap sets the sandbox up (namespaces, every bind, /proc, /dev) and then execs the command; when
a step of the setup fails it prints `bwrap: <why>` and exits 1, and so may the job's own command.
Told apart by the exit code alone, a sandbox that refused to start (a mount source swapped under
its `--bind-fd`: "Race condition binding dirfd"; a bound dir removed meanwhile: "Can't find
source path") read as the job exiting 1, the user's failure.

bwrap's `--json-status-fd FD` says which: its monitor writes `{ "child-pid": N, ... }` once it has
cloned the sandbox (before the setup, so that line proves nothing), and `{ "exit-code": N }` when
the sandbox's command exits, but only when the command was exec'd: the sandbox's child writes a
byte to a close-on-exec pipe right before its execvp, and the monitor writes the exit-code line
only when it finds exactly that byte (bubblewrap.c, report_child_exit_status). No exit-code line
from a bwrap that exited by itself (not killed by a signal) is bwrap saying that the command never
started.

The argv names the status file's host path after the option as a placeholder (`with_status_fd`);
the instance's child opens the file (root's, 0600, in the attempt dir, out of the job's reach)
right before it execs bwrap and puts the fd's number in its place (`hand_over`). No file at all
then means that bwrap was never exec'd. The supervisor reads the file once the instance has exited
(`refusal`).

Imported by the supervisor at every job start: the standard library's `os` only.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

STATUS_OPTION = "--json-status-fd"
EXEC_MARK = b'"exit-code"'  # in bwrap's line written only after the command was exec'd
LOG_TAIL_BYTES = 4096
MAX_MESSAGE_CHARS = 500
# The lines that say why a sandbox did not start: bwrap's own, or the instance's child's
# (supervisor.py, a failure before bwrap's exec)
REFUSAL_PREFIXES = ("bwrap: ", "corral supervisor: ")


def with_status_fd(argv: Sequence[str], status_path: str) -> list[str]:
    """The bwrap argv with `--json-status-fd <status_path>` right after bwrap itself (its options
    end at `--`: the job's command after it may hold the same words)."""
    return [argv[0], STATUS_OPTION, status_path, *argv[1:]]


def hand_over(argv: Sequence[str], status_path: str) -> list[str]:
    """In an instance's child, after bind_sources.hand_over (which closes every other fd) and
    right before its exec: the status file opened (created empty) and its fd, kept open across
    the exec, in place of the placeholder. ValueError when the argv has no placeholder for it."""
    if len(argv) < 3 or argv[1] != STATUS_OPTION or argv[2] != status_path:
        raise ValueError(f"the sandbox's argv has no {STATUS_OPTION} {status_path}")
    fd = os.open(status_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.set_inheritable(fd, True)
    return [argv[0], STATUS_OPTION, str(fd), *argv[3:]]


def refusal(status_path: str, log_path: str, exit_code: int) -> str | None:
    """Why the sandbox did not start, for an instance whose bwrap exited by itself with a non-zero
    `exit_code` (not by a signal: a bwrap killed by a stop or the OOM killer writes nothing); None
    when bwrap says that the command ran, i.e. the exit is the job's own. Not asked (the
    supervisor's Instance.finished) for an exit of 128+N, a signal that killed the sandbox before
    its exec, nor after an OOM kill in the rank's cgroup: neither is a refusal."""
    try:
        with open(status_path, "rb") as f:
            if EXEC_MARK in f.read():
                return None
    except FileNotFoundError:
        pass  # the child failed before it made the file: bwrap never ran
    return _why_from_log(log_path) or f"bwrap exited with code {exit_code} before starting the job's command"


def _why_from_log(log_path: str) -> str:
    """The last refusal line of the rank's log (bwrap's stderr), or ""."""
    try:
        with open(log_path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(max(0, size - LOG_TAIL_BYTES))
            lines = f.read().decode("utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith(REFUSAL_PREFIXES):
            line = line.strip()
            return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 3] + "..."
    return ""
