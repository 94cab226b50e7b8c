from __future__ import annotations

import pytest

from corral.sim.metrics import jain_index, summarize

from .helpers import cluster, run, trace


def test_jain_index_bounds() -> None:
    assert jain_index([2.0, 2.0, 2.0]) == pytest.approx(1.0)
    assert jain_index([1.0, 0.0]) == pytest.approx(0.5)


def test_summary_of_a_hand_run() -> None:
    # a: 4 GPUs 0-100; b: 2 GPUs, arrives 10, waits for a, runs 100-200 (group h).
    # GPU-seconds 400 + 200 over 4 GPUs x 200 s makespan = 0.75. Queue: a 0, b 90.
    # Run share (duration / JCT): g = 1.0, h = 100 / 190; Jain over the two groups.
    tr = trace(("a", 0, 100, 4), ("b", 10, 100, 2, {"group": "h"}))
    groups = [{"name": "g", "guaranteed": 2}, {"name": "h", "guaranteed": 2}]
    result, _ = run(tr, cluster(1, 4, groups), "fifo")
    s = summarize(result)
    assert (s["jobs"], s["makespan_s"], s["avg_queue_s"]) == (2, 200.0, 45.0)
    assert s["gpu_alloc_rate"] == pytest.approx(0.75)
    assert s["avg_jct_s"] == pytest.approx((100 + 190) / 2)
    assert s["jain_fairness"] == pytest.approx(jain_index([1.0, 100 / 190]))
    assert s["per_group"]["h"]["avg_queue_s"] == 90.0


def test_private_baseline_replays_each_group_on_its_quota() -> None:
    # g's quota is 4 GPUs = one node: alone there, b waits for a (queue 0 and 99 -> 49.5);
    # group h has no quota, so it has no private cluster to compare with.
    from corral.sim.runner import private_baseline

    tr = trace(("a", 0, 100, 4), ("b", 1, 10, 4), ("c", 2, 10, 1, {"group": "h"}))
    groups = [{"name": "g", "guaranteed": 4}, {"name": "h", "guaranteed": 0}]
    base = private_baseline(tr, cluster(2, 4, groups), "fifo")
    assert base["g"] == {"private_gpus": 4, "private_avg_queue_s": 49.5, "private_rejected": 0}
    assert base["h"]["private_gpus"] == 0 and base["h"]["private_avg_queue_s"] is None
