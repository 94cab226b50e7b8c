"""The preemption candidates' lists (`Preemptor._build`, `_rank`) are each their part of every
candidate sorted in victim order: the borrowed ones sorted at the first search of a cycle, each
(group, priority)'s on first ask, instead of all of them sorted and indexed."""

from __future__ import annotations

import random
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler import PROFILES, Priority, Scheduler
from corral.scheduler.core import Cycle
from corral.scheduler.preemption import Candidate, Preemptor
from tests.scheduler.builders import gpu_node, job, running, snap

RUNNING = st.lists(
    st.tuples(
        st.sampled_from(["g", "h", "k"]),
        st.sampled_from(list(Priority)),
        st.integers(0, 3),  # start time: few values, so ties are broken by the id
        st.booleans(),  # borrowed
        st.booleans(),  # preemptible
        st.sampled_from([0, 1, 16, 20]),  # preemptions so far (max_preemptions 16 spares some)
    ),
    max_size=24,
)


def _same(got: list[Candidate], want: list[Candidate]) -> bool:
    return [(c.rj, c.gpus_by_model, c.las) for c in got] == [(c.rj, c.gpus_by_model, c.las) for c in want]


@settings(max_examples=200, deadline=None)
@given(RUNNING, st.sampled_from(["default", "fifo-backfill", "las"]))
def test_each_candidate_list_is_its_part_of_the_full_victim_order(specs: list[tuple], policy: str) -> None:  # type: ignore[type-arg]
    nodes = [gpu_node(f"n{i}") for i in range(3)]
    run = []
    for n, (group, priority, start, borrowed, preemptible, preempted) in enumerate(specs):
        j = replace(
            job(f"r{n}", group=group, priority=priority, preemptible=preemptible), preemptions=preempted
        )
        run.append(running(j, f"n{n % 3}", (n // 3,), start=float(start), borrowed=borrowed))
    profile = PROFILES[policy]
    cycle = Cycle(Scheduler(profile), snap(nodes, run=run), 100.0, random.Random(0))
    preemptor = cycle.preemptor
    preemptor._build()
    bound = profile.max_preemptions or None
    pairs = [
        (rj, pm)
        for rj, pm in preemptor.running
        if rj.job.preemptible and not rj.stopping and (bound is None or rj.job.preemptions < bound)
    ]
    if policy == "las":
        assert len(preemptor.candidates) == len(pairs)
        return
    full = sorted((Candidate(rj, pm, 0) for rj, pm in pairs), key=Preemptor.order_key)
    assert _same(preemptor.borrowed, [c for c in full if c.rj.borrowed])
    for group in ("g", "h", "k", "z"):
        for priority in Priority:
            part = [c for c in full if c.rj.job.group == group and c.rj.job.priority == priority]
            assert _same(preemptor._rank(group, int(priority)), part)
            assert preemptor._rank(group, int(priority)) is preemptor._rank(group, int(priority))  # made once
