"""The storage root (`CORRAL_STORAGE_ROOT`, default `$CORRAL_HOME/storage`) and its layout:

    home/<user>         a user's home: owner the user's uid, 0700
    group/<group>       a group's shared dir: root:<group gid>, 2770 (setgid: files stay the group's)
    group/<group>/<user>  a member's own subdir, made on first use: <uid>:<group gid>, 2770
    data/               datasets (corral.services.datasets)
    code/blobs/         content-addressed files of `--code` snapshots (root, 0700)
    code/snapshots/<id>/  one snapshot as a tree of read-only hard links (0711: reachable, not listable)
    outputs/<job id>/   a job's outputs: owner the job's uid, 0700; deleted with the job
    logs/<user>/<job id>/  read-only views of the user's jobs' logs (root:<user gid>, 0750): the
                        engine hard-links each rank's log here (`attempt-<n>/rank-<r>.log`,
                        and `rank-<r>.log` for the latest attempt); mounted by the `logs` source
    env/store/<key>/    built environments, one read-only copy per lock (corral.environments.store)
    env/tools/          what build jobs run: the build step and uv, read-only (corral.environments.tools)
    model/<model id>/v<N>/  a registered model version: a read-only copy (corral.catalog.model_files)

The top-level dirs are root's with 0711 where their entries are private (a job's uid may pass
through to what is bound for it, nobody may list them) and 0755 where they are shared. Only the
server (root) creates and hands over dirs here; jobs see nothing of the root but their binds.
The root itself (ROOT_MODES): 0755 on Slurm, where the job accounts bind what is theirs as
themselves and must pass it; 0700 on the local engine, where only root reaches into it (the
server, the supervisors that open the mount sources, bwrap), so no host account reads a dataset,
model or environment version, wherever the root lies.
Standard library only: both engines import it.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

TOP_DIRS: dict[str, int] = {
    "home": 0o711,
    "group": 0o711,
    "data": 0o755,
    "code": 0o711,
    "outputs": 0o711,
    "logs": 0o711,
    "env": 0o755,
    "model": 0o755,
}
# The root's own mode per engine (see above): only Slurm's job accounts need to pass it
ROOT_MODES: dict[str, int] = {"local": 0o700, "slurm": 0o755}
MARKER = ".corral-storage"  # holds a random id: a node that sees it sees this root (Slurm check)
NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")


class StorageError(ValueError):
    """A storage path or name that cannot be used; the message says which and why."""


def check_name(what: str, name: str) -> str:
    """A user, group or path component: letters, digits, '_', '.', '-' (no '/', NUL, '..')."""
    if not NAME_RE.match(name) or name in (".", ".."):
        raise StorageError(
            f"{what} {name!r} is not a valid name: use letters, digits, '_', '.' or '-' "
            "(at most 64, not starting with '.' or '-')"
        )
    return name


def check_subpath(what: str, sub: str) -> str:
    """A relative path below a storage dir: components as check_name, no '..', no empty parts."""
    if "\x00" in sub or sub.startswith("/"):
        raise StorageError(f"{what} {sub!r} must be a relative path without NUL")
    parts = sub.split("/")
    for part in parts:
        check_name(f"{what} component", part)
    return "/".join(parts)


def through_symlink(path: str) -> bool:
    """Does `path` (absolute) go through a symlink anywhere? A member may plant one in a group dir
    (`evil -> /etc`); binding it would follow it as root. Missing parts do not count."""
    real = os.path.realpath(path)
    return real != os.path.normpath(path) and os.path.lexists(path)


def home_dir(root: Path, user: str) -> Path:
    return root / "home" / check_name("user", user)


def group_dir(root: Path, group: str) -> Path:
    return root / "group" / check_name("group", group)


def outputs_dir(root: Path, job_id: int | str) -> Path:
    return root / "outputs" / str(int(job_id))


def logs_dir(root: Path, user: str) -> Path:
    """The user's logs dir (the `logs` mount source): one subdir per job of theirs."""
    return root / "logs" / check_name("user", user)


def job_logs_dir(root: Path, user: str, job_id: int | str) -> Path:
    return logs_dir(root, user) / str(int(job_id))


@dataclass(frozen=True, slots=True)
class StorageDir:
    """A dir the engine makes (or puts right) before the job starts. owner "user": the job's uid
    (on Slurm: its Unix account); "root": uid 0. gid None: the job's primary gid."""

    path: str
    owner: str  # "user" | "root"
    gid: int | None
    mode: int


def root_mode(engine: str) -> int:
    """The storage root's mode for `engine` (ROOT_MODES); StorageError naming an unknown one."""
    try:
        return ROOT_MODES[engine]
    except KeyError:
        raise StorageError(f"engine {engine!r} is not one of: {', '.join(ROOT_MODES)}") from None


def ensure_layout(root: Path, engine: str) -> str:
    """Create the root and its top dirs with their owners and modes for `engine` (idempotent; as
    root the owner is root:root; an existing root gets the engine's mode). Returns the root's
    marker id."""
    mode = root_mode(engine)
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, mode)
    for name, mode in TOP_DIRS.items():
        path = root / name
        path.mkdir(exist_ok=True)
        _own(path, 0, 0, mode)
    for sub, mode in (("code/blobs", 0o700), ("code/snapshots", 0o711), ("code/incoming", 0o700)):
        (root / sub).mkdir(exist_ok=True)
        _own(root / sub, 0, 0, mode)
    marker = root / MARKER
    if not marker.exists():
        tmp = root / f".{MARKER}.{os.getpid()}"
        tmp.write_text(secrets.token_hex(16) + "\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, marker)
    return marker.read_text().strip()


def layout_problems(root: Path, engine: str) -> list[str]:
    """What is wrong with the root for `engine` (for `corral doctor`): missing dirs, wrong modes."""
    if not root.is_dir():
        return [f"storage root {root} does not exist (the server creates it at start-up)"]
    problems = []
    expected = root_mode(engine)
    if stat.S_IMODE(root.stat().st_mode) != expected:
        problems.append(f"{root} has mode {stat.S_IMODE(root.stat().st_mode):o}, expected {expected:o}")
    for name, mode in TOP_DIRS.items():
        path = root / name
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            problems.append(f"{path} is missing")
            continue
        if not stat.S_ISDIR(st.st_mode):
            problems.append(f"{path} is not a directory")
        elif stat.S_IMODE(st.st_mode) != mode:
            problems.append(f"{path} has mode {stat.S_IMODE(st.st_mode):o}, expected {mode:o}")
        elif os.geteuid() == 0 and st.st_uid != 0:
            problems.append(f"{path} is owned by uid {st.st_uid}, expected root")
    if not (root / MARKER).is_file():
        problems.append(f"{root / MARKER} is missing (the server writes it at start-up)")
    return problems


def _own(path: Path, uid: int, gid: int, mode: int) -> None:
    if os.geteuid() == 0:
        os.lchown(path, uid, gid)
    os.chmod(path, mode)


def prepare_dirs(dirs: list[StorageDir] | tuple[StorageDir, ...], uid: int, gid: int) -> None:
    """Make each dir (its parent must exist) and give it its owner and mode. A user dir owned by
    another uid is a name taken over by a new subject (user deleted and created again): the old
    one is moved aside to `.retired-<name>-<old uid>`, never handed over; so is a group dir of
    another gid. A symlink is refused. A user dir still root's is one another launch of the same
    user is making (mkdir, then chown): launch pools in this process and in other servers prepare
    launches at once, so it is handed over, not moved aside under that launch."""
    as_root = os.geteuid() == 0
    for d in dirs:
        path = Path(d.path)
        want_uid = uid if d.owner == "user" else 0
        want_gid = gid if d.gid is None else d.gid
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise StorageError(f"{path} exists and is not a directory")
        if st is not None and as_root and _taken_over(d, st, want_uid, want_gid):
            old = st.st_uid if d.owner == "user" else st.st_gid
            os.rename(path, path.with_name(f".retired-{path.name}-{old}"))
            st = None
        if st is None:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass  # made by a concurrent launch of the same user
        _set_owner_and_mode(path, d, want_uid, want_gid, as_root)


def _set_owner_and_mode(path: Path, d: StorageDir, uid: int, gid: int, as_root: bool) -> None:
    """Through a descriptor of the dir itself, never by its name: any member of a group may
    rename entries in the group's dir (2770), so between the checks above and here another
    member's job can put a symlink where a user's subdir was, and a chmod by name (as root) would
    change the mode of whatever host path it names."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise StorageError(f"{path} exists and is not a directory") from None
        raise
    try:
        st = os.fstat(fd)
        if as_root and _taken_over(d, st, uid, gid):  # replaced since it was looked at
            raise StorageError(f"{path} was replaced while it was being prepared; launch again")
        if as_root and (st.st_uid, st.st_gid) != (uid, gid):
            os.fchown(fd, uid, gid)
        if stat.S_IMODE(st.st_mode) != d.mode or (as_root and st.st_gid != gid):
            os.fchmod(fd, d.mode)  # after chown: chown clears the setgid bit
    finally:
        os.close(fd)


def _taken_over(d: StorageDir, st: os.stat_result, uid: int, gid: int) -> bool:
    """A user's dir owned by another uid, or a group's dir by another group's gid: the name
    belonged to a deleted subject, whose files the new one must not inherit."""
    if d.owner == "user":
        return st.st_uid not in (uid, 0)  # 0: made a moment ago, before its chown (see above)
    return d.gid is not None and st.st_gid not in (gid, 0)


def remove_outputs(root: Path, job_id: int) -> None:
    """A job's outputs, with the job (services/cleanup.py). Idempotent."""
    shutil.rmtree(outputs_dir(root, job_id), ignore_errors=True)


def remove_job_logs(root: Path, user: str, job_id: int) -> None:
    """A job's log links in its owner's logs dir, with the job (the engine's own copy goes with
    its attempts). Idempotent."""
    shutil.rmtree(job_logs_dir(root, user, job_id), ignore_errors=True)
