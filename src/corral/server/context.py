"""What every background loop gets, and how a loop is declared.

Loops run in the server process; areas other than the control plane (monitoring) contribute
loops by exposing `LOOPS: list[BackgroundLoop]` in their own module, which the runner collects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session, sessionmaker

from corral.config import Settings
from corral.domain import JobDiagnosis
from corral.engine.base import Engine
from corral.scheduler import Scheduler
from corral.scheduler.eta_calibration import EtaCalibration
from corral.services.notify import Topic
from corral.services.open_sessions import OpenSessions
from corral.services.session_use import SessionUse

# The loops that act on a committed change, by the topic the service told (corral.services.notify).
# A submit wakes only the schedule loop: it launches what it placed itself (dispatch.launch_placed),
# and dispatch, recording the launches, wakes reconcile; a cancel needs no scheduling, only the
# loops that stop or skip the job.
WAKE_ON_CHANGE: dict[Topic, tuple[str, ...]] = {
    Topic.JOBS: ("schedule",),
    Topic.CANCEL: ("dispatch", "reconcile"),
    Topic.NODES: ("nodes", "schedule"),
    Topic.QUOTAS: ("schedule",),
    Topic.PAGES: ("paging",),
}

if TYPE_CHECKING:  # both modules import this one
    from corral.diagnosis.exitspec import ExitSpecCache
    from corral.monitor.anomaly import AnomalyDetector
    from corral.monitor.config import MonitorConfigSource
    from corral.monitor.gpu import GpuSampler
    from corral.server.dispatch import LaunchQueue
    from corral.server.eta_record import OutcomesRead
    from corral.server.reconcile import LiveRow
    from corral.server.snapshot import ShapeCache


@dataclass
class LoopMemory:
    """Per-process memory of the loops (caches, "already adopted" flags); never the source of
    truth: a restarted server starts with an empty one and rebuilds it from the database."""

    adopted: bool = False  # the engine was told of the attempts launched before a restart
    launch_queue: LaunchQueue | None = None  # made by the first dispatch tick
    pushed_admin_state: dict[str, str] = field(default_factory=dict)  # node -> cordon state told
    diagnoses: dict[str, JobDiagnosis] = field(default_factory=dict)  # job id -> as last written
    # job id -> when the schedule loop first wrote it an estimated start in its current wait (kept
    # with `diagnoses`): later estimates are corrected less as it waits (server/eta_record.py)
    eta_since: dict[str, float] = field(default_factory=dict)
    monitor_config: MonitorConfigSource | None = None  # shared with the API (monitor.loops)
    gpu_sampler: GpuSampler | None = None
    anomaly_detector: AnomalyDetector | None = None  # baselines of the GPU readings (monitor.risk)
    scheduler: Scheduler | None = None  # the schedule loop's (scheduling.scheduler_for)
    ahead_scheduler: Scheduler | None = None  # its pass placing jobs ahead of freed slots (ahead.py)
    shape_cache: ShapeCache | None = None  # the schedule loop's nodes, groups, users (snapshot.py)
    # past (predicted, actual) waits that correct the estimated starts shown (server/eta_record.py)
    eta_calibration: EtaCalibration | None = None
    # how far it has read the outcomes: the jobs whose first attempt started (eta_record.note_started)
    eta_read: OutcomesRead | None = None
    queue_seen: bool = False  # the schedule loop's last cycle left jobs waiting (schedule_tick)
    # The reconcile loop's live rows and when it read them (monotonic; reconcile.tick_live_rows):
    # acted on again while nothing asked for a read, for at most reconcile.ROWS_KEPT_S.
    reconcile_rows: tuple[float, list[LiveRow]] | None = None
    # attempt id -> the engine's reason for holding it pending, as last written (reconcile.note_engine_waits)
    engine_waits: dict[str, str] = field(default_factory=dict)
    # The loops woken by `ServerContext.wake` (work asked for: a committed change, another
    # loop) since they last took it; a loop's own machinery nudges it without asking
    # (`ServerContext.nudge`). The dispatch loop reads it: its launch pool nudges it to record
    # launches, while anything else that wakes it wants the scheduled jobs read and claimed.
    asked: set[str] = field(default_factory=set)
    retention_checked_at: float = 0.0  # when the retention loop last found no more to delete
    exit_spec: ExitSpecCache | None = None  # diagnosis: the active exit-spec (reconcile)
    log_tail_bytes: int = 64 * 1024  # diagnosis: how much of a failed rank's log it reads
    audit_purged_at: float = 0.0  # when the retention loop last purged the audit log
    sessions_purged_at: float = 0.0  # when the retention loop last deleted expired portal sessions
    # The sweep's stops (attempt id -> when): one not yet ended is not stopped and audited again
    # until SWEEP_AGAIN_S later (server/sweep.py).
    swept: dict[str, float] = field(default_factory=dict)
    # Sessions into jobs through this server (SSH gateway, exec, port-forward), open and last
    # closed: the idle loop counts them as a workspace's use, the session-use loop persists them.
    session_use: SessionUse | None = None
    # Sessions held open through this server, by credential: the open-sessions loop ends those
    # whose token, portal session, SSH key or user lost access (corral.services.open_sessions).
    open_sessions: OpenSessions | None = None
    # singleton loop -> until when this process holds its lease (the runner's; 0: another server
    # does). No entry: no runner (a test driving ticks itself), so this process does everything.
    lease_until: dict[str, float] = field(default_factory=dict)


@dataclass
class ServerContext:
    settings: Settings
    session_factory: sessionmaker[Session]
    engine: Engine
    owner_id: str  # this process's identity in leases: "<hostname>:<pid>:<random>"
    # One event per loop name: setting it runs that loop now instead of at its next interval
    # (a submit wakes "schedule", an applied plan wakes "dispatch", ...). Filled by the runner.
    wake_events: dict[str, threading.Event] = field(default_factory=dict)
    memory: LoopMemory = field(default_factory=LoopMemory)

    def wake(self, *names: str) -> None:
        """Run these loops now, for work asked of them (noted in `memory.asked`)."""
        self.memory.asked.update(names)
        self.nudge(*names)

    def nudge(self, *names: str) -> None:
        """Run these loops now, asking nothing new of them (e.g. a pool's results to record)."""
        for name in names:
            event = self.wake_events.get(name)
            if event is not None:
                event.set()

    def changed(self, topic: Topic) -> None:
        """The services' Notifier: a change of `topic` was committed; wake the loops acting on it,
        so a submit reaches the scheduler in milliseconds rather than at its next tick."""
        self.wake(*WAKE_ON_CHANGE[topic])


@dataclass(frozen=True)
class BackgroundLoop:
    name: str
    interval_s: float
    # (context, now as unix seconds) -> None, or how soon (seconds) the loop wants its next tick
    # when sooner than its interval (a tick that put off part of its work: dispatch_tick)
    tick: Callable[[ServerContext, float], float | None]
    singleton: bool = True  # hold the Lease named `name` while ticking, so one server does it
    # Called when this server gets the singleton's lease (back): drops the loop's memory of what
    # another server may have changed while it held the lease (runner.LoopRunner._run)
    on_lease: Callable[[ServerContext], None] | None = None
