"""The preemption search's shortcut (`Preemptor._short_even_if_all_released`): when upper bounds
show that even the whole pool of victims released would leave too few free GPUs (or no block as
wide as one instance), the search ends without releasing and restoring each candidate. It must
change nothing: the same plans as the search without it, and whenever it says so, releasing the
pool one by one must fail the capacity test after every release."""

from __future__ import annotations

import dataclasses
import random
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import ANY_MODEL, PROFILES, Plan, Priority, Scheduler, Snapshot, Usage
from corral.scheduler.preemption import Candidate, Preemptor
from corral.scheduler.types import GPU, Node, NodeState
from tests.scheduler.builders import cpu_node, gpu_node, group, job, running
from tests.scheduler.test_known_outcomes import assert_same, crowded, preemption_heavy

# Every test here patches Preemptor's shortcut: they run on the pure-Python scheduler (conftest.py).
pytestmark = pytest.mark.pure_scheduler

SHORTCUT = Preemptor._short_even_if_all_released
# CPUs that are not binary fractions: releasing and restoring them is not exact in floating point
# (8 - 2.3 - 1.6 + 1.6 is not 8 - 2.3), and a CPU job's best fit reads the free CPUs left behind
FRACTIONAL_CPUS = st.sampled_from([1.0, 1.0, 0.2, 1.6, 2.3, 7.7])


def mixed_node(name: str, width: int, state: NodeState, unhealthy: int | None) -> Node:
    """A node with two GPU models (the bound's per-GPU path) and maybe one unhealthy GPU."""
    gpus = tuple(
        GPU(index=i, uuid=f"{name}-{i}", model="A100" if i % 2 else "V100M32", healthy=i != unhealthy)
        for i in range(width)
    )
    return Node(name=name, cpus=64, memory_mib=512 * 1024, gpus=gpus, state=state)


@st.composite
def searches(draw: st.DrawFn) -> Snapshot:
    """A full cluster of preemptible work of several sizes on one- and two-model nodes (some down,
    some GPUs unhealthy; fractional CPUs), and waiting jobs, CPU-only ones too, up to two whole
    nodes wide: many searches that fail on
    the count, on the widest block, or only at placement."""
    width = draw(st.sampled_from([4, 8]))
    nodes: list[Node] = []
    for i in range(draw(st.integers(1, 4))):
        state = draw(st.sampled_from([NodeState.READY, NodeState.READY, NodeState.READY, NodeState.DOWN]))
        if draw(st.booleans()):
            nodes.append(mixed_node(f"n{i}", width, state, draw(st.sampled_from([None, None, 1]))))
        else:
            nodes.append(gpu_node(f"n{i}", gpus=width, model="A100", state=state))
    groups = [
        group("a", guaranteed={ANY_MODEL: draw(st.integers(0, 2 * width))}, borrowing=True),
        group("b", guaranteed={ANY_MODEL: draw(st.integers(0, 2 * width))}, borrowing=True),
    ]
    run = []
    for node in nodes:
        healthy = [g.index for g in node.gpus if g.healthy]
        at = 0
        while at < len(healthy) and draw(st.integers(0, 6)) > 0:
            k = min(draw(st.sampled_from([1, 1, 2, 3])), len(healthy) - at)
            rj = job(
                f"r-{node.name}-{at}",
                gpus=k,
                group=draw(st.sampled_from(["a", "b"])),
                priority=draw(st.sampled_from([Priority.LOW, Priority.NORMAL])),
                preemptible=draw(st.integers(0, 4)) > 0,
                runtime=draw(st.sampled_from([None, 500.0, 5000.0])),
                attained=float(draw(st.sampled_from([0, 50000]))),
                cpus=draw(FRACTIONAL_CPUS),
            )
            placed = running(
                rj, node.name, tuple(healthy[at : at + k]), start=float(at), borrowed=draw(st.booleans())
            )
            if draw(st.integers(0, 6)) == 0:
                placed = dataclasses.replace(placed, stopping=True)
            run.append(placed)
            at += k
    queued = [
        job(
            f"q{k}",
            gpus=draw(st.sampled_from([0, 1, 2, width - 1, width, width])),
            cpus=draw(FRACTIONAL_CPUS),
            instances=draw(st.sampled_from([1, 1, 2])),
            group=draw(st.sampled_from(["a", "b"])),
            priority=draw(st.sampled_from([Priority.HIGH, Priority.NORMAL])),
            model=draw(st.sampled_from([None, None, "A100", "V100M32"])),
            submit=float(k),
            runtime=draw(st.sampled_from([None, 100.0])),
        )
        for k in range(draw(st.integers(1, 25)))
    ]
    return Snapshot(tuple(nodes), tuple(groups), tuple(queued), tuple(run), Usage())


def plan_of(s: Snapshot, profile_name: str, attempts: int, shortcut: bool) -> Plan:
    profile = dataclasses.replace(PROFILES[profile_name], max_preemption_attempts=attempts)
    if shortcut:
        return Scheduler(profile).schedule(s, 1000.0, random.Random(0))
    with mock.patch.object(Preemptor, "_short_even_if_all_released", lambda *_: False):
        return Scheduler(profile).schedule(s, 1000.0, random.Random(0))


def checked_shortcut(
    self: Preemptor, pool: list[Candidate], models: tuple[str, ...], total: int, widest: int
) -> bool:
    """The shortcut, and when it says "short", the loop it stands for run to check it: release
    the pool one by one, the capacity test failing after each release, then restore it."""
    short = SHORTCUT(self, pool, models, total, widest)
    if short:
        for c in pool:
            self._release(c, -1)
            assert self.st.too_small(models, total, widest)
        for c in reversed(pool):
            self._release(c, 1)
    return short


@settings(max_examples=150, deadline=None)
@given(searches(), st.sampled_from(["default", "las"]), st.integers(1, 16))
def test_shortcut_gives_the_plans_of_the_full_search(s: Snapshot, name: str, attempts: int) -> None:
    with mock.patch.object(Preemptor, "_short_even_if_all_released", checked_shortcut):
        fast = plan_of(s, name, attempts, shortcut=True)
    assert_same(fast, plan_of(s, name, attempts, shortcut=False))


@settings(max_examples=60, deadline=None)
@given(st.one_of(crowded(), preemption_heavy()), st.sampled_from(["default", "las"]))
def test_shortcut_on_the_replay_tests_snapshots(s: Snapshot, name: str) -> None:
    with mock.patch.object(Preemptor, "_short_even_if_all_released", checked_shortcut):
        fast = plan_of(s, name, 16, shortcut=True)
    assert_same(fast, plan_of(s, name, 16, shortcut=False))


def test_shortcut_ends_a_search_that_no_release_could_help() -> None:
    """Each node pinned by a job that may not be preempted: a whole-node job can never get a
    block as wide as one node, however many victims go, so the search ends at the bound."""
    nodes = [gpu_node(f"n{i}", gpus=4) for i in range(3)]
    run = []
    for node in nodes:
        run.append(running(job(f"pin-{node.name}", preemptible=False), node.name, (0,), start=0.0))
        for g in range(1, 4):
            low = job(f"r-{node.name}-{g}", priority=Priority.LOW)
            run.append(running(low, node.name, (g,), start=float(g)))
    queued = (job("wide", gpus=4, priority=Priority.HIGH),)
    s = Snapshot(tuple(nodes), (group("g", guaranteed={ANY_MODEL: 12}),), queued, tuple(run), Usage())
    calls: list[bool] = []

    def counting(self: Preemptor, *args: object) -> bool:
        calls.append(SHORTCUT(self, *args))  # type: ignore[arg-type]
        return calls[-1]

    with mock.patch.object(Preemptor, "_short_even_if_all_released", counting):
        fast = plan_of(s, "default", 16, shortcut=True)
    assert calls == [True]
    assert fast.preemptions == ()
    assert_same(fast, plan_of(s, "default", 16, shortcut=False))


def test_a_search_leaves_fractional_cpus_to_the_last_bit() -> None:
    """Two CPU nodes hold 2.3 + 1.6 + 0.2 CPUs each (only c0's two small jobs preemptible); a
    1-GPU job finds the only GPU pinned, so its search releases c0's jobs and restores them; then a
    1-CPU job takes the best fit. 8 - 2.3 - 1.6 - 0.2 and the same after a release and restore
    differ in the last bit: without an exact restore the full search sent the CPU job to c1 and the
    shortcut (which releases nothing) to c0."""
    nodes = (cpu_node("c0", cpus=8.0), cpu_node("c1", cpus=8.0), gpu_node("g0", gpus=1))
    run = [running(job("pin", gpus=1, preemptible=False), "g0", (0,))]
    for n in ("c0", "c1"):
        run.append(running(job(f"w-{n}", gpus=0, cpus=2.3, preemptible=False), n, ()))
        for name, cpus, start in (("a", 1.6, 2.0), ("b", 0.2, 1.0)):
            low = job(f"{name}-{n}", gpus=0, cpus=cpus, priority=Priority.LOW, preemptible=n == "c0")
            run.append(running(low, n, (), start=start))
    queued = (job("gpu", gpus=1, priority=Priority.HIGH), job("cpu", gpus=0, cpus=1.0, submit=1.0))
    s = Snapshot(nodes, (group("g", guaranteed={ANY_MODEL: 8}),), queued, tuple(run), Usage())
    fast, full = plan_of(s, "default", 16, shortcut=True), plan_of(s, "default", 16, shortcut=False)
    assert [a.job_id for a in fast.assignments] == ["cpu"]
    assert_same(fast, full)
