"""The execution-engine interface: the one seam between Corral's control loops and whatever
actually runs processes (the local supervisor engine, Slurm, later Kubernetes).

Rules every engine follows (the contract test suite in tests/engine/contract.py checks them):
- Calls are idempotent: `launch` of an attempt already launched returns the same handle and
  starts nothing twice; `stop` of a finished attempt is a no-op.
- "Not done yet" is a normal answer: `poll` reports PENDING/RUNNING without blocking.
- The engine owns no database. What it must remember across a server restart (which attempts it
  launched, their exit codes) it keeps in its own durable place (state files, Slurm itself), and
  `adopt` reattaches to attempts by id after a restart.
- One launch is one whole attempt of one job: every instance of every task role, already placed
  by Corral's scheduler. The engine does not choose nodes or GPUs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, runtime_checkable

from corral.scheduler.types import GPU, NodeState
from corral.storage.layout import StorageDir

# What the server's loops ask of an engine that has no reason to differ (the local engine): the
# reconcile loop polls it every 0.1 s, four launches run at once, and no job is handed to it ahead
# of a free slot. The Slurm engine sets its own (corral.engine.slurm.engine).
DEFAULT_POLL_INTERVAL_S = 0.1
DEFAULT_LAUNCH_WORKERS = 4
DEFAULT_QUEUE_AHEAD_DEPTH = 0


@dataclass(frozen=True, slots=True)
class NodeReport:
    """A node as the engine sees it: capacity, GPUs and health."""

    name: str
    cpus: float
    memory_mib: int
    gpus: tuple[GPU, ...] = ()
    state: NodeState = NodeState.READY
    address: str = "127.0.0.1"  # where other instances of a job reach this node (MASTER_ADDR)
    labels: Mapping[str, str] = field(default_factory=dict)
    message: str = ""  # why the node is not ready, when the engine knows


@dataclass(frozen=True, slots=True)
class MountSpec:
    source: str  # host path
    target: str  # path inside the task
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class InstanceLaunch:
    """One task instance of an attempt, placed on one node with its GPUs."""

    role: str
    index: int  # index within its role
    rank: int  # global rank across the whole job (0 = master)
    node: str
    gpus: tuple[GPU, ...]
    cpus: float
    memory_mib: int
    command: str  # run by /bin/sh -c
    env: Mapping[str, str]  # includes CORRAL_*, MASTER_ADDR, WORLD_SIZE, RANK, CUDA_VISIBLE_DEVICES


@dataclass(frozen=True, slots=True)
class SecretGrant:
    """One secret's value for one attempt, fetched (decrypted) at dispatch: the job gets it as the
    environment variable `env` and/or the file `file` under its secrets dir (/run/secrets in the
    sandbox). Only in memory: engines write it where the job alone can read it and remove it when
    the attempt ends; it is never part of a record, a log or a repr."""

    name: str
    value: bytes = field(repr=False)
    env: str | None = None
    file: str | None = None


@dataclass(frozen=True, slots=True)
class AttemptLaunch:
    """Everything an engine needs to start one attempt of a job."""

    attempt_id: str  # globally unique and stable, e.g. "42.1" (job 42, attempt 1)
    job_id: str
    attempt: int
    user: str  # owner's user name (isolation maps it to an unprivileged uid)
    group: str
    instances: tuple[InstanceLaunch, ...]
    max_runtime_s: float | None = None
    mounts: tuple[MountSpec, ...] = ()
    environment: str = "default"  # local: a named Python environment; slurm/k8s: an image
    # Storage (corral.storage.plan): the user's stable uid and the gids of their groups (local
    # engine; None: a throw-away uid per attempt), the dirs to make before binding `mounts`, the
    # job's cwd and HOME in the sandbox, and why it may not run at all (mounts it lost the right to).
    uid: int | None = None
    gids: tuple[int, ...] = ()
    storage_dirs: tuple[StorageDir, ...] = ()
    cwd: str | None = None
    home: str | None = None
    refused: str = ""
    secrets: tuple[SecretGrant, ...] = ()  # values only in memory (see SecretGrant)
    # A catalogue environment (corral.environments): its bin dir in the job, first on PATH, and
    # the dirs bound read-only at their own paths (its interpreter) instead of the engine's
    # "default" ones; "internet": a build job's outbound network to the package index.
    environment_bin: str = ""
    environment_paths: tuple[str, ...] = ()
    network_outbound: str = ""
    # The job's dir in its owner's logs dir (corral.storage.layout.job_logs_dir), where the
    # engine hard-links each rank's log for the `logs` mount source (corral.engine.log_links);
    # "" none.
    log_dir: str = ""


class AttemptPhase(StrEnum):
    PENDING = "pending"  # accepted by the engine, not running yet
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # see exit_code / reason
    LOST = "lost"  # the engine no longer knows it (node crashed, state lost)

    @property
    def finished(self) -> bool:
        return self in (AttemptPhase.SUCCEEDED, AttemptPhase.FAILED, AttemptPhase.LOST)


class FailureReason(StrEnum):
    """Coded reasons an attempt ended badly. Engines set the code; log-signature diagnosis may
    refine EXIT_CODE into CUDA_OOM, NCCL_HANG, GPU_ERROR or USER_ERROR afterwards."""

    EXIT_CODE = "exit_code"  # non-zero exit
    OOM = "oom"  # killed by the kernel inside its memory limit (from cgroup counters)
    CUDA_OOM = "cuda_oom"
    NCCL_HANG = "nccl_hang"
    GPU_ERROR = "gpu_error"
    USER_ERROR = "user_error"  # e.g. command not found, import error
    SIGNAL = "signal"  # killed by a signal not sent by Corral
    STOPPED = "stopped"  # stopped by Corral (cancel, preemption)
    TIMEOUT = "timeout"  # exceeded max_runtime
    NODE_LOST = "node_lost"
    LAUNCH_FAILED = "launch_failed"  # the engine refused or could not start it (message says why)
    # Corral could not read how it ended for too long (its own fault, not the job's; Slurm)
    STATUS_UNREADABLE = "status_unreadable"


@dataclass(frozen=True, slots=True)
class AttemptStatus:
    attempt_id: str
    phase: AttemptPhase
    exit_code: int | None = None
    reason: FailureReason | None = None
    message: str = ""  # human detail: "signal 9", Slurm's own rejection text, ...
    started_at: float | None = None  # unix seconds
    finished_at: float | None = None
    engine_ref: str = ""  # the engine's own id (supervisor pid, Slurm job id)


@dataclass(frozen=True, slots=True)
class LogChunk:
    data: bytes
    next_offset: int
    eof: bool  # True once the attempt has finished and everything was read


@dataclass(frozen=True, slots=True)
class ExecCommand:
    """How to run a process inside one instance of a running attempt (`Engine.exec_command`):
    the caller spawns `argv` on the server's host with exactly `env` as its environment and its
    fds 0-2 on pipes or a PTY (for a PTY: as a session leader with the PTY as its controlling
    terminal, e.g. under `setsid --ctty`). The process it starts runs in the instance's sandbox:
    same namespaces (network included), cgroup, mounts, uid and GPUs as the job; it dies with the
    attempt. `env` may hold the job's secret values, hence no repr."""

    argv: tuple[str, ...]
    env: Mapping[str, str] = field(repr=False)
    cwd: str = "/"  # host-side working dir for the spawn itself (the command's is set by argv)


class ExecRefused(Exception):
    """`exec_command` cannot enter the attempt: unknown, not running (yet or any more), no such
    rank. The message says which, for the user."""


class EngineUnavailable(RuntimeError):
    """The engine's backend cannot be reached right now (e.g. slurmctld down). Callers keep
    state as it is and try again; nothing is failed because of this alone."""


@runtime_checkable
class Engine(Protocol):
    name: str
    # How the server's loops pace this engine (each engine sets all three; the defaults above):
    # poll_interval_s: seconds between the reconcile loop's polls (server.runner.collect_loops).
    # An engine that learns of an ending only by asking (Slurm's squeue) polls often, since
    # Corral holds a job's resources until then.
    poll_interval_s: float
    # launch_workers: how many `launch` calls the server runs at once (server.dispatch), >= 1;
    # more where a launch is mostly waiting on a round trip (sbatch to slurmctld).
    launch_workers: int
    # queue_ahead_depth: how many node-fulls of jobs the server may hand to the engine's own
    # queue ahead of a free slot (server.ahead); 0: the engine has no such queue.
    queue_ahead_depth: int

    def nodes(self) -> Sequence[NodeReport]: ...

    def launch(self, attempt: AttemptLaunch) -> str:
        """Start the attempt (idempotent per attempt_id); returns the engine's ref."""
        ...

    def poll(self, attempt_ids: Iterable[str]) -> Mapping[str, AttemptStatus]:
        """Current status of the given attempts. Unknown ids come back as LOST."""
        ...

    def stop(self, attempt_id: str, grace_s: float) -> None:
        """SIGTERM the attempt's processes, wait up to grace_s, then kill everything left.
        Returns without waiting for the grace period to pass."""
        ...

    def logs(self, attempt_id: str, instance: int = 0, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        """Combined stdout/stderr of one instance (by rank), from byte `offset`."""
        ...

    def adopt(self, refs: Mapping[str, str]) -> None:
        """After a restart: reattach to attempts launched earlier ({attempt_id: engine_ref})."""
        ...

    def set_node_state(self, node: str, state: NodeState, reason: str = "") -> None:
        """Reflect a cordon/drain/uncordon issued in Corral into the engine (no-op for local)."""
        ...

    def remove_attempt(self, attempt_id: str) -> None:
        """Delete what the engine keeps of a FINISHED attempt (logs, state files): job deletion
        and retention. Idempotent; an attempt that has not finished is left alone. Afterwards
        `logs` answers empty with eof."""
        ...

    def exec_command(self, attempt_id: str, rank: int, argv: Sequence[str]) -> ExecCommand:
        """The host-side command that runs `argv` (no shell; PATH, HOME and the rest of the
        job's own environment apply) inside rank `rank` of a RUNNING attempt; ExecRefused naming
        why when the attempt is unknown, not running or has no such rank. Starts nothing."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ListsAttempts(Protocol):
    """An engine that can say which attempts it still runs (the local engine: its attempts
    without a final status, from its live index). The server's sweep (server/sweep.py) stops
    those whose database row has ended: a server killed between that commit and its stop left
    them running. Slurm's own node-loss handling ends its jobs, so it does not offer this."""

    def active_attempts(self) -> list[str]:
        """Ids of the attempts launched here that have not finished (cheap enough every 5 s)."""
        ...
