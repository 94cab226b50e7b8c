"""The local engine: runs attempts on this machine, each under a detached supervisor process
(supervisor.py) and, when isolation is on, in bubblewrap sandboxes with cgroup limits.

All state lives in files under `<home>/engine/attempts/<attempt_id>/`, so an engine object that
is re-created (server restart, even after SIGKILL) sees every attempt exactly as before: `poll`
reads the supervisor's files, and `adopt` only validates what it is given.

What a launch writes before its supervisor runs (checks, `/etc`, secrets, uid, cgroups, the
sandbox's argv) is prepare.py's `AttemptPreparation`, this class's mixin; which attempts may still
run is live_index.py.
"""

from __future__ import annotations

import logging
import marshal
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from corral.config import Settings
from corral.engine.base import (
    DEFAULT_LAUNCH_WORKERS,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_QUEUE_AHEAD_DEPTH,
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    ExecCommand,
    ExecRefused,
    FailureReason,
    LogChunk,
    NodeReport,
)
from corral.engine.gpus import GpuInventory, discover_gpus
from corral.engine.isolation.netns import NetworkPolicy
from corral.engine.isolation.sandbox import IsolationStatus, probe
from corral.engine.isolation.secret_files import remove_secrets
from corral.engine.local.enter import enter_argv
from corral.engine.local.files import (
    FINAL_STATUS,
    RUNNING_STATE,
    SUPERVISOR_INFO,
    AttemptSpec,
    FinalStatus,
    SupervisorInfo,
    read_file,
)
from corral.engine.local.live_index import LiveIndex
from corral.engine.local.prepare import AttemptPreparation, LaunchRefused, default_environments
from corral.engine.local.process_files import (
    ask_launcher,
    child_running,
    clean_up_dead_attempt,
    final_status,
    home_tag,
    lost_status,
    read_text,
    remove_empty_cgroups,
    running_launcher,
    same_process,
    spawn_detached,
    write_atomic,
    write_json,
)
from corral.scheduler.types import NodeState

log = logging.getLogger(__name__)

# The supervisor is started as `python -I -S -c <this>`: importing the module (not running the
# file as a script) uses its cached bytecode, which saves compiling it at every job start.
_SRC = str(Path(__file__).resolve().parents[3])
SUPERVISOR_BOOT = (
    f"import sys; sys.path.insert(0, {_SRC!r}); from corral.engine.local.supervisor import main; main()"
)
LAUNCHER_BOOT = (
    f"import sys; sys.path.insert(0, {_SRC!r}); from corral.engine.local.launcher import main; main()"
)
_ATTEMPT_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DEFAULT_PIDS_MAX = 1024


@dataclass(frozen=True, slots=True)
class IsolationCapabilities:
    """What isolation jobs get on this node, for logs, `corral node` and tests."""

    isolation_requested: bool
    sandbox: bool
    cgroups: bool
    cgroup_version: int | None
    devices_cgroup: bool
    allow_unisolated: bool
    refusing: bool
    problems: tuple[str, ...]
    network: str  # isolated | host: what jobs get (host when the namespace cannot be made)
    network_outbound: str  # none | internet
    network_summary: str
    summary: str
    virtual_gpus: bool


class LocalEngine(AttemptPreparation):
    name = "local"
    poll_interval_s = DEFAULT_POLL_INTERVAL_S
    launch_workers = DEFAULT_LAUNCH_WORKERS
    queue_ahead_depth = DEFAULT_QUEUE_AHEAD_DEPTH

    def __init__(
        self,
        home: Path,
        node_name: str,
        *,
        virtual_gpus: int | None = None,
        gpu_model: str = "VGPU",
        isolation: bool = True,
        allow_unisolated: bool = False,
        cgroup_root: Path = Path("/sys/fs/cgroup"),
        cgroup_parent: str | None = None,
        pids_max: int = DEFAULT_PIDS_MAX,
        gang_grace_s: float = 5.0,
        environments: Mapping[str, Sequence[str]] | None = None,
        use_launcher: bool = True,
        job_network: str = "isolated",
        job_outbound: str = "none",
    ) -> None:
        self.home = Path(home)
        self.node_name = node_name
        self.attempts_dir = self.home / "engine" / "attempts"
        self.attempts_dir.mkdir(parents=True, exist_ok=True)
        # Which attempts may still run, without listing every dir kept here (live_index.py).
        self.live_index = LiveIndex(self.attempts_dir, self.home / "engine" / "live")
        self.uid_locks = self.home / "engine" / "uids"
        self.launcher_sock = self.home / "engine" / "launcher.sock"
        # A unix socket path holds at most 107 bytes; a deeper home starts supervisors directly.
        self.use_launcher = use_launcher and len(os.fsencode(self.launcher_sock)) < 100
        self._launcher_started = -1e9
        self.cgroup_root = cgroup_root
        # One cgroup subtree per Corral home, so two servers on one machine (tests, a staging
        # instance) never share attempt cgroups: attempt ids restart at 1.1 in every database.
        self.cgroup_parent = cgroup_parent or f"corral-{home_tag(self.home)}"
        self.pids_max = pids_max
        self.gang_grace_s = gang_grace_s
        self.environments = dict(environments) if environments is not None else default_environments()
        self.allow_unisolated = allow_unisolated
        self.isolation_requested = isolation
        self.inventory: GpuInventory = discover_gpus(node_name, self.home, virtual_gpus, gpu_model)
        self.status: IsolationStatus = probe(cgroup_root) if isolation else IsolationStatus()
        # Network namespaces come with the sandbox: `isolation` off means plain host processes.
        self.network = NetworkPolicy(job_network if isolation else "host", job_outbound).probe()
        self._children: dict[str, int] = {}  # supervisors we spawned and have not reaped
        self._unchanged: dict[str, _LiveSeen] = {}  # live attempts as last read (see _status)
        self._build_network: NetworkPolicy | None = None
        self._log_start_up()
        # Attempts started by an earlier engine object (before a restart) keep running under
        # their supervisors; poll reads their files like any other.
        self.found_at_start = self.active_attempts()
        if self.found_at_start:
            log.info("local engine: %d attempts still active from before", len(self.found_at_start))
            # The dead among them (a supervisor killed while no server ran, a crash between a
            # launch's mkdir and its first file) get their verdict now: a dir without status.json
            # counted as active for good, and retention (remove_attempt) never removed it.
            self.poll(self.found_at_start)

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalEngine:
        return cls(
            settings.home,
            settings.node_name,
            virtual_gpus=settings.virtual_gpus,
            gpu_model=settings.gpu_model,
            isolation=settings.isolation,
            allow_unisolated=settings.allow_unisolated,
            pids_max=settings.job_pids_max,
            job_network=settings.job_network,
            job_outbound=settings.job_outbound,
        )

    # -- what this engine can do -------------------------------------------------------------

    def _log_start_up(self) -> None:
        if not self.isolation_requested:
            log.warning("local engine: isolation switched off; jobs run as plain processes, as root")
        elif self.status.complete and not self.network.problems:
            log.info("local engine: %s; network: %s", self.status.summary(), self.network.summary())
        elif self.allow_unisolated:
            log.warning("local engine: %s; running jobs anyway (allow_unisolated)", self._isolation_summary())
        else:
            log.error(
                "local engine: %s; refusing to launch jobs (set allow_unisolated to override)",
                self._isolation_summary(),
            )

    def _isolation_summary(self) -> str:
        return f"{self.status.summary()}; network: {self.network.summary()}"

    def capabilities(self) -> IsolationCapabilities:
        s = self.status
        return IsolationCapabilities(
            isolation_requested=self.isolation_requested,
            sandbox=self.isolation_requested and s.sandbox,
            cgroups=self.isolation_requested and s.cgroups,
            cgroup_version=s.cgroup_version,
            devices_cgroup=self.isolation_requested and s.devices_cgroup,
            allow_unisolated=self.allow_unisolated,
            refusing=self.refusing,
            problems=tuple(self.problems),
            network=self.network.mode if not self.network.problems else "host",
            network_outbound=self.network.outbound,
            network_summary=self.network.summary(),
            summary=s.summary() if self.isolation_requested else "isolation switched off",
            virtual_gpus=self.inventory.virtual,
        )

    isolation_status = capabilities

    def nodes(self) -> Sequence[NodeReport]:
        memory_mib = psutil.virtual_memory().total // (1 << 20)
        labels = {"engine": "local", "isolation": "on" if self.status.complete else "off"}
        if self.inventory.virtual:
            labels["gpu"] = "virtual"
        state, message = NodeState.READY, ""
        if self.refusing:
            state, message = NodeState.DOWN, f"job isolation unavailable: {'; '.join(self.problems)}"
        return [
            NodeReport(
                name=self.node_name,
                cpus=float(psutil.cpu_count() or 1),
                memory_mib=int(memory_mib),
                gpus=self.inventory.gpus,
                state=state,
                labels=labels,
                message=message,
            )
        ]

    def set_node_state(self, node: str, state: NodeState, reason: str = "") -> None:
        """Cordon/drain live in Corral's database; nothing to tell a single local node."""

    # -- launch --------------------------------------------------------------------------------

    def _dir(self, attempt_id: str) -> Path:
        if not _ATTEMPT_ID.match(attempt_id):
            raise ValueError(
                f"invalid attempt_id {attempt_id!r}: use letters, digits, '.', '_' or '-' (at most 128)"
            )
        return self.attempts_dir / attempt_id

    def launch(self, attempt: AttemptLaunch) -> str:
        adir = self._dir(attempt.attempt_id)
        self.live_index.add(attempt.attempt_id)  # before the dir: no live attempt is ever unlisted
        try:
            adir.mkdir()  # the atomic claim that makes launch idempotent
        except FileExistsError:
            return self._existing_ref(adir)
        self.live_index.ensure(attempt.attempt_id)  # a listing may have cleared a stale marker
        try:
            spec = self._prepare(attempt, adir)
        except LaunchRefused as exc:
            remove_secrets(str(adir / "secrets"))
            return self._record_launch_failure(adir, str(exc))
        except (OSError, ValueError) as exc:
            remove_secrets(str(adir / "secrets"))
            log.exception("cannot prepare attempt %s", attempt.attempt_id)
            return self._record_launch_failure(adir, f"could not prepare the attempt: {exc}")
        # marshal: the lean supervisor reads it; dict(): typeshed's marshal takes no TypedDict.
        # Root's alone (0600): it holds the job's env values (the attempt dir is 0755; only the home
        # above it, 0700 unless an admin widened it, keeps other accounts out).
        write_atomic(adir / "spec.marshal", marshal.dumps(dict(spec)), mode=0o600)
        try:
            pid = self._spawn_supervisor(attempt.attempt_id, adir)
        except BaseException:
            remove_secrets(str(adir / "secrets"))  # no supervisor will remove them
            raise
        ref = str(pid)
        (adir / "engine_ref").write_text(ref)
        return ref

    def _spawn_supervisor(self, attempt_id: str, adir: Path) -> int:
        """Through the launcher (a fork, ~1 ms) when it runs; else a fresh interpreter, and the
        launcher is started for the next ones."""
        pid = self._via_launcher(adir)
        if pid is not None:
            return pid
        pid = spawn_detached(
            [sys.executable, "-I", "-S", "-c", SUPERVISOR_BOOT, str(adir)], adir / "supervisor.err"
        )
        self._children[attempt_id] = pid
        if self.use_launcher:
            self._start_launcher()
        return pid

    def _via_launcher(self, adir: Path) -> int | None:
        return ask_launcher(self.launcher_sock, adir) if self.use_launcher else None

    def _start_launcher(self) -> None:
        """At most one start attempt per second; a stale socket is replaced by the new one."""
        now = time.monotonic()
        if now - self._launcher_started < 1.0:
            return
        self._launcher_started = now
        if self._launcher_pid() is not None:
            return
        argv = [sys.executable, "-I", "-S", "-c", LAUNCHER_BOOT, str(self.launcher_sock)]
        pid = spawn_detached(argv, self.launcher_sock.with_name("launcher.err"))
        self._children["<launcher>"] = pid

    def _launcher_pid(self) -> int | None:
        return running_launcher(self.launcher_sock)

    def stop_launcher(self) -> None:
        """The launcher owns no job: stopping it only makes the next starts slower."""
        spawned = self._children.pop("<launcher>", None)  # may not have written its pid file yet
        for pid in {p for p in (self._launcher_pid(), spawned) if p is not None}:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            try:
                os.waitpid(pid, 0)  # our child when this engine object started it
            except ChildProcessError:
                pass

    def _existing_ref(self, adir: Path) -> str:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:  # a concurrent launch may still be writing it
            try:
                return (adir / "engine_ref").read_text()
            except FileNotFoundError:
                time.sleep(0.005)
        return ""

    def _record_launch_failure(self, adir: Path, message: str) -> str:
        status: FinalStatus = {
            "phase": "failed",
            "exit_code": None,
            "reason": FailureReason.LAUNCH_FAILED.value,
            "message": message,
            "started_at": None,
            "finished_at": time.time(),
        }
        write_json(adir / "status.json", status)
        self.live_index.discard(adir.name)  # final now: no listing need stat it to find so
        (adir / "engine_ref").write_text("refused")
        return "refused"

    # -- observe ---------------------------------------------------------------------------------

    def poll(self, attempt_ids: Iterable[str]) -> Mapping[str, AttemptStatus]:
        self._reap()
        if len(self._unchanged) > MAX_UNCHANGED:  # attempts nobody polls any more
            self._unchanged.clear()
        return {aid: self._status(aid) for aid in attempt_ids}

    def _reap(self) -> None:
        for aid, pid in list(self._children.items()):
            if not child_running(pid):
                self._children.pop(aid, None)

    def _status(self, attempt_id: str) -> AttemptStatus:
        try:
            adir = self._dir(attempt_id)
        except ValueError as exc:
            return AttemptStatus(attempt_id, AttemptPhase.LOST, message=str(exc))
        # A live attempt's state changes only by a file created or renamed into its dir (the
        # supervisor's state.json and status.json, the engine's stop), which changes the dir's
        # mtime; or by its supervisor dying. While neither happened, the last reading stands:
        # the reconcile loop polls every live attempt ten times a second, and reading its four
        # files cost ~0.1-0.25 ms each time (a few ms per job while a burst's jobs start).
        try:
            mtime_ns = os.stat(adir).st_mtime_ns
        except OSError:
            mtime_ns = None
        seen = self._unchanged.pop(attempt_id, None)
        unchanged = seen is not None and seen.mtime_ns == mtime_ns
        if seen is not None and unchanged:
            ref = seen.status.engine_ref or ""
            if self._supervisor_alive(attempt_id, adir, seen.supervisor, ref):
                self._unchanged[attempt_id] = seen
                return seen.status
        status, sup = self._read_status(attempt_id, adir)
        # Kept only when the dir had been still for a while before it was read: its mtime comes
        # from the kernel's coarse clock, and a second change within the same tick would keep it.
        live = status.phase in (AttemptPhase.PENDING, AttemptPhase.RUNNING)
        if mtime_ns is not None and live and time.time_ns() - mtime_ns > UNCHANGED_AFTER_NS:
            self._unchanged[attempt_id] = _LiveSeen(mtime_ns, status, sup)
        return status

    def _read_status(self, attempt_id: str, adir: Path) -> tuple[AttemptStatus, SupervisorInfo | None]:
        """The attempt's status from its files (and its supervisor's info, when it runs)."""
        final = read_file(adir / "status.json", FINAL_STATUS)
        ref = read_text(adir / "engine_ref")
        if final is not None:
            return final_status(attempt_id, final, ref), None
        if not adir.exists():
            return AttemptStatus(attempt_id, AttemptPhase.LOST, message="this engine never launched it"), None
        state = read_file(adir / "state.json", RUNNING_STATE)
        sup = read_file(adir / "supervisor.json", SUPERVISOR_INFO)
        if self._supervisor_alive(attempt_id, adir, sup, ref):
            if state is None:
                return AttemptStatus(attempt_id, AttemptPhase.PENDING, engine_ref=ref), sup
            status = AttemptStatus(
                attempt_id, AttemptPhase.RUNNING, started_at=state["started_at"], engine_ref=ref
            )
            return status, sup
        final = read_file(adir / "status.json", FINAL_STATUS)  # it may have finished while we looked
        if final is not None:
            return final_status(attempt_id, final, ref), None
        return self._settle_dead(attempt_id, adir, ref), None

    def _supervisor_alive(self, attempt_id: str, adir: Path, sup: SupervisorInfo | None, ref: str) -> bool:
        pid = self._children.get(attempt_id)
        if pid is not None:
            if child_running(pid):
                return True
            self._children.pop(attempt_id, None)  # ended; or it left the attempt to one the
            sup = read_file(adir / "supervisor.json", SUPERVISOR_INFO)  # launcher forked first
            return sup is not None and sup["pid"] != pid and same_process(sup["pid"], sup)
        pid = sup["pid"] if sup else (int(ref) if ref.isdigit() else None)
        if pid is None:
            # Launched, but neither a pid nor a ref yet: a concurrent launch is mid-way.
            return time.time() - adir.stat().st_mtime < 10
        return same_process(pid, sup)

    def _settle_dead(self, attempt_id: str, adir: Path, ref: str) -> AttemptStatus:
        """The supervisor died without a final word (killed, machine rebooted): make sure nothing
        of the attempt survives, and remember the verdict: the end it recorded before its
        clean-up (ended.json: every instance reaped) or, without one, LOST."""
        status = read_file(adir / "ended.json", FINAL_STATUS) or lost_status()
        clean_up_dead_attempt(adir, self.attempt_spec(attempt_id))
        write_json(adir / "status.json", status)
        return final_status(attempt_id, status, ref)

    def logs(self, attempt_id: str, instance: int = 0, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        if offset < 0 or limit <= 0:
            raise ValueError(f"offset must be >= 0 and limit > 0, got offset={offset} limit={limit}")
        adir = self._dir(attempt_id)
        finished = (adir / "status.json").exists() or not adir.exists()
        try:
            with open(adir / f"rank-{instance}.log", "rb") as f:
                f.seek(offset)
                data = f.read(limit)
                size = os.fstat(f.fileno()).st_size
        except FileNotFoundError:
            return LogChunk(b"", offset, finished)
        next_offset = offset + len(data)
        return LogChunk(data, next_offset, finished and next_offset >= size)

    def adopt(self, refs: Mapping[str, str]) -> None:
        """State lives in files, so there is nothing to reattach; refs that do not match what the
        attempt dir recorded are logged (poll then tells the truth)."""
        for attempt_id, ref in refs.items():
            recorded = read_text(self._dir(attempt_id) / "engine_ref")
            if recorded != ref:
                log.warning("adopt %s: engine ref %r given, %r recorded", attempt_id, ref, recorded)

    def attempt_spec(self, attempt_id: str) -> AttemptSpec | None:
        """What the supervisor of this attempt was told to run (None when unknown)."""
        try:
            # Written by this engine (launch) in this shape; marshal keeps the supervisor's start lean.
            spec: AttemptSpec = marshal.loads((self._dir(attempt_id) / "spec.marshal").read_bytes())
            return spec
        except (OSError, ValueError, EOFError):
            return None

    def active_attempts(self) -> list[str]:
        """Attempts launched on this node (by any engine object) that have not finished: read
        from the live index, so finished attempts' dirs are not even listed."""
        return self.live_index.live()

    def exec_command(self, attempt_id: str, rank: int, argv: Sequence[str]) -> ExecCommand:
        """Enters rank `rank` of a running attempt (how: corral.engine.local.enter)."""
        status = self._status(attempt_id)
        spec = self.attempt_spec(attempt_id)
        if status.phase is not AttemptPhase.RUNNING or spec is None:
            raise ExecRefused(f"attempt {attempt_id} is not running here ({status.phase.value})")
        return enter_argv(self._dir(attempt_id), spec, rank, argv)

    # -- stop ------------------------------------------------------------------------------------

    def stop(self, attempt_id: str, grace_s: float) -> None:
        adir = self._dir(attempt_id)
        if not adir.exists() or (adir / "status.json").exists():
            return
        if not (adir / "supervisor.json").exists() and self._status(attempt_id).phase.finished:
            return  # never to start (a launch cut short after its mkdir, now stale): settled LOST
        write_atomic(adir / "stop", str(max(0.0, grace_s)).encode())
        sup = read_file(adir / "supervisor.json", SUPERVISOR_INFO)
        if sup is None:
            return  # not yet started: it reads `stop` (written first) before spawning anything
        pid = sup["pid"]
        if same_process(pid, sup):
            os.kill(pid, signal.SIGUSR1)
        else:
            self._status(attempt_id)  # dead supervisor: settle it, kill what is left

    def close(self) -> None:
        """Jobs keep running (their supervisors are detached); the launcher, which owns no
        job, is stopped, and supervisors that already ended are reaped."""
        self.stop_launcher()
        self._reap()
        self.remove_cgroup_parent(wait_s=1.0)

    def remove_cgroup_parent(self, wait_s: float) -> None:
        """This home's cgroup subtree where it is empty (process_files.remove_empty_cgroups)."""
        remove_empty_cgroups(self.cgroup_root, self.cgroup_parent, wait_s)

    def remove_attempt(self, attempt_id: str) -> None:
        """Deletes a finished attempt's dir (logs included): job deletion and retention."""
        adir = self._dir(attempt_id)
        if (adir / "status.json").exists():
            shutil.rmtree(adir, ignore_errors=True)
            self.live_index.discard(attempt_id)  # most often cleared already, when its end was seen


UNCHANGED_AFTER_NS = 50_000_000  # 50 ms: well above the coarse clock's tick (1-10 ms)
MAX_UNCHANGED = 100_000


@dataclass(frozen=True, slots=True)
class _LiveSeen:
    """A live attempt's status as read when its dir had this mtime, and its supervisor's info."""

    mtime_ns: int
    status: AttemptStatus
    supervisor: SupervisorInfo | None
