"""`las` makes progress with multi-node gangs: a gang that preempts for room keeps that room.

The churn this guards against (4 nodes x 8 GPUs): a, b, c hold three nodes in LAS queue 1;
d ends at 1,000 and frees the fourth. At 1,000 the 16-GPU gang g (queue 0) does not fit, so it
preempts a and counts on the free node; x, after g in the order, then took that free node in the
same cycle. At 1,030 a has stopped, g again finds one free node, preempts b and counts on a's
node, which a (back in the queue) then retook; and so on every 30 s grace: g started only when x
ended (6,010 instead of 1,030), after 167 preemptions in which a and b kept no work. With a steady
stream of such jobs (the random trace below) it never ended: the simulated clock ran on forever.
"""

from __future__ import annotations

import math
import random

from corral.scheduler import Scheduler
from corral.scheduler.types import Plan, Snapshot
from corral.sim.cluster import ClusterSpec
from corral.sim.metrics import summarize
from corral.sim.replay import SimConfig, SimResult, Simulator
from corral.sim.runner import resolve_policy
from corral.sim.trace import Trace

from .helpers import cluster, trace

GANG = {"instances": 2}


class NoProgress(AssertionError):
    pass


def replay_bounded(tr: Trace, cl: ClusterSpec, bound_s: float) -> SimResult:
    """Replay under `las`, failing as soon as the simulated clock passes `bound_s` (a livelocked
    replay would otherwise never return)."""

    class Bounded:
        """Wraps the scheduler (the simulator takes any PlanMaker; the compiled Scheduler cannot be
        subclassed by a class defined here)."""

        def __init__(self, scheduler: Scheduler) -> None:
            self.scheduler, self.profile = scheduler, scheduler.profile

        def schedule(self, snapshot: Snapshot, now: float, rng: random.Random) -> Plan:
            if now > bound_s:
                raise NoProgress(f"las replay still running at t={now:.0f} s (bound {bound_s:.0f} s)")
            return self.scheduler.schedule(snapshot, now, rng)

    bounded = Bounded(Scheduler(resolve_policy("las").profile))
    return Simulator(tr, cl, bounded, policy_name="las", config=SimConfig()).run()


def serial_bound(tr: Trace) -> float:
    """Every job run one after another from the last submission: any scheduler that keeps at
    least one job making progress ends well before this."""
    return max(j.submit_time for j in tr.jobs) + sum(j.duration for j in tr.jobs)


def test_gang_that_preempts_starts_once_its_victim_has_stopped() -> None:
    tr = trace(
        ("a", 0, 50_000, 8),
        ("b", 0, 50_000, 8),
        ("c", 0, 50_000, 8),
        ("d", 0, 1_000, 8),
        ("g", 1_000, 5_000, 16, GANG),
        ("x", 1_000, 5_000, 8),
    )
    result = replay_bounded(tr, cluster(4, 8), serial_bound(tr))
    jobs = {j.trace.job_id: j for j in result.jobs}
    assert all(not math.isnan(j.end) for j in jobs.values())
    # g waits only for its victims' 30 s grace, and nobody is preempted twice
    assert jobs["g"].first_start == 1_030.0
    assert all(j.preemptions <= 1 for j in jobs.values())
    assert result.preemptions <= 2


def random_gang_trace(seed: int, n: int) -> Trace:
    """Jobs every 0-120 s: 40% 16-GPU gangs (2 x 8), the rest 1, 2, 4 or 8 GPUs; 1-20,000 s."""
    rng = random.Random(seed)
    t = 0.0
    rows: list[tuple[str, float, float, int] | tuple[str, float, float, int, dict[str, int]]] = []
    for i in range(n):
        t += rng.randint(0, 120)
        if rng.random() < 0.4:
            rows.append((f"j{i}", t, float(rng.randint(600, 20_000)), 16, GANG))
        else:
            gpus = rng.choice([1, 2, 4, 8])
            rows.append((f"j{i}", t, float(rng.randint(60, 20_000)), gpus))
    return trace(*rows)


def test_random_gang_trace_finishes_every_job() -> None:
    # seed 12 livelocked before the fix (two gangs preempting 1-8 GPU jobs every 30 s)
    tr = random_gang_trace(12, 30)
    result = replay_bounded(tr, cluster(4, 8), serial_bound(tr))
    summary = summarize(result)
    assert summary["jobs_unfinished"] == 0 and summary["jobs"] == 30
    total_gpu_s = sum(j.duration * j.num_gpus for j in tr.jobs)
    # the work fits the 32 GPUs in about total/32 s; allow generous slack for gangs and preemption
    assert summary["makespan_s"] < 4 * total_gpu_s / 32
    assert result.preemptions < 100
