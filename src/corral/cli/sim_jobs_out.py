"""`corral sim --jobs-out FILE`: where and how the job events CSV is written. A regular file (or
none yet) whole or not at all, through a file beside it renamed over it; a process's own streams,
a device, FIFO or other non-regular path written into as opened; and the checks made before the
replay (which can take minutes) so that a path that cannot be written is one line up front."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from pathlib import Path
from typing import Any


def in_place(jobs_out: Path) -> bool:
    """Whether `--jobs-out` is written into what the path opens (not a file renamed over it): a
    device, FIFO or socket (`/dev/null`, a pipe), or a path naming a process's own streams
    (`/dev/stdout`, `/dev/fd/63` of `>(gzip > j.gz)`, `/proc/self/fd/1`), whatever they lead to:
    renaming there would replace the system's entry or the file stdout writes to. A new file
    elsewhere in /dev (`/dev/shm/jobs.csv`) is an ordinary file. Raises OSError (a symlink loop)."""
    given = jobs_out.absolute()
    for streams in ("/dev/fd", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/proc"):
        if given.is_relative_to(streams) or Path(os.path.realpath(jobs_out)).is_relative_to(streams):
            return True
    try:
        return not stat.S_ISREG(os.stat(jobs_out).st_mode)
    except FileNotFoundError:  # (a dangling symlink too: the file is made where it points)
        return False


def refusal(jobs_out: Path) -> str | None:
    """`--jobs-out` checked before the replay (which can take minutes): why it could not be
    written, in one line, or None. A regular file (or none yet) needs its folder writable for the
    file made beside it; anything else must be there and open for writing."""
    cannot = f"--jobs-out {jobs_out}: cannot write it"
    try:
        if in_place(jobs_out):
            if not os.path.exists(jobs_out):
                return f"{cannot} ({os.strerror(errno.ENOENT)})"
            if stat.S_ISSOCK(os.stat(jobs_out).st_mode):  # open() of a socket fails (ENXIO)
                return f"{cannot} (it is a socket)"
            return None if os.access(jobs_out, os.W_OK) else f"{cannot} ({os.strerror(errno.EACCES)})"
        target = Path(os.path.realpath(jobs_out))
        if target.exists() and not os.access(target, os.W_OK):
            return f"{cannot} ({os.strerror(errno.EACCES)})"
        handle, probe = tempfile.mkstemp(dir=target.parent, prefix=_part_prefix(target))
    except OSError as exc:  # a symlink loop, a folder that is not one, no room, no right
        return f"{cannot} ({exc.strerror or exc})"
    os.close(handle)
    os.unlink(probe)
    return None


def _part_prefix(target: Path) -> str:
    return f".{target.name[:50]}."  # short: a long NAME stays writable (the part's name is longer)


def write(result: Any, jobs_out: Path) -> str | None:
    """`--jobs-out`, written whole or not at all where it is a regular file (or none yet): into a
    file made beside it (where a symlink points), given its mode, then renamed over it, so a write
    that fails (no space, Ctrl-C) leaves a previous run's file as it was, and no part of one. A
    device, FIFO or /dev/fd path is written into, as opened. What went wrong, in one line, if it
    could not be written (else None)."""
    from corral.sim.metrics import write_jobs_csv

    try:
        if in_place(jobs_out):
            write_jobs_csv(result, jobs_out)
        else:
            _write_beside_and_rename(result, Path(os.path.realpath(jobs_out)))
    except OSError as exc:
        return f"--jobs-out {jobs_out}: cannot write it ({exc.strerror or exc})"
    return None


def _write_beside_and_rename(result: Any, target: Path) -> None:
    from corral.sim.metrics import write_jobs_csv

    handle, name = tempfile.mkstemp(dir=target.parent, prefix=_part_prefix(target), suffix=".part")
    os.close(handle)
    part = Path(name)
    try:
        write_jobs_csv(result, part)
        _same_mode_and_owner(target, part)
        try:
            os.replace(part, target)
        except OSError as exc:
            if exc.errno not in (errno.EBUSY, errno.EXDEV, errno.EPERM):
                raise
            # into it: a file that is its own mount (a bind mount), or another account's in a
            # sticky folder such as /tmp (writable, but only its owner may replace it)
            write_jobs_csv(result, target)
    finally:
        with contextlib.suppress(OSError):
            part.unlink(missing_ok=True)


def _same_mode_and_owner(target: Path, part: Path) -> None:
    """The part takes the old file's mode (and, where allowed, owner); a new file umask's mode
    (mkstemp makes it 0600)."""
    try:
        old = os.stat(target)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(part, 0o666 & ~umask)
        return
    os.chmod(part, stat.S_IMODE(old.st_mode))
    made = os.stat(part)
    if (made.st_uid, made.st_gid) != (old.st_uid, old.st_gid):
        with contextlib.suppress(OSError):  # only root may give a file away
            os.chown(part, old.st_uid, old.st_gid)
