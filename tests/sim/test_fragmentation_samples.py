"""The fragmentation samples read the waiting jobs per shape (`Simulator.queued_shapes`, kept in
step with the queue as jobs arrive, start and are preempted back into it) and give what one pass
over every waiting job gives."""

from __future__ import annotations

import pytest

from corral.sim.replay import Simulator

from .test_replay_memo import busy_trace, cluster, run


def need_from_every_waiting_job(sim: Simulator) -> dict[tuple[frozenset[str] | None, int], int]:
    counts: dict[tuple[frozenset[str] | None, int], int] = {}
    for job in sim.queued.values():
        res = job.tasks[0].resources
        if res.gpus:
            key = (res.gpu_models, res.gpus)
            counts[key] = counts.get(key, 0) + 1
    return counts


@pytest.mark.pure_scheduler  # it spies on Simulator._sample_fragmentation (conftest.py)
def test_samples_read_the_kept_shapes_of_the_waiting_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Simulator._sample_fragmentation
    checked = 0

    def spy(self: Simulator, now: float) -> None:
        nonlocal checked
        assert self.queued_shapes == need_from_every_waiting_job(self)
        checked += 1
        original(self, now)

    monkeypatch.setattr(Simulator, "_sample_fragmentation", spy)
    groups = [{"name": "a", "guaranteed": 16, "max": 32}, {"name": "b", "guaranteed": 8}, {"name": "c"}]
    result, _ = run(busy_trace(seed=3, jobs=150), cluster(4, 8, groups), "default")
    assert checked > 100 and result.preemptions > 0  # samples taken; jobs went back to the queue
