"""A Scheduler owns its caches: two in one process share nothing, and each gives, cycle after
cycle, exactly the plans a fresh Scheduler gives."""

from __future__ import annotations

import dataclasses
import gc
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import PROFILES, Plan, Priority, Scheduler, Snapshot
from tests.scheduler.builders import apply_plan, gpu_node, job, running, snap
from tests.scheduler.strategies import snapshots


def canonical(plan: Plan) -> tuple[object, ...]:
    return (plan.assignments, plan.preemptions, dict(plan.diagnoses))


def fresh(s: Snapshot, name: str, now: float) -> Plan:
    return Scheduler(PROFILES[name]).schedule(s, now, random.Random(0))


@settings(max_examples=15, deadline=None)
@given(
    snapshots(max_nodes=6, max_jobs=10),
    snapshots(max_nodes=6, max_jobs=10),
    st.sampled_from(["default", "las", "fifo-backfill", "sjf"]),
    st.sampled_from(["default", "las", "fifo-backfill", "fifo"]),
)
def test_two_schedulers_in_one_process_are_independent(
    first: Snapshot, second: Snapshot, name_a: str, name_b: str
) -> None:
    """Cycles of two Schedulers (different clusters and profiles) interleaved, over the very same
    Job objects (the second snapshot's queue is the first's jobs too, so a shared per-job memo
    would answer for the wrong cluster): every plan equals a fresh Scheduler's."""
    second = dataclasses.replace(second, queued=first.queued + second.queued)
    a, b = Scheduler(PROFILES[name_a]), Scheduler(PROFILES[name_b])
    for cycle in range(3):
        now = 100.0 + 60 * cycle
        plan_a = a.schedule(first, now, random.Random(0))
        plan_b = b.schedule(second, now, random.Random(0))
        assert canonical(plan_a) == canonical(fresh(first, name_a, now))
        assert canonical(plan_b) == canonical(fresh(second, name_b, now))
        first, second = apply_plan(first, plan_a, now), apply_plan(second, plan_b, now)
    # each keeps only what it saw: node tables of its own clusters
    assert all(t.nodes is first.nodes for t in a.cluster_memo.tables)
    assert all(t.nodes is second.nodes for t in b.cluster_memo.tables)


def test_caches_are_per_instance() -> None:
    """What one Scheduler learns stays in it (nothing is kept at module level)."""
    a, b = Scheduler(), Scheduler()
    assert a.cluster_memo is not b.cluster_memo and a.job_kinds is not b.job_kinds
    cluster = snap([gpu_node("n", gpus=2)], [job("j", gpus=1)])
    a.schedule(cluster, 0.0, random.Random(0))
    assert len(a.cluster_memo.tables) == 1 and b.cluster_memo.tables == []
    assert a.job_kinds.memo_for(a.cluster_memo.cluster_shapes(cluster.nodes, False))
    assert not b.job_kinds.memo_for(b.cluster_memo.cluster_shapes(cluster.nodes, False))


def test_a_cycle_is_freed_with_its_plan_without_the_garbage_collector() -> None:
    """No reference cycle between a cycle's parts: its state goes as soon as its plan does (a
    cycle left to the collector made the whole Philly replay about 1.5x slower)."""
    nodes = [gpu_node("a", gpus=4), gpu_node("b", gpus=4)]
    queued = [job(f"q{i}", gpus=2, submit=i, priority=Priority.HIGH) for i in range(6)]
    run = [running(job("r", gpus=4, priority=Priority.LOW), "a", (0, 1, 2, 3))]
    s = snap(nodes, queued, run=run)
    # Everything alive before the checks is frozen out of the collector's scans: after hundreds
    # of tests in one process a full collection took ~1 s, 24 of them 21 s of a full run.
    gc.collect()
    gc.freeze()
    try:
        for profile in PROFILES.values():
            for read_diagnoses in (False, True):
                assert_freed_with_its_plan(Scheduler(profile), s, read_diagnoses)
    finally:
        gc.unfreeze()


def assert_freed_with_its_plan(scheduler: Scheduler, s: Snapshot, read_diagnoses: bool) -> None:
    gc.collect()
    gc.disable()
    # Only the scheduler's own objects count: threads of earlier tests (a stopped server's, the
    # SSH gateway's) may leave garbage of their own meanwhile.
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        plan = scheduler.schedule(s, 10.0, random.Random(0))
        if read_diagnoses:
            dict(plan.diagnoses)
        del plan
        gc.collect()
        cyclic = [o for o in gc.garbage if type(o).__module__.startswith("corral.")]
        assert cyclic == [], (read_diagnoses, [type(o).__qualname__ for o in cyclic][:10])
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
