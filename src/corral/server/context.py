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

if TYPE_CHECKING:  # both modules import this one
    from corral.monitor.config import MonitorConfig
    from corral.monitor.gpu import GpuSampler
    from corral.server.dispatch import LaunchQueue


@dataclass
class LoopMemory:
    """Per-process memory of the loops (caches, "already adopted" flags); never the source of
    truth: a restarted server starts with an empty one and rebuilds it from the database."""

    adopted: bool = False  # the engine was told of the attempts launched before a restart
    launch_queue: LaunchQueue | None = None  # made by the first dispatch tick
    pushed_admin_state: dict[str, str] = field(default_factory=dict)  # node -> cordon state told
    diagnoses: dict[str, JobDiagnosis] = field(default_factory=dict)  # job id -> as last written
    monitor_config: tuple[float | None, MonitorConfig] | None = None  # (file mtime, config)
    gpu_sampler: GpuSampler | None = None


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
        for name in names:
            event = self.wake_events.get(name)
            if event is not None:
                event.set()


@dataclass(frozen=True)
class BackgroundLoop:
    name: str
    interval_s: float
    tick: Callable[[ServerContext, float], None]  # (context, now as unix seconds)
    singleton: bool = True  # hold the Lease named `name` while ticking, so one server does it
