"""Hand-made traces whose right answers are worked out by hand in the comments."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from corral.scheduler import PROFILES, schedule
from corral.sim.metrics import summarize
from corral.sim.replay import SimConfig, Simulator
from corral.sim.runner import PolicyError, resolve_policy
from corral.sim.trace import load_generic_csv, write_generic_csv

from .helpers import cluster, run, trace


def starts(jobs: dict[str, object]) -> dict[str, float]:
    return {k: j.first_start for k, j in jobs.items()}  # type: ignore[attr-defined]


def test_fifo_runs_jobs_in_submit_order_with_head_of_line_blocking() -> None:
    # One node of 4 GPUs. a holds all 4 until 100. b (4 GPUs) is next; c (1 GPU) came later and may
    # not pass b under strict FIFO, even though it would fit beside nothing else: b 100-150, c 150.
    tr = trace(("a", 0, 100, 4), ("b", 1, 50, 4), ("c", 2, 10, 1))
    result, jobs = run(tr, cluster(1, 4), "fifo", oracle_runtime=True)  # runtimes known
    assert starts(jobs) == {"a": 0, "b": 100, "c": 150}
    assert {k: j.end for k, j in jobs.items()} == {"a": 100, "b": 150, "c": 160}
    assert result.cycles >= 3 and not result.rejected


def test_backfill_jumps_the_gap_only_when_harmless() -> None:
    # a holds 3 of 4 GPUs until 100; b needs all 4 so it waits for 100 (its reservation).
    # c (1 GPU, 50 s) fits the free GPU and ends at 52 < 100: EASY backfill starts it at once.
    # d (1 GPU, 200 s) arrives at 60 into the free GPU but would still run at 100 and delay b:
    # it waits until b is done (150).
    tr = trace(("a", 0, 100, 3), ("b", 1, 50, 4), ("c", 2, 50, 1), ("d", 60, 200, 1))
    _, backfill = run(tr, cluster(1, 4), "fifo-backfill", oracle_runtime=True)  # runtimes known
    assert starts(backfill) == {"a": 0, "b": 100, "c": 2, "d": 150}
    _, strict = run(tr, cluster(1, 4), "fifo")
    assert starts(strict) == {"a": 0, "b": 100, "c": 150, "d": 150}


def test_gang_waits_for_whole_nodes_all_or_nothing() -> None:
    # Two nodes of 4 GPUs; a takes 1 GPU until 100. g needs 2 instances x 4 GPUs: 7 GPUs are free
    # but no partial start is allowed, so it starts at 100 with one whole node per instance.
    tr = trace(("a", 0, 100, 1), ("g", 1, 10, 8, {"instances": 2}))
    result, jobs = run(tr, cluster(2, 4), "fifo", record_cycles=True)
    assert starts(jobs) == {"a": 0, "g": 100}
    placed = [a for rec in result.records for a in rec.plan.assignments if a.job_id == "g"]
    assert len(placed) == 1
    nodes = [(p.node, len(p.gpu_indices)) for p in placed[0].allocation.instances]
    assert sorted(nodes) == [("n-0000", 4), ("n-0001", 4)]


@pytest.mark.parametrize(("interval", "a_end", "lost"), [(1000.0, 10130.0, 30.0), (0.0, 15130.0, 5030.0)])
def test_preemption_loses_the_work_since_the_last_checkpoint(
    interval: float, a_end: float, lost: float
) -> None:
    # One GPU. a (10,000 s) has attained 5,000 GPU-s > 3,600 (LAS queue 1) when b arrives at 5,000
    # (queue 0): LAS preempts a with a 30 s grace, so a stops at 5,030 and b runs 5,030-5,130.
    # With checkpoints every 1,000 s a keeps 5,000 s of work (loses 30 s) and ends at 10,130;
    # without checkpoints it restarts from scratch (loses 5,030 s) and ends at 15,130.
    tr = trace(("a", 0, 10_000, 1), ("b", 5_000, 100, 1))
    result, jobs = run(tr, cluster(1, 1), "las", checkpoint_interval_s=interval)
    grace = PROFILES["las"].grace_s
    assert grace == 30.0
    assert (jobs["b"].first_start, jobs["b"].end) == (5_030.0, 5_130.0)
    assert jobs["a"].end == a_end and jobs["a"].lost_work_s == lost
    assert jobs["a"].preemptions == 1 and result.preemptions == 1


@pytest.mark.parametrize(
    ("trace_grace", "config", "stops_at"),
    [
        (None, {}, 5_030.0),  # the profile's grace
        (200.0, {}, 5_200.0),  # the trace's grace for this job
        (None, {"stop_grace_s": 90.0}, 5_090.0),  # the replay's default for jobs that give none
        (900.0, {"max_stop_grace_s": 300.0}, 5_300.0),  # bounded by the maximum
    ],
)
def test_preempted_job_gets_its_own_stop_grace(
    trace_grace: float | None, config: dict[str, float], stops_at: float
) -> None:
    # As above: LAS preempts a at 5,000 for b; b starts once a's grace is over.
    tr = trace(("a", 0, 10_000, 1, {"stop_grace_s": trace_grace}), ("b", 5_000, 100, 1))
    result, jobs = run(tr, cluster(1, 1), "las", **config)
    assert jobs["b"].first_start == stops_at
    assert jobs["a"].preemptions == 1 and result.preemptions == 1


def test_trace_stop_grace_column_round_trips(tmp_path: Path) -> None:
    tr = trace(("a", 0, 10, 1, {"stop_grace_s": 45.0}), ("b", 1, 10, 1))
    write_generic_csv(tr.jobs, tmp_path / "t.csv")
    loaded = {j.job_id: j.stop_grace_s for j in load_generic_csv(tmp_path / "t.csv").jobs}
    assert loaded == {"a": 45.0, "b": None}


def test_job_larger_than_any_node_is_reported_not_dropped() -> None:
    tr = trace(("ok", 0, 10, 2), ("huge", 0, 10, 16), ("wrong", 1, 10, 1, {"gpu_model": "A100"}))
    result, jobs = run(tr, cluster(2, 4), "default")
    assert set(jobs) == {"ok"}
    rejected = {tj.job_id: why for tj, why in result.rejected}
    assert set(rejected) == {"huge", "wrong"}
    assert all(why for why in rejected.values())


def test_records_replay_to_the_same_plans() -> None:
    # The recorded (snapshot, now, plan) of each cycle is exactly what schedule() returns for it:
    # the contract a live-loop test can reuse.
    tr = trace(
        *(
            (f"j{i}", i * 7.0, 30.0 + 11 * (i % 5), 1 + i % 4, {"group": "g" if i % 2 else "h"})
            for i in range(30)
        )
    )
    groups = [{"name": "g", "guaranteed": 4}, {"name": "h", "guaranteed": 4}]
    result, _ = run(tr, cluster(2, 4, groups), "default", record_cycles=True, seed=3)
    assert len(result.records) == result.cycles > 0
    import random

    rng = random.Random(3)
    for rec in result.records:
        assert schedule(rec.snapshot, rec.now, rng, PROFILES["default"]) == rec.plan


def test_node_failures_requeue_and_every_job_still_finishes() -> None:
    tr = trace(*((f"j{i}", i * 50.0, 400.0, 2) for i in range(20)))
    result, jobs = run(tr, cluster(3, 4), "default", node_mtbf_s=2_000.0, node_repair_s=300.0, seed=1)
    assert result.node_failures > 0
    assert all(not math.isnan(j.end) for j in jobs.values())
    assert any(j.attempt > 1 for j in jobs.values())


def test_a_job_waiting_for_a_node_repair_is_run_not_left_unfinished() -> None:
    """One node: it fails under the only job (seed 0: at 3,349 s), which goes back to the
    queue. Node events did not keep the replay going, so it ended when the stopped attempt's
    stale completion came up (t = 3,600) and reported the job unfinished (censored), although
    the node was back 2 h after failing and the job then ran to its end."""
    tr = trace(("a", 0.0, 3600.0, 1))
    result, jobs = run(tr, cluster(1, 4), "default", node_mtbf_s=1800.0, node_repair_s=7200.0, seed=0)
    assert result.node_failures >= 1 and jobs["a"].attempt > 1
    assert not math.isnan(jobs["a"].end) and jobs["a"].end > 7200.0
    assert summarize(result)["jobs_unfinished"] == 0


def test_unknown_policy_and_placement_are_named() -> None:
    with pytest.raises(PolicyError, match="unknown policy 'nope'"):
        resolve_policy("nope")
    with pytest.raises(PolicyError, match="fifo:diagonal"):
        resolve_policy("fifo:diagonal")
    spread = resolve_policy("fifo:spread")
    assert (spread.profile.order, spread.profile.placement) == ("fifo", "spread")
    assert resolve_policy("fifo") is not resolve_policy("fifo")  # one Scheduler (and cache) per replay


def test_snapshot_reflects_the_state_handed_to_schedule() -> None:
    tr = trace(("a", 0, 100, 4), ("b", 1, 50, 2))
    sim = Simulator(tr, cluster(1, 4), resolve_policy("fifo"), config=SimConfig(record_cycles=True))
    sim.run()
    second = sim.records[1]
    assert second.now == 1
    assert [j.id for j in second.snapshot.queued] == ["b"]
    assert [r.job.id for r in second.snapshot.running] == ["a"]
    assert second.snapshot.usage.by_group["g"] == pytest.approx(4.0)  # 4 GPUs x 1 s, no decay yet


def test_cycle_interval_defers_scheduling_to_the_next_tick() -> None:
    # Cycles only every 60 s: a (t=0) starts at 0, b arriving at 1 waits for the tick at 60,
    # c arriving at 61 starts at 120; far fewer schedule() calls than one per event time.
    # d arrives at 200 after a tick (180) at which nothing was waiting: it starts at the next, 240.
    tr = trace(("a", 0, 30, 1), ("b", 1, 30, 1), ("c", 61, 30, 1), ("d", 200, 5, 1))
    result, jobs = run(tr, cluster(1, 4), "fifo", cycle_interval_s=60.0)
    assert starts(jobs) == {"a": 0, "b": 60, "c": 120, "d": 240}
    assert result.cycles == 4


def test_estimated_start_is_compared_with_the_actual_start() -> None:
    # With oracle durations, b (waiting behind a, which ends at 100) is told it starts at 100 and
    # does; c behind b is told 150. The median absolute error is then 0.
    from corral.sim.metrics import summarize

    tr = trace(("a", 0, 100, 4), ("b", 1, 50, 4), ("c", 2, 10, 4))
    result, jobs = run(tr, cluster(1, 4), "fifo", oracle_runtime=True)  # runtimes known
    assert (jobs["b"].eta, jobs["c"].eta) == (100.0, 150.0)
    assert math.isnan(jobs["a"].eta)  # started in its first cycle: never waited, no estimate
    summary = summarize(result)
    assert summary["eta_median_abs_err_s"] == 0.0 and summary["eta_jobs"] == 2


def test_eta_interval_reads_new_jobs_estimates_together_at_most_once_per_interval() -> None:
    """eta_interval_s=60 (with true durations, one 4-GPU node, strict FIFO): b's estimate is read
    at its arrival (the first read), c's waits for the next cycle at or after 61 (d's arrival at
    90, which reads both); x, arriving at 95, is read at 150 (the first cycle at or after 150,
    when c starts); z arrives at 175, after that read, and starts at 180 before the next (210):
    it is shown none. Without the interval each gets the estimate of its arrival's cycle."""
    tr = trace(
        ("a", 0, 100, 4),
        ("b", 1, 50, 4),
        ("c", 2, 10, 4),
        ("d", 90, 10, 4),
        ("x", 95, 10, 4),
        ("z", 175, 10, 4),
    )
    _, jobs = run(tr, cluster(1, 4), "fifo", oracle_runtime=True, eta_interval_s=60.0)
    assert starts(jobs) == {"a": 0, "b": 100, "c": 150, "d": 160, "x": 170, "z": 180}
    assert (jobs["b"].eta, jobs["c"].eta, jobs["d"].eta, jobs["x"].eta) == (100.0, 150.0, 160.0, 170.0)
    assert math.isnan(jobs["z"].eta) and math.isnan(jobs["a"].eta)
    _, plain_jobs = run(tr, cluster(1, 4), "fifo", oracle_runtime=True)
    assert starts(plain_jobs) == starts(jobs)  # the schedule is the same: only the reads move
    assert plain_jobs["z"].eta == 180.0
    assert {j: plain_jobs[j].eta for j in "bcdx"} == {"b": 100.0, "c": 150.0, "d": 160.0, "x": 170.0}


def test_relative_eta_error_counts_only_jobs_that_waited_over_5_minutes() -> None:
    """Without true durations. a runs 0-1000 with max_runtime 2000 (its estimate, no history): b
    (arriving at 10) is told 2000 and starts at 1000: |2000 - 1000| / 990. c (arriving at 1400,
    behind b, whose estimate was the profile's 3600 s default: nothing had finished at 10) is told
    1000 + 3600 = 4600 and starts at 1500: counted in the absolute error (3100 s), not in the
    relative one (it waited 100 s)."""
    from corral.sim.metrics import summarize

    tr = trace(
        ("a", 0, 1000, 4, {"max_runtime_s": 2000.0}),
        ("b", 10, 500, 4),
        ("c", 1400, 50, 4, {"max_runtime_s": 100.0}),
    )
    result, jobs = run(tr, cluster(1, 4), "fifo")
    assert starts(jobs) == {"a": 0, "b": 1000, "c": 1500}
    assert (jobs["b"].eta, jobs["c"].eta) == (2000.0, 4600.0)
    summary = summarize(result)
    assert summary["eta_rel_jobs"] == 1 and summary["eta_rel_err_median"] == pytest.approx(1000 / 990)
    assert summary["eta_jobs"] == 2 and summary["eta_median_abs_err_s"] == pytest.approx((1000 + 3100) / 2)
    assert summary["eta_none_jobs"] == 0


def test_the_eta_shown_is_the_roll_corrected_by_the_replays_own_past_outcomes() -> None:
    """A synthetic overloaded trace, replayed with and without the ETA calibration: the schedule
    is the same (the policy never reads a shown ETA), and every ETA the calibrated replay records
    is the roll's (the uncalibrated replay's) corrected by an EtaCalibration fed, in time order,
    the (predicted, actual) waits of the jobs that had started by the moment it was shown."""
    from corral.scheduler.eta_calibration import EtaCalibration
    from corral.sim.cluster import load_cluster
    from corral.sim.synth import SynthSpec, generate

    synth = load_cluster("synth")
    tr = generate(SynthSpec(jobs=400, load=1.3, seed=0), synth)
    policy = resolve_policy("default")
    shown = Simulator(tr, synth, policy, config=SimConfig()).run()
    raw = Simulator(tr, synth, resolve_policy("default"), config=SimConfig(eta_calibration=False)).run()
    by_id = {j.trace.job_id: j for j in shown.jobs}
    assert [j.first_start for j in raw.jobs] == [by_id[j.trace.job_id].first_start for j in raw.jobs]
    events = []
    for j in raw.jobs:
        if math.isnan(j.eta):
            continue
        assert j.eta_read_at == j.trace.submit_time and j.eta == j.eta_read_at + j.eta_predicted_wait_s
        events.append((j.eta_read_at, 1, j))
        if not math.isnan(j.first_start):
            events.append((j.first_start, 0, j))  # a start is known to a read at the same instant
    events.sort(key=lambda e: (e[0], e[1]))
    cal, corrected = EtaCalibration(), 0
    for at, is_read, j in events:
        if not is_read:
            cal.record(j.trace.num_gpus, j.eta_predicted_wait_s, at - j.eta_read_at)
            continue
        expected = cal.corrected_start(at, j.trace.num_gpus, j.eta)
        assert by_id[j.trace.job_id].eta == pytest.approx(expected, abs=1e-6), j.trace.job_id
        corrected += expected != j.eta
    assert corrected > 50  # the calibration did change what was shown, once it had 30 outcomes


def test_the_fifo_profiles_show_the_roll_as_it_is() -> None:
    """Profile.eta_calibration is False for fifo and fifo-backfill: their start order is the
    submit order, and a fit of past waits moved their ETAs away (docs/simulator.md, Round 3):
    the replay shows the roll's own estimates, as with SimConfig(eta_calibration=False)."""
    from corral.sim.cluster import load_cluster
    from corral.sim.synth import SynthSpec, generate

    synth = load_cluster("synth")
    tr = generate(SynthSpec(jobs=400, load=1.3, seed=0), synth)
    for name in ("fifo", "fifo-backfill"):
        shown = Simulator(tr, synth, resolve_policy(name), config=SimConfig()).run()
        raw = Simulator(tr, synth, resolve_policy(name), config=SimConfig(eta_calibration=False)).run()
        etas = [j.eta for j in shown.jobs if not math.isnan(j.eta)]
        assert len(etas) > 100
        assert etas == [j.eta for j in raw.jobs if not math.isnan(j.eta)], name


def test_an_estimate_that_is_the_users_limit_is_marked_so_for_the_estimated_starts() -> None:
    """No history yet: a's estimate is its max_runtime (basis "limit"), marked as the limit it is
    (eta.remaining_s: past it a stop under way, not "now"); b, without a limit, gets no estimate
    (the profile's default applies); once a ran, c's estimate comes from history: no limit."""
    tr = trace(
        ("a", 0, 100, 4, {"max_runtime_s": 3600.0}),
        ("b", 1, 50, 4),
        ("c", 500, 50, 4, {"max_runtime_s": 3600.0}),
    )
    sim = Simulator(tr, cluster(1, 4), resolve_policy("fifo"), config=SimConfig(record_cycles=True))
    sim.run()
    seen = {
        j.id: j for rec in sim.records for j in (*rec.snapshot.queued, *(r.job for r in rec.snapshot.running))
    }
    a, b, c = seen["a"], seen["b"], seen["c"]
    assert (a.runtime_estimate, a.runtime_spread, a.runtime_is_limit) == (3600.0, None, True)
    assert (b.runtime_estimate, b.runtime_is_limit) == (None, False)
    assert c.runtime_estimate is not None and c.runtime_estimate < 3600.0 and not c.runtime_is_limit
