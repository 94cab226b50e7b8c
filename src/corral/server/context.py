"""What every background loop gets, and how a loop is declared.

Loops run in the server process; areas other than the control plane (monitoring) contribute
loops by exposing `LOOPS: list[BackgroundLoop]` in their own module, which the runner collects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from corral.config import Settings
from corral.engine.base import Engine


@dataclass
class ServerContext:
    settings: Settings
    session_factory: sessionmaker[Session]
    engine: Engine
    owner_id: str  # this process's identity in leases: "<hostname>:<pid>:<random>"


@dataclass(frozen=True)
class BackgroundLoop:
    name: str
    interval_s: float
    tick: Callable[[ServerContext, float], None]  # (context, now as unix seconds)
    singleton: bool = True  # hold the Lease named `name` while ticking, so one server does it
