"""What every background loop gets, and how a loop is declared.

Loops run in the server process; areas other than the control plane (monitoring) contribute
loops by exposing `LOOPS: list[BackgroundLoop]` in their own module, which the runner collects.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from corral.config import Settings
from corral.engine.base import Engine
from corral.services.notify import Topic

# The loops that act on a committed change, by the topic the service told (corral.services.notify).
# A submit wakes only the schedule loop: it wakes dispatch when it placed a job, and dispatch
# wakes reconcile; a cancel needs no scheduling, only the loops that stop or skip the job.
WAKE_ON_CHANGE: dict[Topic, tuple[str, ...]] = {
    Topic.JOBS: ("schedule",),
    Topic.CANCEL: ("dispatch", "reconcile"),
    Topic.NODES: ("nodes", "schedule"),
    Topic.QUOTAS: ("schedule",),
}


@dataclass
class ServerContext:
    settings: Settings
    session_factory: sessionmaker[Session]
    engine: Engine
    owner_id: str  # this process's identity in leases: "<hostname>:<pid>:<random>"
    # One event per loop name: setting it runs that loop now instead of at its next interval
    # (a submit wakes "schedule", an applied plan wakes "dispatch", ...). Filled by the runner.
    wake_events: dict[str, threading.Event] = field(default_factory=dict)
    # Per-process memory of the loops (caches, "already adopted" flags); never the source of truth.
    scratch: dict[str, Any] = field(default_factory=dict)

    def wake(self, *names: str) -> None:
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
    tick: Callable[[ServerContext, float], None]  # (context, now as unix seconds)
    singleton: bool = True  # hold the Lease named `name` while ticking, so one server does it
