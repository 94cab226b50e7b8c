"""A busy replay gives the same results whether the scheduler replays outcomes it already knows
within a cycle (`Scheduler(replay_known=True)`, the default) or works every job out afresh."""

from __future__ import annotations

import random

import pytest

from corral.scheduler import PROFILES, Priority, Scheduler
from corral.sim.replay import SimConfig, SimResult, Simulator
from corral.sim.trace import Trace

from .helpers import cluster, run, trace


def busy_trace(seed: int, jobs: int = 300, widest: int = 16) -> Trace:
    rng = random.Random(seed)
    made = []
    t = 0.0
    for k in range(jobs):
        t += rng.expovariate(1 / 40.0)  # about 4 GPUs asked per 40 s on 32 GPUs: queues build up
        gpus = rng.choice([g for g in (1, 1, 1, 2, 4, 8, 16) if g <= widest])
        extra = {
            "group": rng.choice(["a", "b", "c"]),
            "instances": 2 if gpus == 16 else 1,
            "priority": rng.choice([Priority.LOW, Priority.NORMAL, Priority.NORMAL, Priority.HIGH]),
        }
        made.append((f"j{k}", round(t, 1), float(rng.choice([60, 600, 3600, 20000])), gpus, extra))
    return trace(*made)


def outcome(result: SimResult) -> list[tuple[object, ...]]:
    # NaN (no estimate, never ended) as None: NaN != NaN, and equal tuples held it only because
    # pure Python passed the same NaN object along (compiled code boxes a new one each time)
    return [
        tuple(
            None if v != v else v
            for v in (j.trace.job_id, j.first_start, j.end, j.eta, j.preemptions, j.lost_work_s, j.attempt)
        )
        for j in result.jobs
    ]


@pytest.mark.parametrize("policy", ["default", "fifo-backfill", "las", "sjf"])
def test_replay_with_known_outcomes_equals_fresh_work(policy: str) -> None:
    # LAS with 16-GPU gangs on this small cluster preempts back and forth without end (in the
    # original code too): keep its gangs to one node
    tr = busy_trace(seed=7, widest=8 if policy == "las" else 16)
    groups = [
        {"name": "a", "guaranteed": 16, "max": 32},
        {"name": "b", "guaranteed": 8},
        {"name": "c", "guaranteed": 8, "borrowing": False},
    ]
    cl = cluster(4, 8, groups)
    memo, _ = run(tr, cl, policy)
    fresh = Simulator(tr, cl, Scheduler(PROFILES[policy], replay_known=False), policy, SimConfig()).run()
    assert outcome(memo) == outcome(fresh)
    assert (memo.cycles, memo.preemptions) == (fresh.cycles, fresh.preemptions)
    assert list(memo.alloc_gpus) == list(fresh.alloc_gpus)
    assert memo.frag_samples == fresh.frag_samples
    waited = [j for j in memo.jobs if j.first_start > j.trace.submit_time]
    assert len(waited) > 20  # the trace is busy enough for queues (and so for replayed outcomes)


@pytest.mark.pure_scheduler  # it spies on KnownOutcomes._replay_held_off (conftest.py)
def test_deep_heterogeneous_replay_with_known_outcomes_equals_fresh_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The outcomes replayed only on a cluster of several GPU models (held off by a reservation
    although it leaves the job models its shape already failed on; outcomes kept across
    reservations opened since) give what working every job out afresh gives, and they are used."""
    from corral.scheduler.known import KnownOutcomes
    from corral.sim.cluster import load_cluster
    from corral.sim.synth import SynthSpec, generate

    cl = load_cluster("synth")
    # 1,000 jobs: on 600, a rule that held off jobs whatever models were left still gave equal results
    tr = generate(SynthSpec(jobs=1000, load=1.5, seed=0), cl)
    original = KnownOutcomes._replay_held_off
    on_left_models = 0

    def spy(self: KnownOutcomes, job, info, token, key):  # type: ignore[no-untyped-def]
        nonlocal on_left_models
        held = original(self, job, info, token, key)
        if held:
            allowed = self.admitted[key][1]
            reserved, _ = self.backfill.reserved_for_others(job, info)
            on_left_models += bool((info.model_set if allowed is None else allowed) - reserved)
        return held

    monkeypatch.setattr(KnownOutcomes, "_replay_held_off", spy)
    memo, _ = run(tr, cl, "default")
    monkeypatch.undo()
    fresh = Simulator(
        tr, cl, Scheduler(PROFILES["default"], replay_known=False), "default", SimConfig()
    ).run()
    assert outcome(memo) == outcome(fresh)
    assert (memo.cycles, memo.preemptions) == (fresh.cycles, fresh.preemptions)
    assert list(memo.alloc_gpus) == list(fresh.alloc_gpus)
    assert on_left_models > 100  # the rule for models left to a job was exercised
