"""Process and file helpers of the local engine (engine.py): its supervisors' and launcher's
processes, the attempt dir's atomic writes and reads, the final status it turns into an
AttemptStatus."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason, MountSpec
from corral.engine.isolation import cgroupfs
from corral.engine.isolation.secret_files import remove_secrets
from corral.engine.local.files import (
    LAUNCHER_INFO,
    RUNNING_STATE,
    AttemptSpec,
    FinalStatus,
    LauncherInfo,
    SupervisorInfo,
    read_file,
)
from corral.engine.local.supervisor import proc_start

log = logging.getLogger("corral.engine.local.engine")


def host_path(path: str, mounts: Sequence[MountSpec]) -> str:
    """Where `path` (a path in the job) is on the host, through the bind that holds it."""
    for m in mounts:
        if path == m.target or path.startswith(m.target + "/"):
            return m.source + path[len(m.target) :]
    return path


def child_running(pid: int) -> bool:
    """For a supervisor we spawned: True while it runs; reaps it once it has ended."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


def home_tag(home: Path) -> str:
    return hashlib.sha256(str(home.resolve()).encode()).hexdigest()[:10]


def same_process(pid: int, sup: SupervisorInfo | None) -> bool:
    """Guards against pid reuse: alive, and (once it said so) started when our supervisor did."""
    start = proc_start(pid)
    if start is None:
        return False
    return sup is None or sup["proc_start"] in (None, start)


def cmdline_has(pid: int, text: str) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return text.encode() in f.read()
    except OSError:
        return False


def spawn_detached(argv: list[str], stderr_path: Path) -> int:
    """posix_spawn (vfork-based, cheap from a big server process) in a new session: not in the
    server's session or process group, so a kill of the server spares it."""
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, str(stderr_path), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640),
    ]
    return os.posix_spawn(argv[0], argv, {"PATH": "/usr/bin:/bin"}, file_actions=actions, setsid=True)


def final_status(attempt_id: str, data: FinalStatus, ref: str) -> AttemptStatus:
    reason = data["reason"]
    return AttemptStatus(
        attempt_id=attempt_id,
        phase=AttemptPhase(data["phase"]),
        exit_code=data["exit_code"],
        reason=FailureReason(reason) if reason else None,
        message=data["message"],
        started_at=data["started_at"],
        finished_at=data["finished_at"],
        engine_ref=ref,
    )


def lost_status() -> FinalStatus:
    """An attempt whose supervisor died before every instance's end was on record."""
    return {
        "phase": "lost",
        "exit_code": None,
        "reason": FailureReason.NODE_LOST.value,
        "message": "the attempt's supervisor ended without recording an outcome",
        "started_at": None,
        "finished_at": time.time(),
    }


def clean_up_dead_attempt(adir: Path, spec: AttemptSpec | None) -> None:
    """What a dead supervisor's clean-up would have done that matters once it is gone: its
    secrets removed, its instances' process groups and whatever its cgroups still hold killed and
    the cgroups removed, its work dirs closed and its uid lock released (supervisor.finish)."""
    remove_secrets(str(adir / "secrets"))
    kill_instance_groups(adir)
    for inst in spec["instances"] if spec is not None else ():
        cgroup = inst["cgroup"]
        if cgroup:
            cgroupfs.kill_all(cgroup, timeout_s=2.0)
            cgroupfs.remove(cgroup, attempts=5)
            cgroupfs.remove_attempt_dirs(cgroup)
    if spec is not None and spec["uid_lock"]:
        release_uid_lock(Path(spec["uid_lock"]), adir)


def release_uid_lock(lock: Path, adir: Path) -> None:
    """Gives a per-attempt uid back, once nothing of the attempt runs: its work dirs are first
    closed (root's, 0700), as the supervisor's clean-up does, so a later job given the same uid
    cannot reach the files this one left. Its lock dir is removed only while it is this
    attempt's (`attempt` names it)."""
    work = adir / "work"
    for d in [work, *work.iterdir()] if work.is_dir() else ():
        try:
            os.chown(d, 0, 0)
            os.chmod(d, 0o700)
        except OSError:
            return  # not closed: the uid stays held rather than reach its files
    if read_text(lock / "attempt") != adir.name:
        return
    try:
        os.remove(lock / "attempt")
        os.rmdir(lock)
    except OSError:
        pass


def kill_instance_groups(adir: Path) -> None:
    """SIGKILL to each instance's process group (its child did setsid(): group id = its pid).
    Without cgroups this is all that finds an unsandboxed job's processes once its supervisor is
    dead (a sandbox dies with its supervisor: bwrap's --die-with-parent). A pid is never reused
    while it names a live group, so the group is ours when no process has the pid any more (its
    members, if any, are the job's) or when the process that has it started when the instance
    did (state.json's starts); another start time means the pid was reused: left alone. An
    instance whose supervisor died before state.json had checked its parent and exited
    (supervisor.ORPHANED_EXIT) or is in the cgroups killed next."""
    state = read_file(adir / "state.json", RUNNING_STATE)
    if state is None:
        return
    starts = state.get("starts") or {}
    for rank, pid in state["pids"].items():
        if not pid:
            continue
        now = proc_start(pid)
        if now is not None and (starts.get(rank) is None or starts[rank] != now):
            continue  # unknown start (a file from before starts were kept), or the pid was reused
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Atomic: readers see the old file or the whole new one. `mode` is set at creation (umask
    aside), so a file for root alone is never readable by others, not even for a moment."""
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.unlink(missing_ok=True)  # one a crash left (with whatever mode it had) is not reused
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_json(path: Path, data: FinalStatus) -> None:
    write_atomic(path, json.dumps(data).encode())


def read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


CGROUP_CONTROLLERS = ("memory", "cpu", "pids", "devices")  # v1; v2 has the parent at the root


def remove_empty_cgroups(cgroup_root: Path, parent: str, wait_s: float) -> None:
    """rmdir of a home's cgroup parent (each controller, v1 and v2) where it is empty: not where
    it has cgroups below it (running attempts', or an instance's made for a launch whose process
    has not joined it yet)."""
    rmdir_cgroup_tops(cgroup_tops(cgroup_root, parent), _rmdir_quietly, _has_cgroups, wait_s)


def remove_unjoined_cgroups(cgroup_root: Path, parent: str, attempt_id: str) -> None:
    """rmdir of an attempt's cgroups (`<parent>/<attempt_id>/<rank>`, each controller) and of
    its level, for a launch that failed before any supervisor could run it: no process ever
    joined them, so they are empty. Made by rank from the attempt's name, not from handles, so a
    cgroup whose limits could not be written (made, but no handle returned) goes too."""
    for top in cgroup_tops(cgroup_root, parent):
        level = top / attempt_id
        try:
            ranks = [entry.path for entry in os.scandir(level) if entry.is_dir()]
        except OSError:
            continue
        for path in [*ranks, str(level)]:
            try:
                os.rmdir(path)
            except OSError as exc:
                log.warning("could not remove the cgroup %s of a failed launch: %s", path, exc)


def cgroup_tops(cgroup_root: Path, parent: str) -> list[Path]:
    """A home's cgroup parent in each controller (v1) and in the unified tree (v2)."""
    return [*(cgroup_root / c / parent for c in CGROUP_CONTROLLERS), cgroup_root / parent]


def rmdir_cgroup_tops(
    tops: list[Path], remove: Callable[[Path], None], busy: Callable[[Path], bool], wait_s: float
) -> None:
    """`remove(top)` for each top until none is left. The kernel may refuse an rmdir for a moment
    after a cgroup's last process exits: retried for up to `wait_s`, but not while `busy(top)`
    says something below it stays."""
    deadline = time.monotonic() + wait_s
    while True:
        for top in tops:
            remove(top)
        left = [top for top in tops if top.exists()]
        if not left or time.monotonic() >= deadline or any(busy(top) for top in left):
            return
        time.sleep(0.05)


def _rmdir_quietly(path: Path) -> None:
    try:
        os.rmdir(path)
    except OSError:
        pass


def _has_cgroups(top: Path) -> bool:
    try:
        return any(entry.is_dir() for entry in os.scandir(top))
    except OSError:
        return False


def ask_launcher(sock: Path, adir: Path) -> int | None:
    """The pid of the supervisor the launcher (launcher.py) forked for `adir`; None when no
    launcher answers or it refused (the caller then starts the supervisor directly)."""
    if not sock.exists():
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(2.0)
            conn.connect(str(sock))
            conn.sendall(str(adir).encode())
            conn.shutdown(socket.SHUT_WR)
            answer = conn.recv(4096).decode()
    except OSError as exc:
        log.debug("launcher unavailable (%s): starting the supervisor directly", exc)
        return None
    if not answer.isdigit():
        log.warning("launcher refused %s: %s", adir, answer)
        return None
    return int(answer)


def running_launcher(sock: Path) -> int | None:
    """The pid of the launcher serving `sock`, if it runs."""
    info: LauncherInfo | None = read_file(sock.with_name(sock.name + ".json"), LAUNCHER_INFO)
    if info is None:
        return None
    pid = info["pid"]
    if proc_start(pid) is None or not cmdline_has(pid, str(sock)):
        return None
    return pid
