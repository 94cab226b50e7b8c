"""The loop runner: wake-ups, failures that do not stop a loop, and singleton leases."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from corral.db.session import make_engine
from corral.server.context import BackgroundLoop, ServerContext
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

    runner = LoopRunner(ctx, [BackgroundLoop("slow", 30.0, tick)])
    runner.start()
    try:
        assert ran.wait(5)
        ran.clear()
        woke = time.time()
        ctx.wake("slow")
        assert ran.wait(5) and time.time() - woke < 1.0  # not after its 30 s interval
        assert len(ticks) == 2
    finally:
        runner.stop()
    assert runner.stats["slow"][0] == 1  # the failed tick is not counted as done


def test_only_one_of_two_runners_ticks_a_singleton(tmp_path: Path) -> None:
    counts = {"a": 0, "b": 0}

    def counter(name: str) -> BackgroundLoop:
        def tick(_ctx: ServerContext, _now: float) -> None:
            counts[name] += 1

        return BackgroundLoop("work", 0.02, tick)

    first = LoopRunner(_ctx(tmp_path, "host:1:a"), [counter("a")])
    second = LoopRunner(_ctx(tmp_path, "host:2:b"), [counter("b")])
    first.start()
    time.sleep(0.3)
    second.start()
    time.sleep(0.5)
    first.stop()  # releases its lease: the other takes over without waiting for the TTL
    before = counts["b"]
    time.sleep(1.0)
    second.stop()
    assert counts["a"] > 5 and before == 0 and counts["b"] > 5


def test_the_engine_sets_the_reconcile_pace_and_a_waiting_tick_does_not_rest(tmp_path: Path) -> None:
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
    starts: list[float] = []

    def tick(_ctx: ServerContext, _now: float) -> None:
        starts.append(time.monotonic())
        if len(starts) < 3:
            time.sleep(0.3)  # waiting, as for squeue: no CPU
            _ctx.wake("waits")

    runner = LoopRunner(ctx, [BackgroundLoop("waits", 60.0, tick, singleton=False)])
    runner.start()
    try:
        deadline = time.monotonic() + 10
        while len(starts) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        runner.stop()
    assert len(starts) >= 3
    # woken during a 0.3 s tick: the next starts right after it, not 2 x 0.3 s after it began
    assert starts[1] - starts[0] < 0.5, starts
