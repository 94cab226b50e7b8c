"""The files through which the local engine and its supervisors talk (see supervisor.py), typed.

Both sides write and read these shapes; the supervisor imports this module only for the type
checker (it must start without `typing`), the engine at run time, where it validates what it reads
(`read_file`), so a file of the wrong shape reads as unreadable instead of failing later on a
missing key.
"""

from __future__ import annotations

from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Literal,
    NotRequired,  # pydantic validates only these on 3.11
    TypeVar,
)

from pydantic import TypeAdapter
from typing_extensions import TypedDict

if TYPE_CHECKING:  # defined for the type checker only: cgroupfs imports nothing at run time
    from corral.engine.isolation.cgroupfs import CgroupHandle

T = TypeVar("T")


class InstanceSpec(TypedDict):
    """One instance in spec.marshal: what to exec, where, under which cgroup."""

    rank: int
    argv: list[str]
    env: dict[str, str]
    cwd: str
    log: str
    work_dir: str
    cgroup: CgroupHandle | None
    sandboxed: bool
    memory_mib: int
    # env var -> file holding a secret's value (isolation/secret_files.py): read into the
    # instance's environment at exec, so the values are never in this file
    secret_env: NotRequired[dict[str, str]]
    # where in argv the mounts' host paths stand, which the supervisor opens and replaces by
    # the fds it hands bwrap (isolation/bind_sources.py)
    bind_fds: NotRequired[list[int]]
    # the file bwrap writes its --json-status-fd lines to (its host path stands in argv after
    # the option until the supervisor's child opens it): whether the job's command ever ran
    # (isolation/bwrap_status.py)
    bwrap_status: NotRequired[str]


class NetworkSpec(TypedDict):
    """The attempt's network in spec.marshal (isolation/netns.py): absent or None = the host's."""

    outbound: str  # none | internet
    slirp4netns: str | None  # path of the binary, for outbound internet


class AttemptSpec(TypedDict):
    """spec.marshal, written by the engine before the supervisor starts."""

    attempt_id: str
    max_runtime_s: float | None
    gang_grace_s: float
    uid_lock: str | None
    uid: int
    instances: list[InstanceSpec]
    network: NotRequired[NetworkSpec | None]


class SupervisorInfo(TypedDict):
    """supervisor.json: written once the supervisor's signals are blocked, by the attempt's first
    supervisor only (a second one finds it and runs nothing)."""

    pid: int
    proc_start: str | None  # with the pid, names the process for good (pids are reused)
    started_at: float


class LauncherInfo(TypedDict):
    """launcher.sock.json: the launcher's pid."""

    pid: int


class RunningState(TypedDict):
    """state.json: every instance has been started."""

    phase: Literal["running"]
    pids: dict[str, int | None]  # rank -> pid
    # rank -> that pid's kernel start time (supervisor.proc_start): the engine kills an instance's
    # process group after its supervisor died only while the pid is still that process (or gone)
    starts: NotRequired[dict[str, str | None]]
    started_at: float


class InstanceOutcome(TypedDict):
    exit_code: int | None
    oom: bool


class Outcome(TypedDict):
    """How an attempt ended; reason is a corral.engine.base.FailureReason value."""

    phase: Literal["succeeded", "failed", "lost"]
    exit_code: int | None
    reason: str | None
    message: str


class FinalStatus(Outcome):
    """status.json: written last, by the supervisor (or by the engine for a refused launch or a
    supervisor that died without a word). ended.json, of the same shape, is what the supervisor
    will write there, recorded before its clean-up: the engine publishes it as status.json when
    the supervisor died during that clean-up."""

    started_at: float | None
    finished_at: float
    instances: NotRequired[dict[str, InstanceOutcome]]  # rank -> outcome; supervisor only


SUPERVISOR_INFO = TypeAdapter(SupervisorInfo)
LAUNCHER_INFO = TypeAdapter(LauncherInfo)
RUNNING_STATE = TypeAdapter(RunningState)
FINAL_STATUS = TypeAdapter(FinalStatus)


def read_file(path: Path, shape: TypeAdapter[T]) -> T | None:
    """The file as `shape`; None when it is missing, not JSON or not of that shape (the writers
    replace files atomically, so a reader never sees half of one)."""
    try:
        return shape.validate_json(path.read_bytes())
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
