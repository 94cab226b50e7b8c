"""An opt-in profile of the whole server process: `CORRAL_PROFILE_OUT=<file>` makes every thread
(API workers, loop threads, the launch pool) run under its own cProfile profiler, and the merged
statistics are written to <file> (pstats format: `python -m pstats <file>`) when the server
stops. Off unless the variable is set: cProfile roughly doubles the cost of Python calls, so
absolute figures taken with it on are not the server's; its use is finding where the CPU goes
(bench/job_latency.py --profile). Each thread is timed by its own CPU clock
(CORRAL_PROFILE_CLOCK=cpu, the default: a thread waiting for a lock or a socket costs nothing,
so the figures add up to the process' CPU time) or by the wall clock (=wall: where threads wait).
"""

from __future__ import annotations

import cProfile
import logging
import os
import pstats
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

ENV = "CORRAL_PROFILE_OUT"
log = logging.getLogger("corral.server.profiling")
_profiles: list[cProfile.Profile] = []
_lock = threading.Lock()


def _new_profile() -> cProfile.Profile:
    clock: Callable[[], float] = (
        time.thread_time if os.environ.get("CORRAL_PROFILE_CLOCK") != "wall" else time.perf_counter
    )
    profile = cProfile.Profile(clock)
    with _lock:
        _profiles.append(profile)
    return profile


def _start_in_thread(_frame: FrameType, _event: str, _arg: Any) -> None:
    """threading.setprofile's hook: called at a new thread's first Python call; replaces itself
    with a cProfile profiler for that thread."""
    _new_profile().enable()


def start() -> bool:
    """Profile this thread and every thread started from now on, when CORRAL_PROFILE_OUT is set."""
    if not os.environ.get(ENV):
        return False
    threading.setprofile(_start_in_thread)
    _new_profile().enable()
    return True


def write() -> None:
    """Merge every thread's statistics into CORRAL_PROFILE_OUT (a no-op when it is not set)."""
    path = os.environ.get(ENV)
    if not path:
        return
    sys.setprofile(None)
    threading.setprofile(None)
    with _lock:
        profiles = list(_profiles)
    merged: pstats.Stats | None = None
    for profile in profiles:
        # snapshot_stats reads the counters without disabling: other threads' profilers can only
        # be disabled from their own thread, and reading them while they run is safe under the GIL
        profile.snapshot_stats()
        if not profile.stats:
            continue
        if merged is None:
            merged = pstats.Stats(profile)
        else:
            merged.add(profile)
    if merged is not None:
        merged.dump_stats(path)
        log.warning("profile of %d threads written to %s", len(profiles), path)
