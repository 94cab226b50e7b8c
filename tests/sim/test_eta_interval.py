"""`SimConfig.eta_interval_s` (`corral sim --eta-interval`) against the default reads, on random
small traces: it moves only when estimates are read, never the schedule (every start, end,
preemption and wait is the same); a read at every cycle (an interval shorter than any gap between
cycles) gives exactly the default's estimates; and a job shown an estimate under the interval had
not started when it was read (never an estimate for a job that started at once)."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

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
