"""The Slurm engine's own durable memory: one JSON file per attempt, next to its scripts and logs.

It holds what Slurm may forget or never knew: the Slurm job id (so launch is idempotent and a
restarted server re-adopts), a stop Corral requested (kind, deadline) and the terminal status once
seen (so a finished attempt is reported the same way forever, exactly once as finished even after
Slurm purged the job after MinJobAge).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Required, TypedDict, cast

from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason
from corral.engine.isolation.bwrap_status import EXEC_MARK, LOG_TAIL_BYTES, MAX_MESSAGE_CHARS
from corral.engine.slurm.cli import SlurmNode
from corral.engine.slurm.mapping import SandboxRefusal
from corral.engine.slurm.scripts import BWRAP_NO_STATUS, BWRAP_NOT_STARTED, BWRAP_STATUS_FILE, SUBMISSION_FILE

_EXIT_STATUS = re.compile(rb"[0-9]{1,3}")  # what `echo "$rc"` writes, newline stripped
RECORD_CACHE_SIZE = 4096  # attempt records kept in memory (StateStore.load)


@dataclass
class StopRequest:
    requested_at: float
    grace_s: float
    # "stopped" (cancel, preemption), "timeout" (max_runtime) or "status_unreadable" (its status
    # could not be read for too long: engine.SlurmEngine._fail_unreadable)
    kind: str = "stopped"
    killed: bool = False  # the final kill after the grace period was sent

    @property
    def deadline(self) -> float:
        return self.requested_at + self.grace_s


class FinalStatus(TypedDict, total=False):
    """The AttemptStatus fields of a finished attempt, as kept in attempt.json (records written
    by older versions may lack the optional ones)."""

    phase: Required[str]
    exit_code: int | None
    reason: str | None
    message: str
    started_at: float | None
    finished_at: float | None
    engine_ref: str


@dataclass
class AttemptRecord:
    attempt_id: str
    slurm_job_id: str = ""
    submitted_at: float = 0.0
    n_ranks: int = 1
    max_runtime_s: float | None = None
    unix_user: str = ""  # the account the job runs as ("" in records written before it was kept)
    uid: int | None = None  # its uid: files the job wrote are only read when it owns them
    stop: StopRequest | None = None
    final: FinalStatus | None = field(default=None)  # AttemptStatus fields once finished

    @property
    def ref(self) -> str:
        return self.slurm_job_id

    def final_status(self) -> AttemptStatus | None:
        if self.final is None:
            return None
        f = self.final
        reason = f.get("reason")
        return AttemptStatus(
            attempt_id=self.attempt_id,
            phase=AttemptPhase(f["phase"]),
            exit_code=f.get("exit_code"),
            reason=FailureReason(reason) if reason else None,
            message=f.get("message", ""),
            started_at=f.get("started_at"),
            finished_at=f.get("finished_at"),
            engine_ref=f.get("engine_ref", ""),
        )

    def set_final(self, status: AttemptStatus) -> None:
        self.final = {
            "phase": status.phase.value,
            "exit_code": status.exit_code,
            "reason": status.reason.value if status.reason else None,
            "message": status.message,
            "started_at": status.started_at,
            "finished_at": status.finished_at,
            "engine_ref": status.engine_ref,
        }


def _copy(record: AttemptRecord) -> AttemptRecord:
    """A copy whose stop and final a caller may change. Field by field, not dataclasses.replace:
    the poll copies every live attempt's record on every load, and replace() (which walks the
    fields and calls __init__) cost ~3x as much."""
    copy = object.__new__(AttemptRecord)
    copy.__dict__.update(record.__dict__)
    if record.stop is not None:
        stop = record.stop
        copy.stop = StopRequest(stop.requested_at, stop.grace_s, stop.kind, stop.killed)
    if record.final is not None:
        copy.final = cast(FinalStatus, dict(record.final))
    return copy


def _as_json(record: AttemptRecord) -> str:
    """The record as attempt.json holds it (what load() reads back). Written by hand, not with
    dataclasses.asdict (which deep-copies every value), and compact: with `indent` the json
    module falls back from its C encoder to the pure-Python one. Three saves per attempt."""
    stop = record.stop
    data = {
        "attempt_id": record.attempt_id,
        "slurm_job_id": record.slurm_job_id,
        "submitted_at": record.submitted_at,
        "n_ranks": record.n_ranks,
        "max_runtime_s": record.max_runtime_s,
        "unix_user": record.unix_user,
        "uid": record.uid,
        "stop": None
        if stop is None
        else {
            "requested_at": stop.requested_at,
            "grace_s": stop.grace_s,
            "kind": stop.kind,
            "killed": stop.killed,
        },
        "final": record.final,
    }
    return json.dumps(data, separators=(",", ":"))


_record_names = itertools.count()  # this process's record files: .rec-<pid>-<n>.json


class UnsafeJobFile(OSError):
    """A file in a job dir that is not a plain file of the job's own (a symlink or a FIFO the job
    put there to make the server read or block on something else)."""


def read_job_file(
    path: Path, owner: int | None, offset: int = 0, limit: int = -1
) -> tuple[bytes, int, float]:
    """(data from offset, file size, mtime) of a file the job wrote, read by the root server
    without following a symlink or blocking on a FIFO, and only when the job's uid owns it:
    `ln -s $CORRAL_HOME/config.yaml rank-0.log` must not hand the admin token to `corral logs`."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)  # ELOOP on a symlink
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or (owner is not None and st.st_uid != owner):
            raise UnsafeJobFile(f"{path} is not a plain file of uid {owner}")
        with os.fdopen(os.dup(fd), "rb") as f:
            f.seek(offset)
            return f.read(limit), st.st_size, st.st_mtime
    finally:
        os.close(fd)


class StateStore:
    """Layout (docs/slurm.md, "Who runs the job"):

    <root>/                      server, 0711: jobs may pass, not list
      attempts/<id>/             server, 0711: attempt.json (symlink to the record, 0600), stop, kill
                                 markers, `submission` (the current submission's token, 0644),
                                 bwrap-R.status (the job's account's, 0600: scripts.BWRAP_STATUS_FILE)
      attempts/<id>/job/         the job's account, 0700: scripts, logs, exit codes, work dirs
      unreadable/<id>            server, 0600: when the attempt's status was first unreadable,
                                 its mtime when last seen so (unreadable.SINCE_DIR; while it is so)
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.attempts = root / "attempts"
        self.attempts.mkdir(parents=True, exist_ok=True)
        # attempt id -> ((inode, size, mtime_ns) of attempt.json when read, the record read)
        self._cache: dict[str, tuple[tuple[int, int, int], AttemptRecord]] = {}
        for d in (self.root, self.attempts):
            os.chmod(d, 0o711)
        self._attempts_str = str(self.attempts)  # load() builds its path as a str: polls load a lot

    def attempt_dir(self, attempt_id: str) -> Path:
        return self.attempts / attempt_id

    def job_dir(self, attempt_id: str) -> Path:
        return self.attempt_dir(attempt_id) / "job"

    def unreachable_parent(self) -> Path | None:
        """The first directory above the job dirs that other accounts may not pass through
        (no o+x), if any: jobs run as their users' accounts and could not reach their files."""
        for d in (self.attempts, *self.attempts.resolve().parents):
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return d
        return None

    def job_file(self, attempt_id: str, name: str) -> str:
        """The path of file `name` in the attempt's job dir, as a str (the poll checks one per live
        attempt many times a second; job_dir builds Paths)."""
        return f"{self._attempts_str}/{attempt_id}/job/{name}"

    def new_submission(self, attempt_id: str) -> str:
        """A fresh token for the attempt's next sbatch, made its current one (atomically; the job's
        scripts read it as the job's account, see scripts.SUBMISSION_FILE). Written before each
        sbatch: a submission whose answer was lost and that reaches slurmctld after a later one
        carries an older token, and its scripts run nothing."""
        token = secrets.token_hex(8)
        directory = self.attempt_dir(attempt_id)
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o644)
            f.write(token + "\n")
        os.replace(tmp, directory / SUBMISSION_FILE)
        return token

    def submission(self, attempt_id: str) -> str:
        """The attempt's current submission token ("" before its first sbatch, or for an attempt
        submitted by a version without tokens)."""
        try:
            return (self.attempt_dir(attempt_id) / SUBMISSION_FILE).read_text().strip()
        except FileNotFoundError:
            return ""

    def _record_path(self, attempt_id: str) -> str:
        """attempt.json's path as a str (load() builds it on every poll; Paths cost more)."""
        return f"{self._attempts_str}/{attempt_id}/attempt.json"

    def _file(self, attempt_id: str) -> Path:
        return Path(self._record_path(attempt_id))

    def load(self, attempt_id: str) -> AttemptRecord | None:
        """The attempt's record (a copy of its own: callers change and save it). The server polls
        every live attempt many times a second: a record whose file is unchanged since it was
        last read (same inode, size and mtime: save() always writes a new file) comes from memory."""
        path = self._record_path(attempt_id)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            self._cache.pop(attempt_id, None)
            return None
        key = (st.st_ino, st.st_size, st.st_mtime_ns)
        cached = self._cache.get(attempt_id)
        if cached is not None and cached[0] == key:
            return _copy(cached[1])
        try:
            data = json.loads(Path(path).read_text())
        except FileNotFoundError:
            return None
        stop = data.pop("stop", None)
        record = AttemptRecord(**data, stop=StopRequest(**stop) if stop else None)
        self._remember(attempt_id, key, record)
        return record

    def save(self, record: AttemptRecord) -> None:
        path = self._file(record.attempt_id)
        self._swap_in(path, _as_json(record))
        st = os.stat(path)  # what this process wrote is what the next load returns
        self._remember(record.attempt_id, (st.st_ino, st.st_size, st.st_mtime_ns), record)

    def _remember(self, attempt_id: str, key: tuple[int, int, int], record: AttemptRecord) -> None:
        if len(self._cache) >= RECORD_CACHE_SIZE:
            self._cache.clear()  # forget attempts long finished; live ones are read again once
        self._cache[attempt_id] = (key, _copy(record))

    def _exit_files(self, attempt_id: str, n_ranks: int, owner: int | None) -> list[tuple[float, int, int]]:
        """(mtime, rank, exit code) of every rank-R.exit the job wrote for a rank it has (0 <= R <
        n_ranks) holding a shell's exit status (0-255); any other file is skipped. The job's
        account can write its job dir, so its names and contents are not trusted: a rank taken
        from a name such as rank--5.exit or rank-3000000.exit once crashed or stalled every
        reconcile tick, and an exit code past 255 was refused by the database."""
        found = []
        for rank in range(n_ranks):
            path = self.job_dir(attempt_id) / f"rank-{rank}.exit"
            try:
                data, _, mtime = read_job_file(path, owner, limit=64)
            except OSError:
                continue
            text = data.strip()
            if _EXIT_STATUS.fullmatch(text) and int(text) <= 255:
                found.append((mtime, rank, int(text)))
        return found

    def rank_exits(self, attempt_id: str, n_ranks: int, owner: int | None = None) -> dict[int, int]:
        """Exit codes the instances wrote (rank-R.exit), in the order they ended (the first
        failure is the cause; the others were killed because of it). A killed rank writes none."""
        return {rank: code for _, rank, code in sorted(self._exit_files(attempt_id, n_ranks, owner))}

    def first_failure_time(self, attempt_id: str, n_ranks: int, owner: int | None = None) -> float | None:
        """When the first instance ended with a non-zero code (unix seconds), if one did."""
        times = [mtime for mtime, _, code in self._exit_files(attempt_id, n_ranks, owner) if code != 0]
        return min(times) if times else None

    def sandbox_refusal(
        self, attempt_id: str, n_ranks: int, exits: dict[int, int], owner: int | None = None
    ) -> SandboxRefusal | None:
        """The refusal when the first rank to fail (the first non-zero code in `exits`, which
        rank_exits orders as the ranks ended: the cause) was bwrap refusing to set up its sandbox:
        it exited by itself (code 1-127; 128 and up is a signal: a stop's or the OOM killer's KILL
        writes nothing), its bwrap was started (its rank script truncated scripts.BWRAP_NOT_STARTED
        away) and wrote no exit-code line. Its `ran` names the ranks whose command may have run
        (_may_have_run), which make it the job's own failure (mapping.terminal_status). None
        otherwise, and where there are no status files (a bubblewrap without --json-status-fd:
        the exit stays the job's)."""
        failing = [(rank, code) for rank, code in exits.items() if code != 0]
        if not failing:
            return None
        ranks = range(n_ranks)  # exits has only ranks below n_ranks (_exit_files)
        statuses = [self._bwrap_status(attempt_id, r, owner) for r in ranks]
        rank, code = _first_cause(failing, statuses)
        status = statuses[rank]
        if status is None or not 0 < code < 128 or EXEC_MARK in status:
            return None
        if status.startswith((BWRAP_NOT_STARTED, BWRAP_NO_STATUS)):
            return None  # the rank script's own refusal (before bwrap), or a bwrap that says nothing
        why = self._bwrap_said(attempt_id, rank, owner)
        why = why or f"bwrap exited with code {code} before starting the job's command"
        ran = tuple(r for r in ranks if _may_have_run(statuses[r], exits.get(r)))
        return SandboxRefusal(rank, code, why, ran)

    def _bwrap_status(self, attempt_id: str, rank: int, owner: int | None) -> bytes | None:
        """What rank's bwrap wrote to its status file (scripts.BWRAP_STATUS_FILE); None without one."""
        path = self.attempt_dir(attempt_id) / BWRAP_STATUS_FILE.format(rank=rank)
        try:
            return read_job_file(path, owner, limit=LOG_TAIL_BYTES)[0]
        except OSError:
            return None

    def _bwrap_said(self, attempt_id: str, rank: int, owner: int | None) -> str:
        """The last `bwrap: ` line of the rank's log (bwrap's stderr), or ""."""
        path = self.log_path(attempt_id, rank)
        try:
            size = read_job_file(path, owner, limit=0)[1]
            tail = read_job_file(path, owner, max(0, size - LOG_TAIL_BYTES), LOG_TAIL_BYTES)[0]
        except OSError:
            return ""
        for line in reversed(tail.decode("utf-8", errors="replace").splitlines()):
            if line.startswith("bwrap: "):
                line = line.strip()
                return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 3] + "..."
        return ""

    def log_path(self, attempt_id: str, rank: int) -> Path:
        return self.job_dir(attempt_id) / f"rank-{rank}.log"

    def save_nodes(self, nodes: list[SlurmNode]) -> None:
        self._atomic_write(self.root / "nodes.json", json.dumps(nodes))

    def load_nodes(self) -> list[SlurmNode]:
        try:
            data = json.loads((self.root / "nodes.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return []
        return data if isinstance(data, list) else []

    @staticmethod
    def _swap_in(path: Path, text: str) -> None:
        """Atomically make `path` (a symlink) name a new file holding `text`. Not the usual
        write-temp-then-rename-over: on ext4 (auto_da_alloc) renaming a file over an existing one
        flushes its data first, which took 5-10 ms per save on a busy disk here, and the reconcile
        loop saves every attempt it sees end, one after another. Renaming a symlink over the old
        one flushes nothing; the file it named before is removed after. A crash in between leaves
        at most a stray `.rec-*` file, and `path` always names a complete record."""
        data = _new_record_file(path.parent, text.encode())
        try:
            before = os.readlink(path)
        except OSError:  # none yet, or a plain file (older versions)
            before = None
        link = path.parent / f".ln-{os.path.basename(data)}"
        os.symlink(os.path.basename(data), link)
        os.replace(link, path)
        if before is not None and os.path.basename(before) == before and before.startswith(".rec-"):
            try:
                os.unlink(path.parent / before)
            except FileNotFoundError:
                pass

    @staticmethod
    def _atomic_write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")  # mode 0600
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)


def _new_record_file(directory: Path, data: bytes) -> str:
    """A new file (0600) in `directory` holding `data`; its path. Named by this process's id and a
    counter, not tempfile.mkstemp's random names (whose generator cost more than the write): a name
    left by an earlier process with the same pid (a crash before the swap) is skipped."""
    while True:
        path = os.path.join(directory, f".rec-{os.getpid()}-{next(_record_names)}.json")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            continue
        except FileNotFoundError:  # the attempt's first record (made here, not on every save)
            os.makedirs(directory, exist_ok=True)
            continue
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except BaseException:
            os.unlink(path)  # a full disk: no stray part-record left
            raise
        return path


def _first_cause(failing: list[tuple[int, int]], statuses: list[bytes | None]) -> tuple[int, int]:
    """The first failing (rank, code) that can be the cause: a rank killed (code 128 and up)
    before its bwrap started is the gang's stop of another rank's failure, never a cause, and its
    exit file may carry the same time stamp as the cause's (the file system's clock is coarse:
    the order of two exits in one tick is the ranks', not the events'; review111 #1)."""
    for rank, code in failing:
        status = statuses[rank] if rank < len(statuses) else None
        if code >= 128 and status is not None and status.startswith(BWRAP_NOT_STARTED):
            continue
        return rank, code
    return failing[0]


def _may_have_run(status: bytes | None, code: int | None) -> bool:
    """Whether a rank's command may have run, from what its bwrap wrote (`status`) and its exit
    code (None: it wrote none, its rank script was killed). Only a rank stopped before its bwrap
    started (BWRAP_NOT_STARTED) or whose bwrap refused by itself (code 1-127 with no exit-code
    line) did not: a bwrap killed by a signal (the gang's grace, Slurm's KillWait, the rank
    script's own kill) writes no exit-code line even after its command ran (the local engine's
    Instance.may_have_run), and a rank without a readable status file, or whose node's bwrap has
    no --json-status-fd (BWRAP_NO_STATUS), cannot tell."""
    if status is None or EXEC_MARK in status or status.startswith(BWRAP_NO_STATUS):
        return True
    if status.startswith(BWRAP_NOT_STARTED):
        return False
    return code is None or not 0 < code < 128
