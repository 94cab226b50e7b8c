"""Runs background loops on threads beside the API, each with its wake event and (for singletons)
its database lease.

A loop thread sleeps `interval_s` or until woken (`ServerContext.wake(name)`), renews its lease
when half of it has passed, and runs one tick. A tick that raises is logged and retried next time;
it never stops the loop or the API.
"""

from __future__ import annotations

import importlib
import logging
import threading
import time
from dataclasses import dataclass

from corral.engine.base import DEFAULT_POLL_INTERVAL_S, Engine
from corral.server.context import BackgroundLoop, ServerContext
from corral.server.leases import LOOP_LEASE_TTL_S, claim_lease, release_lease

log = logging.getLogger("corral.server.loops")
# Modules of other areas that may contribute loops as `LOOPS: list[BackgroundLoop]`.
EXTRA_LOOP_MODULES = (
    "corral.monitor.loops",
    "corral.diagnosis.watch",
    "corral.datasets.loops",
    "corral.environments.builds",
    "corral.monitor.pager",  # on-call paging: escalation and per-person notifications
    "corral.monitor.job_notifier",  # users' job notifications (services/job_notify.py)
)
MIN_TICK_GAP_S = 0.02
ERROR_LOG_INTERVAL_S = 60.0


def core_loops(reconcile_interval_s: float = DEFAULT_POLL_INTERVAL_S) -> list[BackgroundLoop]:
    from corral.server.dispatch import DISPATCH_INTERVAL_S, dispatch_tick
    from corral.server.nodes import node_tick
    from corral.server.reconcile import reconcile_tick
    from corral.server.retention import RETENTION_LOOP_INTERVAL_S, retention_tick
    from corral.server.scheduling import forget_schedule_memory, schedule_tick
    from corral.server.sweep import SWEEP_INTERVAL_S, sweep_loop_tick

    return [
        BackgroundLoop("nodes", 1.0, node_tick),
        BackgroundLoop("schedule", 0.2, schedule_tick, on_lease=forget_schedule_memory),
        BackgroundLoop("dispatch", DISPATCH_INTERVAL_S, dispatch_tick),
        BackgroundLoop("reconcile", reconcile_interval_s, reconcile_tick),
        BackgroundLoop("retention", RETENTION_LOOP_INTERVAL_S, retention_tick),
        BackgroundLoop("sweep", SWEEP_INTERVAL_S, sweep_loop_tick),
    ]


def collect_loops(engine: Engine | None = None) -> list[BackgroundLoop]:
    """`engine`: an engine may set the reconcile loop's pace (`poll_interval_s`): the Slurm engine
    learns that a job ended only by asking squeue, and until then Corral holds its resources."""
    loops = core_loops(engine.poll_interval_s if engine is not None else DEFAULT_POLL_INTERVAL_S)
    for module_name in EXTRA_LOOP_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        loops.extend(getattr(module, "LOOPS", []))
    return loops


@dataclass(frozen=True)
class LoopHealth:
    """One loop as /readyz reports it. `ok` while its last good pass (a tick that did not raise,
    or a pass that found another server holding the lease) is recent enough."""

    name: str
    ok: bool
    last_ok_s_ago: float
    stall_after_s: float
    error: str | None  # the last failure, while the loop is not ok


class LoopRunner:
    def __init__(self, ctx: ServerContext, loops: list[BackgroundLoop]) -> None:
        self.ctx = ctx
        self.loops = loops
        self._stop = threading.Event()
        started = time.monotonic()
        # Per loop: when it last passed without error (monotonic) and its last error text.
        self._last_ok: dict[str, float] = {loop.name: started for loop in loops}
        self._last_error: dict[str, str] = {}
        self._threads: list[threading.Thread] = []
        # name -> [ticks, wall seconds, CPU seconds of the loop's thread]: logged at stop.
        self.stats: dict[str, list[float]] = {loop.name: [0, 0.0, 0.0] for loop in loops}
        self._last_logged: dict[str, float] = {}
        for loop in loops:
            ctx.wake_events.setdefault(loop.name, threading.Event())
            if loop.singleton:  # not held until its first claim (dispatch.launch_placed reads it)
                ctx.memory.lease_until[loop.name] = 0.0

    def start(self) -> None:
        for loop in self.loops:
            thread = threading.Thread(target=self._run, args=(loop,), name=f"loop-{loop.name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self.ctx.wake(*[loop.name for loop in self.loops])
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for name, (ticks, wall, cpu) in self.stats.items():
            log.info("loop %s: %d ticks, %.2f s wall, %.2f s CPU", name, ticks, wall, cpu)
        for loop in self.loops:  # let another server take over at once instead of after the TTL
            if loop.singleton:
                try:
                    with self.ctx.session_factory() as session:
                        release_lease(session, loop.name, self.ctx.owner_id)
                except Exception:
                    log.exception("could not release lease %s", loop.name)

    def health(self, stall_after_s: float) -> list[LoopHealth]:
        """Each loop's liveness: not ok when it has not had a good pass for `stall_after_s` (or
        three of its intervals, when longer): stuck in a tick, or failing every tick."""
        now = time.monotonic()
        out = []
        for loop in self.loops:
            limit = max(stall_after_s, 3 * loop.interval_s)
            age = now - self._last_ok[loop.name]
            ok = age <= limit and not self._stop.is_set()
            error = None if ok else self._last_error.get(loop.name, "no pass finished (stuck in a tick?)")
            out.append(LoopHealth(loop.name, ok, round(age, 3), limit, error))
        return out

    def _holds_lease(self, loop: BackgroundLoop, held_until: float, now: float) -> float:
        """Renew the loop's lease when half its time is gone; returns until when it is held (0: not)."""
        if held_until - now > LOOP_LEASE_TTL_S / 2:
            return held_until
        with self.ctx.session_factory() as session:
            if claim_lease(session, loop.name, self.ctx.owner_id, now):
                return now + LOOP_LEASE_TTL_S
        return 0.0

    def _log_failure(self, loop: BackgroundLoop, exc: Exception) -> None:
        """The traceback once per distinct error and minute, not every 0.1 s tick."""
        key, now = f"{loop.name}:{type(exc).__name__}:{exc}", time.monotonic()
        if now - self._last_logged.get(key, -1e9) >= ERROR_LOG_INTERVAL_S:
            self._last_logged[key] = now
            log.exception("loop %s failed (repeats of this error are logged once a minute)", loop.name)

    def _run(self, loop: BackgroundLoop) -> None:
        event = self.ctx.wake_events[loop.name]
        held_until = 0.0
        while not self._stop.is_set():
            event.clear()
            due: float | None = None
            now, cpu_at_start = time.time(), time.thread_time()
            try:
                if loop.singleton:
                    held_before = held_until > now
                    held_until = self._holds_lease(loop, held_until, now)
                    self.ctx.memory.lease_until[loop.name] = held_until
                    if not held_before and held_until > now and loop.on_lease is not None:
                        loop.on_lease(self.ctx)
                if not loop.singleton or held_until > now:
                    wall, cpu = time.perf_counter(), time.thread_time()
                    due = loop.tick(self.ctx, now)
                    stats = self.stats[loop.name]
                    stats[0] += 1
                    stats[1] += time.perf_counter() - wall
                    stats[2] += time.thread_time() - cpu
                self._last_ok[loop.name] = time.monotonic()
            except Exception as exc:
                self._last_error[loop.name] = f"{type(exc).__name__}: {exc}"[:500]
                self._log_failure(loop, exc)
            cpu_s = time.thread_time() - cpu_at_start
            event.wait(loop.interval_s if due is None else max(0.0, min(loop.interval_s, due)))
            # Debounce: a burst of wake-ups (e.g. 100 submits) becomes one tick, not 100; and a
            # loop whose ticks got CPU-heavy (a deep queue) rests as long as it computed, so that
            # woken loops never take more than half a core from the API on a busy server. CPU
            # time, not wall time: a tick that mostly waited (for squeue, sbatch, the database's
            # write lock) took nothing from the API, and resting after it only delayed the next
            # step of a job (on the Slurm engine, a quarter of the reconcile loop's time).
            gap = max(min(MIN_TICK_GAP_S, loop.interval_s), 2 * cpu_s)
            time.sleep(max(0.0, gap - (time.time() - now)))
