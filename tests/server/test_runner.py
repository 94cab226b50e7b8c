"""The loop runner: wake-ups, failures that do not stop a loop, and singleton leases."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.db.session import make_engine
from corral.server.context import BackgroundLoop, ServerContext
from corral.server.leases import LOOP_LEASE_TTL_S, claim_lease
from corral.server.runner import LoopRunner
from tests.server.fakes import FakeEngine, make_context


def _ctx(tmp_path: Path, owner: str) -> ServerContext:
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), FakeEngine(), str(tmp_path))
    ctx.owner_id = owner
    return ctx


def test_wake_runs_a_tick_at_once_and_a_failing_tick_does_not_stop_the_loop(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "a:1:x")
    ticks: list[float] = []
    ran = threading.Event()

    def tick(_ctx: ServerContext, now: float) -> None:
        ticks.append(now)
        ran.set()
        if len(ticks) == 1:
            raise RuntimeError("first tick fails")

    # An interval far past any wait below: a second tick before the deadline is the wake's doing,
    # however slowly this machine runs (no wall-clock bound on how soon it came).
    runner = LoopRunner(ctx, [BackgroundLoop("slow", 3600.0, tick)])
    runner.start()
    try:
        assert ran.wait(60)
        ran.clear()
        ctx.wake("slow")
        assert ran.wait(60)  # woken: not after its hour-long interval
        assert len(ticks) == 2
    finally:
        runner.stop()
    assert runner.stats["slow"][0] == 1  # the failed tick is not counted as done


def until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Wait for something that must happen; the deadline is only there to end a broken run."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {timeout_s} s"
        time.sleep(0.01)


def test_only_one_of_two_runners_ticks_a_singleton(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While one runner holds a singleton's lease the other only asks for it; when the holder
    stops, the other takes the lease over at once, before the stopped one's lease would expire.
    Each is told once that it got the lease (`on_lease`), not on each renewal or refusal."""
    counts = {"a": 0, "b": 0}
    leases_got = {"a": 0, "b": 0}
    claims: list[tuple[str, float, bool]] = []  # (owner, now, held) of every claim attempt

    def recorded_claim(session: Any, name: str, owner: str, now: float) -> bool:
        held = claim_lease(session, name, owner, now)
        claims.append((owner, now, held))
        return held

    monkeypatch.setattr("corral.server.runner.claim_lease", recorded_claim)

    def counter(name: str) -> BackgroundLoop:
        def tick(_ctx: ServerContext, _now: float) -> None:
            counts[name] += 1

        def got_lease(_ctx: ServerContext) -> None:
            leases_got[name] += 1

        return BackgroundLoop("work", 0.02, tick, on_lease=got_lease)

    def refused_b() -> int:
        return sum(1 for owner, _, held in claims if owner == "host:2:b" and not held)

    first = LoopRunner(_ctx(tmp_path, "host:1:a"), [counter("a")])
    second = LoopRunner(_ctx(tmp_path, "host:2:b"), [counter("b")])
    first.start()
    try:
        until(lambda: counts["a"] > 5, "a's ticks")
        second.start()
        until(lambda: refused_b() >= 3, "b asking for the lease three times")
        before = counts["b"]  # read while a holds the lease (a's stop below gives it back)
        first.stop()  # releases its lease: the other takes over without waiting for the TTL
        until(lambda: counts["b"] > 5, "b's ticks")
    finally:
        first.stop()
        second.stop()
    assert before == 0 and counts["a"] > 5 and counts["b"] > 5
    assert leases_got == {"a": 1, "b": 1}
    a_held_until = max(now for owner, now, held in claims if owner == "host:1:a" and held) + LOOP_LEASE_TTL_S
    b_took_at = min(now for owner, now, held in claims if owner == "host:2:b" and held)
    assert b_took_at < a_held_until, (b_took_at, a_held_until)  # taken over, not expired


def test_the_engine_sets_the_reconcile_pace_and_a_waiting_tick_does_not_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An engine that learns of ends only by asking (Slurm) polls at its own pace; and a tick that
    spent its time waiting (a subprocess, not CPU) is followed at once by the next when woken."""
    from corral.engine.base import DEFAULT_POLL_INTERVAL_S
    from corral.server.runner import collect_loops

    class Polled(FakeEngine):
        poll_interval_s = 0.04

    paces = {loop.name: loop.interval_s for loop in collect_loops(Polled())}
    assert paces["reconcile"] == 0.04
    assert {loop.name: loop.interval_s for loop in collect_loops()}["reconcile"] == DEFAULT_POLL_INTERVAL_S

    ctx = _ctx(tmp_path, "a:1:x")
    ticks = 0
    rests = RecordedRests()
    monkeypatch.setattr("corral.server.runner.time", rests)

    def tick(_ctx: ServerContext, _now: float) -> None:
        nonlocal ticks
        ticks += 1
        if ticks < 3:
            time.sleep(0.3)  # waiting, as for squeue: no CPU
            _ctx.wake("waits")

    runner = LoopRunner(ctx, [BackgroundLoop("waits", 3600.0, tick, singleton=False)])
    runner.start()
    try:  # woken during each tick: a third tick long before the hour-long interval
        until(lambda: ticks >= 3, "three ticks")
    finally:
        runner.stop()
    # The rest after each of the two 0.3 s ticks that waited (little CPU) is none, whatever the
    # wall clock says; a rest by wall time would be 2 x 0.3 s less the tick's own 0.3 s.
    assert rests.seconds[:2] == [0.0, 0.0], rests.seconds


class RecordedRests:
    """The runner's `time` module, noting how long each debounce rest (time.sleep) asked for."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.seconds.append(seconds)
        time.sleep(seconds)
