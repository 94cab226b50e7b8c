"""`SimConfig.eta_interval_s` (`corral sim --eta-interval`) against the default reads, on random
small traces: it moves only when estimates are read, never the schedule (every start, end,
preemption and wait is the same); a read at every cycle (an interval shorter than any gap between
cycles) gives exactly the default's estimates; and a job shown an estimate under the interval had
not started when it was read (never an estimate for a job that started at once)."""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler.diagnosis import LazyDiagnoses
from corral.scheduler.types import Plan, Snapshot
from corral.sim.replay import SimConfig, Simulator
from corral.sim.runner import resolve_policy

from .helpers import cluster, run, trace

arrivals = st.lists(
    st.tuples(
        st.integers(0, 3000).map(float),  # submit (whole seconds: cycles >= 1 s apart)
        st.sampled_from([30.0, 200.0, 900.0, 4000.0]),  # duration
        st.sampled_from([1, 2, 4, 8]),  # GPUs
        st.sampled_from(["g", "h"]),  # group
        st.sampled_from([None, 300.0, 5000.0]),  # max_runtime_s: the estimate when there is no history
    ),
    min_size=1,
    max_size=30,
)
GROUPS = [{"name": "g", "guaranteed": 8}, {"name": "h", "guaranteed": 8}]


def _schedule(jobs: dict[str, object]) -> dict[str, tuple[float, float, int, float]]:
    return {k: (j.first_start, j.end, j.preemptions, j.waited_s) for k, j in jobs.items()}  # type: ignore[attr-defined]


@settings(max_examples=40, deadline=None)
@given(rows=arrivals, policy=st.sampled_from(["fifo", "default"]), interval=st.sampled_from([60.0, 600.0]))
def test_interval_moves_only_the_reads(
    rows: list[tuple[float, float, int, str, float | None]], policy: str, interval: float
) -> None:
    tr = trace(
        *(
            (f"j{k}", submit, duration, gpus, {"group": group, "max_runtime_s": limit})
            for k, (submit, duration, gpus, group, limit) in enumerate(rows)
        )
    )
    cl = cluster(2, 8, GROUPS)
    _, plain = run(tr, cl, policy)
    _, every_cycle = run(tr, cl, policy, eta_interval_s=0.5)  # a read at every cycle
    _, spaced = run(tr, cl, policy, eta_interval_s=interval)
    assert _schedule(spaced) == _schedule(plain) == _schedule(every_cycle)
    for k, j in plain.items():
        assert every_cycle[k].eta == j.eta or (math.isnan(every_cycle[k].eta) and math.isnan(j.eta)), k
        shown = spaced[k].eta
        if not math.isnan(shown):
            assert j.first_start > j.trace.submit_time or math.isnan(j.first_start), k


class _AskCounter:
    """The default policy's Scheduler, with every estimate read from its plans recorded: the ids
    the simulator asked for (through `LazyDiagnoses.estimated_starts`), one list per ask."""

    def __init__(self) -> None:
        self.inner = resolve_policy("default")
        self.profile = self.inner.profile
        self.asks: list[list[str]] = []

    def schedule(self, snapshot: Snapshot, now: float, rng: random.Random) -> Plan:
        plan = self.inner.schedule(snapshot, now, rng)
        lazy = plan.diagnoses
        assert isinstance(lazy, LazyDiagnoses)

        def etas(job_ids: Collection[str]) -> dict[str, float | None]:
            self.asks.append(list(job_ids))
            return lazy.estimated_starts(job_ids)

        return replace(plan, diagnoses=LazyDiagnoses(lambda: dict(lazy), etas=etas))


@settings(max_examples=25, deadline=None)
@given(rows=arrivals, interval=st.sampled_from([0.0, 600.0]))
def test_a_cycle_with_no_job_due_asks_the_plan_for_no_estimate(
    rows: list[tuple[float, float, int, str, float | None]], interval: float
) -> None:
    """The simulator reads estimates only in cycles where some new job is due (waiting, not
    placed by the plan, and under `eta_interval_s` the read's time has come): a cycle whose new
    jobs all started, or that falls between two reads, does not call into the plan at all (it
    used to ask for an empty list at every cycle); the estimates are those of a plain run."""
    tr = trace(
        *(
            (f"j{k}", submit, duration, gpus, {"group": group, "max_runtime_s": limit})
            for k, (submit, duration, gpus, group, limit) in enumerate(rows)
        )
    )
    cl = cluster(2, 8, GROUPS)
    _, plain = run(tr, cl, "default", eta_interval_s=interval)
    counter = _AskCounter()
    result = Simulator(tr, cl, counter, "default", SimConfig(eta_interval_s=interval)).run()
    assert all(counter.asks), counter.asks  # never an empty ask
    assert result.cycles >= len(counter.asks)
    asked = {j for ask in counter.asks for j in ask}
    for j in result.jobs:
        want = plain[j.trace.job_id].eta
        assert j.eta == want or (math.isnan(j.eta) and math.isnan(want)), j.trace.job_id
        if not math.isnan(j.eta):
            assert j.trace.job_id in asked
