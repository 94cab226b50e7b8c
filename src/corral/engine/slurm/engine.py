"""The Slurm engine: Corral's scheduler decides nodes and GPUs, Slurm executes.

One attempt = one Slurm batch job named `corral-<attempt_id>`, pinned with --nodelist and
--gres=gpu:N, submitted with --no-requeue as the Unix account of the job's Corral user (users.py)
and run inside bubblewrap on the node (scripts.py). Status comes from one `squeue --states=all` per
poll (cli.SlurmCli.jobs; none while every live job pends or runs and none shows it started or an
instance ended, see _still_pending and _still_quiet); what Slurm forgets (or never knew) lives
in a JSON file per attempt (state.py).
"""

from __future__ import annotations

import logging
import os
import pwd
import shutil
import subprocess
import threading
import time
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from corral.config import Settings
from corral.engine.base import (
    AttemptPhase,
    AttemptStatus,
    Engine,
    EngineUnavailable,
    ExecCommand,
    ExecRefused,
    FailureReason,
    LogChunk,
    NodeReport,
)
from corral.engine.isolation.sandbox import bwrap_reports_exec
from corral.engine.isolation.secret_files import remove_secrets
from corral.engine.slurm import enter, mapping, scripts, unreadable
from corral.engine.slurm.cli import SlurmCli, SlurmJob, SlurmNode
from corral.engine.slurm.state import AttemptRecord, StateStore, StopRequest, read_job_file
from corral.engine.slurm.submission import REJECTED_REF, Submission
from corral.engine.slurm.unreadable import DEFAULT_GRACE_S as DEFAULT_UNREADABLE_GRACE_S
from corral.engine.slurm.unreadable import UnreadableAttempts, failed_status
from corral.engine.slurm.users import UserMap
from corral.scheduler.types import NodeState

log = logging.getLogger(__name__)

TIMEOUT_GRACE_S = 10.0  # grace given to an attempt that ran past max_runtime
ATTEMPT_LOCK_STRIPES = 64
GANG_GRACE_S = 10.0  # after one instance failed, how long the others get to end on SIGTERM
# How often the server's reconcile loop polls this engine (one squeue for all live attempts, about
# 25 ms): Corral frees a job's resources only once squeue says it ended, so at 20 jobs/s on 12
# slots the default 0.1 s of the local engine kept slots idle in Corral's view (docs/slurm.md).
DEFAULT_TIMEOUT_S = 20.0  # per Slurm command (CORRAL_SLURM_TIMEOUT_S)
DEFAULT_POLL_INTERVAL_S = 0.04
# How many node-fulls of CPU jobs may wait in Slurm's queue behind the running ones (server/ahead.py):
# Slurm starts a waiting job the moment a slot frees. Corral counts a job against this from its
# placement until it sees it run (dispatch, sbatch, Slurm's start: ~1.2 s at 20 jobs/s on a busy
# box), so the depth caps the jobs in flight; 2 was that cap at 20 jobs/s on 3 x 4 CPUs (docs/slurm.md).
DEFAULT_QUEUE_AHEAD = 4
MAX_QUEUE_AHEAD = 8
# How many launches the server runs at once on this engine (server/dispatch.py; the local engine's
# 4 start processes, which is CPU work): a Slurm launch is mostly waiting for sbatch's round trip
# to slurmctld, and with 4 at a time a burst was fed to Slurm at half the rate it starts jobs.
DEFAULT_LAUNCH_WORKERS = 8
MAX_LAUNCH_WORKERS = 64
# How long an account that exists is taken to exist without asking again (when the poll asks
# squeue for the accounts' jobs: a live attempt without a job id, or more than MAX_JOBS_BY_ID; an
# account removed meanwhile makes squeue answer "invalid user", and the engine then asks for every
# user's jobs, see _squeue).
ACCOUNT_CACHE_S = 60.0
# While Slurm holds every live attempt's job pending, nothing Corral could record changes until
# one starts (22.05 starts jobs on its scheduler's tick, about once a second, or when a job
# ends): a poll then asks squeue again only when a job shows it started (slurmstepd made its
# output file), a stop was asked for, an attempt's job id is unknown, or this long has passed
# since squeue last said "all pending" (a job that ends without ever starting, e.g. cancelled by
# an admin or failed at launch on its node). docs/slurm.md, ninth round: 2 of 3 polls under the
# bench's loads found only pending jobs, ~7 ms of CPU each (squeue, slurmctld, the parse).
PENDING_RECHECK_S = 1.0
# The same while some live attempts run and the others pend (docs/slurm.md, 2026-11-29 round):
# squeue was asked at every poll (25 a second) for as long as any job ran. A running job's
# instances each write rank-R.exit as they end (scripts.rank_script), so a poll asks again once one
# of them shows, or a pending one shows it started, or this long has passed: an end that writes no
# exit file (scancel by an admin, the whole step killed, a node lost) or Corral's max_runtime
# (checked at squeue polls, _enforce_limits) is seen at most this much later than at every poll.
RUNNING_RECHECK_S = 0.25
# The most live attempts polled by job id in one squeue call: one argument holds at most 128 kB
# (MAX_ARG_STRLEN); beyond this many, the poll asks for the accounts' jobs instead.
MAX_JOBS_BY_ID = 5000


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a number")


def cli_from_env(*, strict: bool = True) -> SlurmCli:
    """The Slurm client tools as `from_settings`'s engine runs them: CORRAL_SLURM_CONF as their
    SLURM_CONF, CORRAL_SLURM_TIMEOUT_S per command (`corral doctor`'s probes). A timeout that is no
    number: ValueError naming the variable, or with `strict` False the default (doctor still
    probes; the server refuses it at start-up)."""
    try:
        timeout_s = _env_float("CORRAL_SLURM_TIMEOUT_S", DEFAULT_TIMEOUT_S)
    except ValueError:
        if strict:
            raise
        timeout_s = DEFAULT_TIMEOUT_S
    return SlurmCli(os.environ.get("CORRAL_SLURM_CONF") or None, timeout_s=timeout_s)


def _env_int(name: str, default: int) -> int:
    raw = (os.environ.get(name) or "").strip()
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number")


def _reports_exec(bwrap: str) -> bool:
    """Whether the server host's bubblewrap (the nodes' is taken to be the same, as its path is)
    says through --json-status-fd that it exec'd a command: the rank scripts then tell a sandbox
    bwrap refused to set up from the job's own exit 1 (scripts.NodeSandbox.json_status)."""
    try:
        reports = bwrap_reports_exec(bwrap)
    except (OSError, subprocess.SubprocessError) as exc:
        reports = False
        log.warning("bubblewrap %s could not be tried here: %s", bwrap, exc)
    if not reports:
        log.warning(
            "bubblewrap %s here has no usable --json-status-fd: on the nodes, a sandbox that refuses "
            "to start (a mount it cannot make) ends as the job's own exit 1, not launch_failed",
            bwrap,
        )
    return reports


_accounts_seen: dict[str, float] = {}  # account name -> when it was last found to exist


def _account_exists(name: str) -> bool:
    now = time.monotonic()
    if now - _accounts_seen.get(name, -ACCOUNT_CACHE_S) < ACCOUNT_CACHE_S:
        return True
    try:
        pwd.getpwnam(name)
    except KeyError:
        _accounts_seen.pop(name, None)
        return False
    _accounts_seen[name] = now
    return True


class SlurmEngine(Submission):
    name = "slurm"

    def __init__(
        self,
        state_dir: Path,
        slurm_conf: str | None = None,
        partition: str | None = None,
        gpu_model: str = "VGPU",
        timeout_s: float = 20.0,
        user_map: UserMap | None = None,
        gpu_device: str = scripts.DEFAULT_GPU_DEVICE,
        storage_root: Path | None = None,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        queue_ahead: int = DEFAULT_QUEUE_AHEAD,
        launch_workers: int = DEFAULT_LAUNCH_WORKERS,
        unreadable_grace_s: float = DEFAULT_UNREADABLE_GRACE_S,
    ) -> None:
        """user_map: who runs each Corral user's jobs (None: nobody; every launch is refused).
        gpu_device: a GPU's device file on the nodes, `{index}` = Slurm's GPU index.
        poll_interval_s: the reconcile loop's pace on this engine (server.runner.collect_loops).
        queue_ahead: how many node-fulls of jobs the server may hand to Slurm ahead of a freed slot
        (server/ahead.py; 0: none): they wait in Slurm's queue, pinned to their node, behind the
        CPU jobs running or pending there (never behind GPU jobs), and Slurm starts them the
        moment a slot frees.
        launch_workers: how many launches (sbatch calls) the server runs at once.
        unreadable_grace_s: how long an attempt whose status cannot be read keeps its state
        before it fails (once Slurm says its job ended; twice this while it runs; unreadable.py)."""
        if "{index}" not in gpu_device:
            raise ValueError(f"CORRAL_SLURM_GPU_DEVICE={gpu_device!r} must contain {{index}}")
        if not 0.01 <= poll_interval_s <= 10:
            raise ValueError(f"CORRAL_SLURM_POLL_S={poll_interval_s} must be between 0.01 and 10 seconds")
        self.poll_interval_s = poll_interval_s
        if not 0 <= queue_ahead <= MAX_QUEUE_AHEAD:
            raise ValueError(f"CORRAL_SLURM_QUEUE_AHEAD={queue_ahead} must be from 0 to {MAX_QUEUE_AHEAD}")
        self.queue_ahead_depth = queue_ahead
        if not 1 <= launch_workers <= MAX_LAUNCH_WORKERS:
            raise ValueError(
                f"CORRAL_SLURM_LAUNCH_WORKERS={launch_workers} must be from 1 to {MAX_LAUNCH_WORKERS}"
            )
        self.launch_workers = launch_workers
        self.store = StateStore(Path(state_dir))
        self.storage_root = storage_root
        self.user_map = user_map or UserMap(None)
        bwrap = shutil.which("bwrap") or "/usr/bin/bwrap"
        self.sandbox = scripts.NodeSandbox(
            bwrap=bwrap, gpu_device=gpu_device, json_status=_reports_exec(bwrap)
        )
        self.cli = SlurmCli(slurm_conf, timeout_s=timeout_s)
        self.partition = partition
        self.gpu_model = gpu_model
        self._lock = threading.RLock()  # guards _timers
        self._timers: dict[str, threading.Timer] = {}
        self._unreadable = UnreadableAttempts.kept_under(self.store.root, unreadable_grace_s)
        # One lock per attempt (striped): load-modify-save of an attempt's record is atomic, while
        # launches of different attempts run their sbatch calls in parallel.
        self._attempt_locks = [threading.RLock() for _ in range(ATTEMPT_LOCK_STRIPES)]
        # "state" / "storage" -> until when (monotonic) it counts as passable without a new walk
        self._passable_until: dict[str, float] = {}
        self._warned_groups: set[tuple[str, int | None]] = set()  # (account, gid) said once in the log
        # attempt id -> its PENDING status, from the last squeue that found every live attempt
        # pending (or from its launch since); when that squeue ran (monotonic): see poll()
        self._pending: dict[str, AttemptStatus] = {}
        self._all_pending_at = float("-inf")
        self._noted_at = float("-inf")  # when the squeue whose answer _note_pending kept was asked
        # (when, statuses): the same from the last squeue that found every live attempt pending
        # or running and some running (_still_quiet); one tuple, replaced whole (polls run on two
        # threads), its dict changed after only by launches joining it
        self._quiet: tuple[float, dict[str, AttemptStatus]] = (float("-inf"), {})
        self._holds = mapping.NodeHolds()  # each node's hold, from the last `sinfo --json`

    @classmethod
    def from_settings(cls, settings: Settings) -> SlurmEngine:
        """Settings plus CORRAL_SLURM_CONF (slurm.conf to use), CORRAL_SLURM_PARTITION,
        CORRAL_SLURM_STATE_DIR (must be shared with the compute nodes; default <home>/slurm),
        CORRAL_SLURM_TIMEOUT_S (per Slurm command), CORRAL_SLURM_USER_MAP and
        CORRAL_SLURM_MIN_UID (users.py), CORRAL_SLURM_GPU_DEVICE (default /dev/nvidia{index}),
        CORRAL_SLURM_POLL_S (how often the server polls squeue, default 0.04),
        CORRAL_SLURM_QUEUE_AHEAD (node-fulls of jobs waiting in Slurm behind the CPU jobs running
        or pending on their node, default 4;
        0: no job is handed to Slurm before its slot is free), CORRAL_SLURM_LAUNCH_WORKERS (sbatch
        calls at once, default 8), CORRAL_SLURM_UNREADABLE_GRACE_S (how long an attempt whose
        status cannot be read keeps its state, default 600)."""
        env = os.environ
        return cls(
            state_dir=Path(env.get("CORRAL_SLURM_STATE_DIR") or settings.home / "slurm"),
            slurm_conf=env.get("CORRAL_SLURM_CONF") or None,
            partition=env.get("CORRAL_SLURM_PARTITION") or None,
            gpu_model=settings.gpu_model,
            timeout_s=_env_float("CORRAL_SLURM_TIMEOUT_S", DEFAULT_TIMEOUT_S),
            user_map=UserMap.from_env(),
            gpu_device=env.get("CORRAL_SLURM_GPU_DEVICE") or scripts.DEFAULT_GPU_DEVICE,
            storage_root=settings.storage_path,
            poll_interval_s=_env_float("CORRAL_SLURM_POLL_S", DEFAULT_POLL_INTERVAL_S),
            queue_ahead=_env_int("CORRAL_SLURM_QUEUE_AHEAD", DEFAULT_QUEUE_AHEAD),
            launch_workers=_env_int("CORRAL_SLURM_LAUNCH_WORKERS", DEFAULT_LAUNCH_WORKERS),
            unreadable_grace_s=_env_float("CORRAL_SLURM_UNREADABLE_GRACE_S", DEFAULT_UNREADABLE_GRACE_S),
        )

    # ---- nodes --------------------------------------------------------------------------------
    def nodes(self) -> Sequence[NodeReport]:
        """Nodes as Slurm sees them. Slurm unreachable: the last known nodes, state UNKNOWN."""
        asked = time.monotonic()
        try:
            raw = self.cli.run_json("sinfo").get("nodes") or []
        except EngineUnavailable as exc:
            self._holds.forget()
            cached = self.store.load_nodes()
            if not cached:
                raise
            return [
                replace(mapping.node_report(n, self.gpu_model), state=NodeState.UNKNOWN, message=str(exc))
                for n in cached
            ]
        seen: dict[str, SlurmNode] = {}
        for node in raw:
            if self.partition and self.partition not in (node.get("partitions") or []):
                continue
            seen.setdefault(str(node.get("name")), node)
        nodes = list(seen.values())
        self.store.save_nodes(nodes)
        self._holds.keep(seen, asked)
        return [mapping.node_report(n, self.gpu_model) for n in nodes]

    def set_node_state(self, node: str, state: NodeState, reason: str = "") -> None:
        """Corral's cordon, drain and uncordon, as drains with Corral's reasons and a resume of
        those; a hold made in Slurm itself is left alone (mapping.held_in_slurm): the node loop
        pushes every node's state after a server restart, which resumed an admin's drain."""
        args = mapping.scontrol_state_args(node, state, reason)
        # from the node loop's report just before (a restart's push: no `sinfo` per node)
        held = (self._holds.get(node) or self.cli.node_hold(node)) if state is not NodeState.DOWN else None
        if held is not None and mapping.held_in_slurm(state, *held):
            log.info("node %s left %s in Slurm (reason %r), not set %s", node, held[0], held[1], state.value)
            return
        self._holds.forget(node)  # set now: the last report no longer says how it stands
        result = self.cli.run("scontrol", *args)
        if result.returncode == 0:
            return
        if state is NodeState.READY and "invalid node state" in result.message.lower():
            return  # resume of a node that is not drained: already what Corral wants
        raise ValueError(f"Slurm refused to set node {node} to {state.value}: {result.message}")

    # ---- launch -------------------------------------------------------------------------------
    def _attempt_lock(self, attempt_id: str) -> threading.RLock:
        return self._attempt_locks[zlib.crc32(attempt_id.encode()) % ATTEMPT_LOCK_STRIPES]

    def _squeue(self, users: set[str] | None, *filters: str, comment: bool = False) -> list[SlurmJob]:
        """squeue of the given accounts (None: all). An account that no longer exists makes
        squeue print an error and no jobs at all: such accounts are left out of the filter (an
        account found is looked up again after a minute; one not found, at every poll while it
        has a live attempt; no second squeue), and if squeue still refuses one, every user's jobs
        are asked for instead."""
        users = {u for u in users or () if _account_exists(u)}
        if users:
            try:
                return self.cli.jobs(f"--users={','.join(sorted(users))}", *filters, comment=comment)
            except EngineUnavailable as exc:
                if "invalid user" not in str(exc).lower():
                    raise
                for name in users:  # one of them is gone: look them up again next time
                    _accounts_seen.pop(name, None)
        return self.cli.jobs(*filters, comment=comment)

    # ---- status -------------------------------------------------------------------------------
    def poll(self, attempt_ids: Iterable[str]) -> Mapping[str, AttemptStatus]:
        out: dict[str, AttemptStatus] = {}
        live: list[AttemptRecord] = []
        for aid in attempt_ids:
            record = self._load(aid)
            final = record.final_status() if record else None
            if record is None:
                out[aid] = AttemptStatus(aid, AttemptPhase.LOST, message="unknown to the Slurm engine")
            elif final is not None:
                out[aid] = final
            else:
                live.append(record)
                continue
            self._unreadable.read(aid)  # ended or gone: its unreadable count (and file) ends too
        if live:
            still = self._still_pending(live)
            if still is None:
                still = self._still_quiet(live)
            if still is not None:
                out.update(still)
                return out
            asked_at = time.monotonic()
            jobs = self._live_jobs(live)
            for record in live:
                with self._attempt_lock(record.attempt_id):
                    try:
                        out[record.attempt_id] = self._status(record, jobs)
                    except EngineUnavailable:
                        raise
                    except Exception as exc:
                        # The job dir's reads skip what the job's account can spoil: this is
                        # Corral's own fault (a bug, the state dir), which must not stop the loop
                        # from recording every other job. Left out, the attempt keeps its state
                        # and is polled again next tick (and the job can be cancelled), until it
                        # has been so for too long (unreadable.py).
                        failed = self._fail_unreadable(record, jobs, exc)
                        if failed is not None:
                            out[record.attempt_id] = failed
                    else:
                        self._unreadable.read(record.attempt_id)
            self._note_pending(live, out, asked_at)
        return out

    def _fail_unreadable(
        self, record: AttemptRecord, jobs: Mapping[str, SlurmJob], exc: Exception
    ) -> AttemptStatus | None:
        """The attempt's end as failed once its status has been unreadable past the grace (while
        Slurm says its job no longer runs; twice the grace while it runs: then its job is
        cancelled); None before (its traceback logged, at most every unreadable.LOG_EVERY_S).
        The job dir's reads skip what the job's account can spoil, so the error is Corral's (a bug,
        the state dir): the platform's failure (the exit-spec's status_unreadable, retried on the
        platform-loss budget, not the job's `retries:`), no node's fault."""
        aid = record.attempt_id
        unreadable_s = self._unreadable.unreadable_for(aid)
        job = jobs.get(record.slurm_job_id or scripts.job_name(aid))
        state = mapping.slurm_state(job) if job is not None else ""
        runs = state in mapping.PENDING_STATES or state in mapping.RUNNING_STATES
        if not self._unreadable.due(unreadable_s, runs):
            self._unreadable.log_error(aid)
            return None
        ref = record.slurm_job_id or (str(job["job_id"]) if job is not None else "")
        stop = record.stop
        killed = stop is not None and stop.killed and stop.kind == FailureReason.STATUS_UNREADABLE.value
        status = failed_status(aid, ref, unreadable_s, runs or killed, exc)  # killed: at a poll before
        limit = unreadable.time_limit_end(stop, job, runs)
        if limit is not None:  # its time limit ended it: that is its end
            status = replace(status, reason=FailureReason.TIMEOUT, message=f"{limit}; {status.message}")
        try:
            if runs and not (stop is not None and stop.killed):  # no second scancel
                record.slurm_job_id = ref
                if stop is None:  # should its end be read after all: stopped by Corral, and why
                    record.stop = StopRequest(time.time(), 0.0, kind=FailureReason.STATUS_UNREADABLE.value)
                self._kill(record)
            try:  # it skips what it cannot remove; should it raise, the end is written all the same
                remove_secrets(str(self.store.job_dir(aid) / "secrets"))
            except OSError:
                log.warning("Slurm attempt %s: its secrets dir could not be removed", aid, exc_info=True)
            status = self._record_end(record, status)
        except EngineUnavailable:
            raise
        except Exception:  # never out of the poll: the other attempts' statuses are answered
            self._unreadable.log_end_error(aid)
            return None
        self._unreadable.read(aid)
        log.warning("Slurm attempt %s failed: %s", aid, status.message)
        return status

    def _still_pending(self, live: list[AttemptRecord]) -> dict[str, AttemptStatus] | None:
        """The live attempts' statuses without asking squeue, when all of them were pending at
        the last squeue (or launched since) less than PENDING_RECHECK_S ago and none shows a
        start or has a stop requested; else None (ask squeue)."""
        if time.monotonic() - self._all_pending_at >= PENDING_RECHECK_S:
            return None
        out = {}
        for record in live:
            status = self._pending.get(record.attempt_id)
            if status is None or record.stop is not None or not record.slurm_job_id:
                return None
            # slurmstepd makes the batch step's --output file before it runs batch.sh
            output = scripts.BATCH_OUTPUT.format(job_id=record.slurm_job_id)
            if os.path.exists(self.store.job_file(record.attempt_id, output)):
                return None
            out[record.attempt_id] = status
        return out

    def _still_quiet(self, live: list[AttemptRecord]) -> dict[str, AttemptStatus] | None:
        """The live attempts' statuses without asking squeue, when at the last squeue (less than
        RUNNING_RECHECK_S ago) each was pending or running (or was launched since), none has a
        stop requested, no pending one shows it started and no running one has an instance that
        ended (its rank-R.exit); else None (ask squeue)."""
        quiet_at, quiet = self._quiet
        if time.monotonic() - quiet_at >= RUNNING_RECHECK_S:
            return None
        out = {}
        for record in live:
            status = quiet.get(record.attempt_id)
            if status is None or record.stop is not None or not record.slurm_job_id:
                return None
            if status.phase is AttemptPhase.PENDING:
                names = [scripts.BATCH_OUTPUT.format(job_id=record.slurm_job_id)]
            else:
                names = [f"rank-{rank}.exit" for rank in range(max(1, record.n_ranks))]
            if any(os.path.exists(self.store.job_file(record.attempt_id, n)) for n in names):
                return None
            out[record.attempt_id] = status
        return out

    def _note_launched(self, aid: str, slurm_job_id: str) -> None:
        """A job just submitted pends in Slurm's answer until its scheduler allocates it, which
        its output file shows (_still_pending, _still_quiet). Noted only while a poll's memory is
        fresh: else the next poll asks squeue anyway, and a server that launches but does not poll
        (its reconcile lease held elsewhere) would keep an entry per job it ever launched."""
        status = AttemptStatus(
            aid, AttemptPhase.PENDING, message="submitted to Slurm", engine_ref=slurm_job_id
        )
        if time.monotonic() - self._all_pending_at < PENDING_RECHECK_S:
            self._pending[aid] = status
        quiet_at, quiet = self._quiet
        if time.monotonic() - quiet_at < RUNNING_RECHECK_S:
            quiet[aid] = status

    def _note_pending(
        self, live: list[AttemptRecord], statuses: Mapping[str, AttemptStatus], asked_at: float
    ) -> None:
        """After a squeue: remember whether every live attempt was pending (see _still_pending),
        or pending or running (see _still_quiet).
        An answer older than the last one noted is dropped: `corral exec` polls from an API thread
        beside the reconcile loop, and the squeue that ends last need not be the one asked last."""
        if asked_at < self._noted_at:
            return
        self._noted_at = asked_at
        if any(r.attempt_id not in statuses for r in live):  # one left out (poll): ask squeue next time
            self._pending.clear()
            self._all_pending_at = float("-inf")
            self._quiet = (float("-inf"), {})
            return
        pending = {r.attempt_id: statuses[r.attempt_id] for r in live}
        phases = {s.phase for s in pending.values()}
        if all(s.phase is AttemptPhase.PENDING for s in pending.values()):
            self._pending.clear()  # an attempt launched meanwhile is asked about next time
            self._pending.update(pending)
            self._all_pending_at = asked_at
        else:
            self._pending.clear()
            self._all_pending_at = float("-inf")
        quiet = AttemptPhase.RUNNING in phases and phases <= {AttemptPhase.PENDING, AttemptPhase.RUNNING}
        self._quiet = (asked_at, pending) if quiet else (float("-inf"), {})

    def _load(self, attempt_id: str) -> AttemptRecord | None:
        if not scripts.ATTEMPT_ID_RE.match(attempt_id):
            return None
        return self.store.load(attempt_id)

    def _live_jobs(self, live: list[AttemptRecord]) -> dict[str, SlurmJob]:
        """What Slurm says of the live attempts' jobs: by job id when every one is known (only
        their lines, see SlurmCli.jobs_by_id), else every job of their accounts (a record whose
        job id was never learnt is found by name; one without its account, adopted after the
        state dir was lost, by asking for every user's jobs)."""
        ids = [r.slurm_job_id for r in live]
        if all(ids) and len(ids) <= MAX_JOBS_BY_ID:
            return {str(job["job_id"]): job for job in self.cli.jobs_by_id(sorted(set(ids)))}
        users = None if any(not r.unix_user for r in live) else {r.unix_user for r in live}
        return self._jobs(users)

    def _jobs(self, users: set[str] | None) -> dict[str, SlurmJob]:
        """The jobs Slurm still knows of the given accounts (None: all), by id and (for the
        corral ones) also by job name."""
        jobs: dict[str, SlurmJob] = {}
        for job in self._squeue(users):
            jobs[str(job.get("job_id"))] = job
            name = str(job.get("name") or "")
            if name.startswith(scripts.JOB_NAME_PREFIX):
                prev = jobs.get(name)
                if prev is None or int(job["job_id"]) > int(prev["job_id"]):
                    jobs[name] = job
        return jobs

    def _status(self, record: AttemptRecord, jobs: Mapping[str, SlurmJob]) -> AttemptStatus:
        aid = record.attempt_id
        if not record.slurm_job_id:  # launched, but its job id was never learnt
            job = self._current_of(aid, jobs)
            if job is None:
                return AttemptStatus(aid, AttemptPhase.PENDING, message="submitting to Slurm")
            record.slurm_job_id = str(job["job_id"])
            self.store.save(record)
        job = jobs.get(record.slurm_job_id)
        if job is None:
            return self._finish(record, self._status_without_slurm(record))
        state = mapping.slurm_state(job)
        if int(job.get("restart_cnt") or 0) > 0 and (
            state in mapping.PENDING_STATES or state in mapping.RUNNING_STATES
        ):
            # Requeued despite --no-requeue (e.g. by an admin): its first run may still be alive
            # on a "failed" node, so never let it run again. Corral retries with a new attempt.
            self.cli.run("scancel", record.slurm_job_id)
            return self._finish(
                record,
                AttemptStatus(
                    aid,
                    AttemptPhase.LOST,
                    reason=FailureReason.NODE_LOST,
                    message=(
                        f"Slurm requeued job {record.slurm_job_id}; cancelled so that it does not run twice"
                    ),
                    finished_at=time.time(),
                    engine_ref=record.slurm_job_id,
                ),
            )
        if state in mapping.PENDING_STATES:
            return mapping.live_status(aid, job)
        if state in mapping.RUNNING_STATES:
            self._enforce_limits(record, job)
            return mapping.live_status(aid, job)
        exits = self.store.rank_exits(aid, record.n_ranks, record.uid)
        refused = self._sandbox_refusal(record, exits)
        status = mapping.terminal_status(aid, job, exits, mapping.stop_kind(record.stop, job), refused)
        return self._finish(record, status)

    def _current_of(self, aid: str, jobs: Mapping[str, SlurmJob]) -> SlurmJob | None:
        """The attempt's current submission among the poll's answer, for a record whose job id
        was never learnt. The newest job of its name may be a superseded submission (it runs
        nothing and ends 0), so the jobs of that name are asked for their comments by id: by id,
        not by account, which the poll has already filtered (an account just removed is not looked
        up again; see _squeue)."""
        name = scripts.job_name(aid)
        token = self.store.submission(aid)
        if not token or name not in jobs:
            return jobs.get(name)
        ids = sorted({str(j["job_id"]) for j in jobs.values() if j.get("name") == name})
        mine = f"submission={token}"
        current = [j for j in self.cli.jobs_by_id(ids, comment=True) if mine in j.get("comment", "")]
        return max(current, key=lambda j: int(j["job_id"]), default=None)

    def _status_without_slurm(self, record: AttemptRecord) -> AttemptStatus:
        """Slurm purged the job (older than MinJobAge) before Corral saw it end: the exit codes the
        instances wrote tell how it ended; with none, the attempt is lost."""
        aid, ref = record.attempt_id, record.slurm_job_id
        exits = self.store.rank_exits(aid, record.n_ranks, record.uid)
        if len(exits) < record.n_ranks:
            return AttemptStatus(
                aid,
                AttemptPhase.LOST,
                reason=FailureReason.NODE_LOST,
                message=f"Slurm no longer knows job {ref} and not every instance left an exit code",
                finished_at=time.time(),
                engine_ref=ref,
            )
        fake_job: SlurmJob = {
            "job_id": ref,
            "job_state": "COMPLETED" if not any(exits.values()) else "FAILED",
        }
        refused = self._sandbox_refusal(record, exits)
        return mapping.terminal_status(
            aid, fake_job, exits, mapping.stop_kind(record.stop, fake_job), refused
        )

    def _sandbox_refusal(self, record: AttemptRecord, exits: dict[int, int]) -> mapping.SandboxRefusal | None:
        """The first failing rank's refusal when bwrap refused to set up its sandbox
        (state.StateStore.sandbox_refusal); looked for only when an instance failed."""
        if not any(exits.values()):
            return None
        return self.store.sandbox_refusal(record.attempt_id, record.n_ranks, exits, record.uid)

    def _finish(self, record: AttemptRecord, status: AttemptStatus) -> AttemptStatus:
        # The job's secrets live no longer than the job (batch.sh removes them too, unless killed).
        remove_secrets(str(self.store.job_dir(record.attempt_id) / "secrets"))
        return self._record_end(record, status)

    def _record_end(self, record: AttemptRecord, status: AttemptStatus) -> AttemptStatus:
        """Write the attempt's end to its record: returned by every poll from now on."""
        if status.phase is AttemptPhase.LOST:
            # LOST is the one end Slurm did not see the processes through (NODE_FAIL: a hung or
            # cut-off slurmd leaves them running), and Corral retries it elsewhere at once
            self._mark(record.attempt_id, scripts.KILL_MARKER)
        record.set_final(status)
        self.store.save(record)
        timer = self._timers.pop(record.attempt_id, None)
        if timer is not None:
            timer.cancel()
        return status

    def _enforce_limits(self, record: AttemptRecord, job: SlurmJob) -> None:
        """Send the final kill of an overdue stop (also after a server restart) and stop attempts
        past max_runtime (Slurm's own limit is in whole minutes)."""
        now = time.time()
        if record.stop is not None:
            if not record.stop.killed and now >= record.stop.deadline:
                self._kill(record)
            return
        start = float(job.get("start_time") or 0)
        if record.max_runtime_s is not None and start and now - start > record.max_runtime_s:
            self._request_stop(record, TIMEOUT_GRACE_S, kind="timeout")
            return
        if record.n_ranks < 2:  # no gang: a lone instance that ended ends its job (and this
            return  # runs on every poll, so the job dir is not listed for nothing)
        failed_at = self.store.first_failure_time(record.attempt_id, record.n_ranks, record.uid)
        if failed_at is not None and now - failed_at > GANG_GRACE_S:
            # an instance failed and the rest of the gang ignored SIGTERM: end the whole job
            self._kill(record)

    # ---- stop ---------------------------------------------------------------------------------
    def stop(self, attempt_id: str, grace_s: float) -> None:
        if grace_s < 0:
            raise ValueError(f"grace_s must be >= 0, got {grace_s}")
        with self._attempt_lock(attempt_id):
            record = self._load(attempt_id)
            if record is None or record.final is not None:
                return
            if not record.slurm_job_id:
                record.slurm_job_id = self._find_job_by_name(attempt_id, record.unix_user)
                if not record.slurm_job_id:
                    # None in Slurm yet, but an sbatch whose answer timed out may still reach
                    # slurmctld and its job turn up after this stop: it must start nothing
                    self._mark(attempt_id, scripts.STOP_MARKER)
                    return
            self._request_stop(record, grace_s, kind="stopped")

    def _request_stop(self, record: AttemptRecord, grace_s: float, kind: str) -> None:
        now = time.time()
        if record.stop is None:
            record.stop = StopRequest(requested_at=now, grace_s=grace_s, kind=kind)
        elif now + grace_s < record.stop.deadline:  # a second, more urgent stop shortens the grace
            record.stop.grace_s = now + grace_s - record.stop.requested_at
        self.store.save(record)
        # Slurm reports RUNNING a moment before the job's processes exist, and a signal sent in
        # that moment is lost: the scripts look for this file before they start anything.
        self._mark(record.attempt_id, scripts.STOP_MARKER)
        job = record.slurm_job_id
        self.cli.run("scancel", "--state=PENDING", job)  # never started: nothing to be graceful to
        if grace_s <= 0:
            self._kill(record)
            return
        self.cli.run("scancel", "--signal=TERM", "--full", job)
        timer = threading.Timer(grace_s, self._kill_after_grace, args=(record.attempt_id,))
        timer.daemon = True
        with self._lock:
            old = self._timers.pop(record.attempt_id, None)
            self._timers[record.attempt_id] = timer
        if old is not None:
            old.cancel()
        timer.start()

    def _kill_after_grace(self, attempt_id: str) -> None:
        with self._lock:
            self._timers.pop(attempt_id, None)
        with self._attempt_lock(attempt_id):
            record = self.store.load(attempt_id)
            if record is None or record.final is not None or record.stop is None or record.stop.killed:
                return
            try:
                self._kill(record)
            except EngineUnavailable as exc:  # poll() sends it once Slurm is back
                log.warning("final kill of %s deferred: %s", attempt_id, exc)

    def _mark(self, attempt_id: str, marker: str) -> None:
        """Leave a marker for the job's scripts in the attempt dir (scripts.STOP_MARKER, KILL_MARKER)."""
        (self.store.attempt_dir(attempt_id) / marker).touch()

    def _kill(self, record: AttemptRecord) -> None:
        try:  # also where Slurm cannot deliver the KILL; a state dir that refuses it keeps no scancel back
            self._mark(record.attempt_id, scripts.KILL_MARKER)
            refused: OSError | None = None
        except OSError as exc:  # not `killed` then: the next poll tries the marker (and scancels) again
            refused = exc
        try:
            self.cli.run("scancel", "--signal=KILL", "--full", record.slurm_job_id)
            self.cli.run("scancel", record.slurm_job_id)
        finally:  # (said even when a scancel found Slurm away)
            if refused is not None:
                self._unreadable.log_marker_error(record.attempt_id, refused)
        if record.stop is not None and refused is None:
            record.stop.killed = True
        self.store.save(record)

    # ---- logs, adopt, close -------------------------------------------------------------------
    def logs(self, attempt_id: str, instance: int = 0, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        if offset < 0 or limit <= 0 or instance < 0:
            raise ValueError(f"need offset >= 0, limit > 0, instance >= 0; got {offset}, {limit}, {instance}")
        record = self._load(attempt_id)
        if record is None:  # like the local engine: nothing to read, and nothing will come
            return LogChunk(b"", offset, eof=True)
        finished = record.final is not None
        path = self.store.log_path(attempt_id, instance)
        try:
            data, size, _ = read_job_file(path, record.uid, offset, limit)
        except FileNotFoundError:
            return LogChunk(b"", offset, eof=finished)
        except OSError as exc:  # a symlink or FIFO the job left in place of its log: never followed
            log.warning("log of %s rank %d not read: %s", attempt_id, instance, exc)
            return LogChunk(b"", offset, eof=finished)
        next_offset = offset + len(data)
        return LogChunk(data, next_offset, eof=finished and next_offset >= size)

    def adopt(self, refs: Mapping[str, str]) -> None:
        for aid, ref in refs.items():
            with self._attempt_lock(aid):
                if not scripts.ATTEMPT_ID_RE.match(aid):
                    raise ValueError(f"cannot adopt attempt {aid!r}: not a valid attempt id")
                job_id = ref if ref.isdigit() else ""
                record = self.store.load(aid)
                if record is None:
                    # state dir lost: rebuild what is needed to poll (the log files are gone too)
                    ranks = len(list(self.store.job_dir(aid).glob("rank-*.sh"))) or 1
                    record = AttemptRecord(aid, slurm_job_id=job_id, submitted_at=time.time(), n_ranks=ranks)
                    if ref == REJECTED_REF:
                        record.set_final(
                            AttemptStatus(
                                aid,
                                AttemptPhase.FAILED,
                                reason=FailureReason.LAUNCH_FAILED,
                                message="Slurm rejected the job (its message was lost with the state dir)",
                            )
                        )
                    self.store.save(record)
                elif not record.slurm_job_id and job_id:
                    record.slurm_job_id = job_id
                    self.store.save(record)

    def remove_attempt(self, attempt_id: str) -> None:
        """Delete a finished attempt's state dir (its logs and scripts); unfinished ones stay."""
        if not scripts.ATTEMPT_ID_RE.match(attempt_id):
            raise ValueError(f"cannot remove attempt {attempt_id!r}: not a valid attempt id")
        with self._attempt_lock(attempt_id):
            record = self.store.load(attempt_id)
            if record is not None and record.final is None:
                return
            shutil.rmtree(self.store.attempt_dir(attempt_id), ignore_errors=True)

    def exec_command(self, attempt_id: str, rank: int, argv: Sequence[str]) -> ExecCommand:
        """Enters rank `rank` of a running attempt through a job step (how: slurm/enter.py)."""
        record = self._load(attempt_id)
        if record is None:
            raise ExecRefused(f"attempt {attempt_id} is unknown to this engine")
        status = self.poll([attempt_id]).get(attempt_id)
        if status is None:  # left out of the poll: its status could not be read (logged there)
            raise ExecRefused(f"attempt {attempt_id}'s status cannot be read now; see the server's log")
        phase = status.phase
        if phase is not AttemptPhase.RUNNING:
            raise ExecRefused(f"attempt {attempt_id} is not running here ({phase.value})")
        srun = self.cli._argv("srun", ())[0]
        env = self.cli.submit_env(scripts.DEFAULT_PATH)
        return enter.enter_argv(record, self.store.job_dir(attempt_id), rank, argv, srun, env)

    def close(self) -> None:
        with self._lock:
            for timer in self._timers.values():
                timer.cancel()
            self._timers.clear()

    def __repr__(self) -> str:
        return f"SlurmEngine(state_dir={self.store.root}, slurm_conf={self.cli.slurm_conf})"


_PROTOCOL_CHECK: type[Engine] = SlurmEngine  # mypy checks the class against the Engine protocol
