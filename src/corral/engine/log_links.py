"""Each rank's log, readable by the job's owner from their other jobs and workspaces: the `logs`
mount source (corral.storage.mounts) binds `<storage root>/logs/<user>/` read-only at /logs, and
each engine hard-links every rank's log there when it launches an attempt:

    logs/<user>/<job id>/attempt-<n>/rank-<r>.log   each attempt's
    logs/<user>/<job id>/rank-<r>.log                the latest attempt's (replaced atomically)

A hard link is the same file as the engine's own `rank-<r>.log`, so what the job writes shows at
once, and a workspace started before the job sees its dir appear (a dir bind shows new entries).
The dirs are root's with the user's gid, read-only for the group. On the local engine the files
are root's too (the supervisor, as root, appends): the user reads them, nobody writes through the
link. On the Slurm engine the job's own account writes its log (the node script's redirect
truncates the file the engine made, same inode), so the file is that account's. A hard link
needs the engine's state dir and the storage root on one filesystem; where they are not, the
logs are not linked (a warning says so) and stay readable through the API and `corral logs`.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from corral.storage.layout import StorageDir, StorageError, prepare_dirs

log = logging.getLogger("corral.engine.logs")
LOG_MODE = 0o640  # root:<user gid>: the owner reads, only the supervisor (root) appends


def prepare_log_dirs(job_log_dir: Path, attempt: int, uid: int, gid: int) -> Path:
    """Make `logs/<user>/<job>/attempt-<n>` (root:<gid> 0750 each level; gid: the user's); returns
    the last. The explicit gid retires a dir of a deleted user of the same name (prepare_dirs),
    whose logs the new user must not read."""
    attempt_dir = job_log_dir / f"attempt-{attempt}"
    dirs = [job_log_dir.parent, job_log_dir, attempt_dir]
    prepare_dirs([StorageDir(str(d), "root", gid, 0o750) for d in dirs], uid, gid)
    return attempt_dir


def link_rank_logs(
    attempt_dir: Path,
    job_log_dir: Path,
    ranks: Iterable[int],
    gid: int,
    adir: Path,
    *,
    writer: int = 0,
) -> None:
    """Create each rank's log in the engine's dir `adir` (owned by `writer`, group `gid`: the
    local supervisor, root, appends to it with O_APPEND and no O_TRUNC, so it keeps this owner
    and mode; a Slurm job's account truncates and writes it) and hard-link it into the user's
    logs dir."""
    as_root = os.geteuid() == 0
    for rank in ranks:
        name = f"rank-{rank}.log"
        fd = os.open(adir / name, os.O_WRONLY | os.O_CREAT | os.O_APPEND, LOG_MODE)
        try:
            if as_root:
                os.fchown(fd, writer, gid)
            os.fchmod(fd, LOG_MODE)
        finally:
            os.close(fd)
        try:
            os.link(adir / name, attempt_dir / name)
            tmp = job_log_dir / f".{name}.{attempt_dir.name}"
            tmp.unlink(missing_ok=True)
            os.link(adir / name, tmp)
            os.replace(tmp, job_log_dir / name)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            log.warning(
                "logs of %s are not linked into %s: the storage root is on another filesystem "
                "than the engine's state dir (a hard link cannot cross)",
                adir.name,
                job_log_dir,
            )
            return


def link_attempt_logs(
    job_log_dir: Path,
    attempt: int,
    ranks: Iterable[int],
    adir: Path,
    *,
    uid: int,
    gid: int,
    writer: int = 0,
    attempt_id: str,
) -> None:
    """An engine's one call at launch: the user's dirs for this attempt, then each rank's log
    made in `adir` and linked there. Best effort: the job runs without the /logs view if this
    fails (a warning says why)."""
    try:
        links = prepare_log_dirs(job_log_dir, attempt, uid, gid)
        link_rank_logs(links, job_log_dir, ranks, gid, adir, writer=writer)
    except (OSError, StorageError) as exc:
        log.warning("logs of attempt %s not linked for its owner: %s", attempt_id, exc)
