"""The simulator's figures hide no cost: every wait, unfinished jobs, quota refusals, estimates
without the trace's durations, and the per-event output. Right answers worked out by hand."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from corral.sim.cluster import parse_cluster
from corral.sim.metrics import summarize, write_jobs_csv
from corral.sim.replay import SimConfig

from .helpers import cluster, run, trace


def test_wait_after_a_preemption_counts_as_queueing() -> None:
    # One GPU, LAS. a runs 0-5,030 (preempted at 5,000 for b, 30 s grace), waits while b runs
    # 5,030-5,130, runs again from 5,130: a waited 100 s, b 30 s. Before the first start a waited 0.
    tr = trace(("a", 0, 10_000, 1), ("b", 5_000, 100, 1))
    result, jobs = run(tr, cluster(1, 1), "las", checkpoint_interval_s=1000.0)
    assert jobs["a"].waited_s == 100.0 and jobs["b"].waited_s == 30.0
    s = summarize(result)
    assert s["avg_queue_s"] == 65.0 and s["avg_first_queue_s"] == 15.0
    assert s["max_preemptions_per_job"] == 1


def test_checkpoint_on_preempt_keeps_all_work() -> None:
    tr = trace(("a", 0, 10_000, 1), ("b", 5_000, 100, 1))
    _, periodic = run(tr, cluster(1, 1), "las", checkpoint_interval_s=1800.0)
    _, saved = run(tr, cluster(1, 1), "las", checkpoint_interval_s=1800.0, checkpoint_on_preempt=True)
    assert periodic["a"].lost_work_s == 5_030.0 - 3_600.0  # back to its checkpoint at 3,600
    assert saved["a"].lost_work_s == 0.0 and saved["a"].end == 10_100.0  # 4,970 s left from 5,130


def test_job_over_its_group_quota_without_borrowing_is_rejected_at_submit() -> None:
    # Group g guarantees 2 GPUs and may not borrow: a 4-GPU job can never be admitted (the live
    # platform's submit rule), so it is rejected with the reason, not left "unfinished".
    groups = [{"name": "g", "guaranteed": 2, "borrowing": False}, {"name": "h", "guaranteed": 2}]
    tr = trace(("big", 0, 10, 4), ("ok", 0, 10, 2))
    result, jobs = run(tr, cluster(1, 4, groups), "default")
    assert set(jobs) == {"ok"}
    (rejected, why), *_ = result.rejected
    assert rejected.job_id == "big" and "borrowing is off" in why
    assert summarize(result)["jobs_unfinished"] == 0
    _, fifo = run(tr, cluster(1, 4, groups), "fifo")  # no quotas in the policy: it runs
    assert set(fifo) == {"big", "ok"}


def test_unfinished_jobs_are_censored_not_dropped() -> None:
    # A job still running when the replay ends counts in JCT up to then (censored), and in
    # jobs_censored, instead of being left out.
    tr = trace(("a", 0, 100, 1), ("b", 10, 1_000, 1))
    result, jobs = run(tr, cluster(1, 1), "fifo")
    jobs["b"].end = math.nan  # as if the replay had stopped before b finished
    s = summarize(result)
    assert s["jobs"] == 2 and s["jobs_censored"] == 1
    assert s["avg_jct_s"] == (100 + (result.end_time - 10)) / 2


def test_default_replay_uses_history_not_true_durations() -> None:
    # Same user, same job name: the second run's estimate is the first run's duration (300 s),
    # not its own (50 s); the first, with no history and no limit, has none.
    tr = trace(
        ("a", 0, 300, 1, {"name": "train", "user": "u"}),
        ("b", 400, 50, 1, {"name": "train", "user": "u"}),
        ("c", 401, 50, 1, {"name": "train", "user": "u", "max_runtime_s": 120.0}),
    )
    result, _ = run(tr, cluster(1, 1), "fifo", record_cycles=True)
    seen = {j.id: j.runtime_estimate for rec in result.records for j in rec.snapshot.queued}
    assert seen == {"a": None, "b": 300.0, "c": 120.0}
    oracle, _ = run(tr, cluster(1, 1), "fifo", record_cycles=True, oracle_runtime=True)
    seen = {j.id: j.runtime_estimate for rec in oracle.records for j in rec.snapshot.queued}
    assert seen == {"a": 300.0, "b": 50.0, "c": 50.0}
    assert SimConfig().oracle_runtime is False


def test_guarantee_held_and_worst_group_slowdown() -> None:
    # One node of 2 GPUs; g and h each guarantee 1. FIFO: g's 2-GPU job a holds both GPUs 0-100,
    # so h's b (1 GPU, submitted at 0) waits 100 s: h was owed 1 GPU for 100 s and got nothing
    # then (held 100 of 200 GPU-s owed over its life), g held all it was owed.
    groups = [{"name": "g", "guaranteed": 1}, {"name": "h", "guaranteed": 1}]
    tr = trace(("a", 0, 100, 2), ("b", 0.5, 100, 1, {"group": "h"}))
    result, _ = run(tr, cluster(1, 2, groups), "fifo")
    s = summarize(result)
    assert s["per_group"]["g"]["guarantee_held"] == 1.0
    assert s["per_group"]["h"]["guarantee_held"] == pytest.approx(100 / 199.5)
    assert s["worst_guarantee_group"] == "h"
    assert s["worst_slowdown_group"] == "h" and s["worst_group_slowdown"] == pytest.approx(199.5 / 100)


def test_jobs_out_lists_every_event(tmp_path: Path) -> None:
    tr = trace(("a", 0, 10_000, 1), ("b", 5_000, 100, 1), ("huge", 1, 10, 8))
    result, _ = run(tr, cluster(1, 1), "las", record_events=True)
    path = tmp_path / "jobs.csv"
    assert write_jobs_csv(result, path) == len(result.events)
    rows = list(csv.DictReader(path.open()))
    seq = [(r["job_id"], r["event"]) for r in rows]
    assert seq == [
        ("a", "submit"),
        ("a", "start"),
        ("huge", "reject"),
        ("b", "submit"),
        ("a", "preempt"),
        ("a", "stop"),
        ("b", "start"),
        ("b", "finish"),
        ("a", "start"),
        ("a", "finish"),
    ]
    assert rows[1]["nodes"] == "n-0000:0" and rows[1]["gpus"] == "1"
    assert "lost" in rows[5]["reason"]


def test_jobs_out_names_the_nodes_and_gpus_of_every_start_and_stop(tmp_path: Path) -> None:
    """Only start rows named the nodes and GPUs: a preempt row said 0 GPUs, and the stop and finish
    rows named no node, so the CSV could not say where a preempted or finished job had run."""
    tr = trace(("a", 0, 10_000, 1), ("b", 5_000, 100, 1), ("huge", 1, 10, 8))
    result, _ = run(tr, cluster(1, 1), "las", record_events=True)
    path = tmp_path / "jobs.csv"
    write_jobs_csv(result, path)
    rows = {(r["job_id"], r["event"]): r for r in csv.DictReader(path.open())}  # a's last start, finish
    for key in (("a", "preempt"), ("a", "stop"), ("b", "finish"), ("a", "finish")):
        assert (rows[key]["nodes"], rows[key]["gpus"]) == ("n-0000:0", "1"), key
    assert rows[("huge", "reject")]["gpus"] == "8"


def test_policy_knobs_from_the_cli(tmp_path: Path) -> None:
    # As in the preemption test: with LAS's first level at 10,000 GPU-s instead of 3,600, a (5,000
    # GPU-s attained at b's arrival) stays in b's queue, so nothing is preempted.
    from typer.testing import CliRunner

    from corral.cli.main import app
    from corral.sim.trace import write_generic_csv

    path, spec = tmp_path / "t.csv", tmp_path / "c.yaml"
    write_generic_csv(trace(("a", 0, 10_000, 1), ("b", 5_000, 100, 1)).jobs, path)
    spec.write_text("pools: [{name: n, count: 1, gpus_per_node: 1}]\ngroups: [{name: g, guaranteed: 1}]\n")
    args = ["sim", "--trace", str(path), "--cluster", str(spec), "--policy", "las", "-o", "json"]
    default = CliRunner().invoke(app, args)
    assert default.exit_code == 0, default.output
    assert json.loads(default.stdout)["preemptions"] == 1
    raised = CliRunner().invoke(app, [*args, "--knob", "las_thresholds=10000,36000"])
    assert raised.exit_code == 0, raised.output
    assert json.loads(raised.stdout)["preemptions"] == 0
    bad = CliRunner().invoke(app, [*args, "--knob", "nope=1"])
    assert bad.exit_code == 2 and "nope" in bad.output and "backfill_depth" in bad.output


def test_preemptions_per_job_are_bounded_by_the_profile() -> None:
    # One GPU, LAS: a is preempted at 5,000 for b (stops 5,030, keeps its 3,600 s checkpoint),
    # runs again from 5,130, and c arrives at 5,200. Unbounded, a is preempted a second time; with
    # max_preemptions=1 it is spared and c waits for its end (5,130 + 6,400 s left = 11,530).
    from corral.sim.runner import simulate

    tr = trace(("a", 0, 10_000, 1), ("b", 5_000, 100, 1), ("c", 5_200, 100, 1))
    free = {j.trace.job_id: j for j in simulate(tr, cluster(1, 1), "las").jobs}
    assert free["a"].preemptions == 2 and free["c"].first_start == 5_230.0
    bounded = simulate(tr, cluster(1, 1), "las", knobs={"max_preemptions": 1})
    jobs = {j.trace.job_id: j for j in bounded.jobs}
    assert jobs["a"].preemptions == 1 and jobs["a"].end == 11_530.0
    assert jobs["c"].first_start == 11_530.0
    assert summarize(bounded)["max_preemptions_per_job"] == 1


def test_trace_input_gpu_models_cpu_jobs_and_overcommitted_guarantees() -> None:
    # GPU model names match the cluster's case-insensitively (also inside "A|B" alternatives); a
    # CPU-only job on a cluster without CPU nodes is rejected with the true reason; guarantees
    # that add up to more than the cluster (12 on 8 GPUs) are accepted, as live, with a note.
    tr = trace(
        ("lower", 0, 100, 1, {"gpu_model": "v100"}),
        ("alts", 0, 100, 1, {"gpu_model": "h100|v100"}),
        ("cpu", 0, 100, 0),
        ("other", 0, 100, 1, {"gpu_model": "a100"}),
    )
    groups = [{"name": "g", "guaranteed": 6}, {"name": "h", "guaranteed": 6}]
    result, jobs = run(tr, cluster(2, 4, groups), "default")
    assert jobs["lower"].first_start == 0.0 and jobs["alts"].first_start == 0.0
    assert jobs["lower"].trace.gpu_model == "V100" and jobs["alts"].trace.gpu_model == "h100|V100"
    why = {tj.job_id: reason for tj, reason in result.rejected}
    assert set(why) == {"cpu", "other"}
    # the replay's remedy, not the live server's setting (CORRAL_CPU_JOBS_ON_GPU_NODES)
    assert "this cluster has no CPU nodes" in why["cpu"] and "CORRAL_" not in why["cpu"]
    assert "--knob cpu_jobs_on_gpu_nodes=1" in why["cpu"]
    assert "asks for GPU model a100; this cluster has V100" in why["other"]
    assert any("add up to 12; the cluster has 8" in n for n in result.notes)
    fitting, _ = run(tr, cluster(2, 4, [{"name": "g", "guaranteed": 8}]), "default")
    assert not any("add up to" in n for n in fitting.notes)


def test_a_guarantee_over_one_gpu_models_capacity_is_noted_as_live() -> None:
    """The live platform warns per GPU model too (services/quota.py overcommit_warnings); the
    replay noted only the all-model sum, so 12 A100 guaranteed on 8 A100 GPUs (16 GPUs in all),
    or a quota naming a model the cluster lacks (`a100` for `A100`: it holds nothing), passed
    without a word."""
    data = {
        "pools": [
            {"name": "a", "count": 1, "gpus_per_node": 8, "gpu_model": "A100"},
            {"name": "v", "count": 1, "gpus_per_node": 8, "gpu_model": "V100"},
        ],
        "groups": [{"name": "g", "guaranteed": {"A100": 12}}, {"name": "h", "guaranteed": {"a100": 2}}],
    }
    result, _ = run(trace(("j", 0, 10, 1)), parse_cluster(data, "two.yaml"), "default")
    notes = " | ".join(result.notes)
    assert "guaranteed A100 GPUs of all groups add up to 12; the cluster has 8" in notes
    assert "guaranteed a100 GPUs of all groups add up to 2; the cluster has 0" in notes
    # the right case suggested (a trace's `a100` is matched; a quota's is not, as live)
    accepted = "(accepted, as the live platform accepts it)"
    assert f"{accepted}; a quota names GPU models as the pools spell them: A100?" in notes
    assert f"A100 GPUs of all groups add up to 12; the cluster has 8 {accepted} |" in notes + " |"
    assert not any("GPUs of all groups add up to 14" in n for n in result.notes)  # 14 <= 16 in all
