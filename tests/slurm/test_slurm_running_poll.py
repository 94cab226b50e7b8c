"""No squeue at every poll while jobs run (docs/slurm.md, 2026-11-29 round). After a squeue that
found every live attempt pending or running, polls answer from memory for up to RUNNING_RECHECK_S
unless a running job's instance wrote its exit file, a pending one shows it started, or a stop was
asked for. Before, squeue was asked at every poll (25 a second) while any job ran."""

from __future__ import annotations

import os
import time

import pytest

from corral.engine.base import AttemptPhase
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.engine import RUNNING_RECHECK_S
from tests.slurm.helpers import FINISHED, HeldClock, attempt, instance, wait_for

pytestmark = pytest.mark.slurm


def polls(engine: SlurmEngine, ids: list[str], times: int) -> dict[str, AttemptPhase]:
    phases: dict[str, AttemptPhase] = {}
    for _ in range(times):
        phases = {aid: s.phase for aid, s in engine.poll(ids).items()}
    return phases


def test_polls_while_a_job_runs_ask_squeue_again_only_when_an_instance_ends(
    engine: SlurmEngine,
    squeue_calls: list[tuple[str, ...]],
    drained_node3: str,
    clock: HeldClock,
) -> None:
    """A running job beside a pending one: five polls ask squeue none (before: five). A rank's exit
    file appearing makes the next poll ask; so does RUNNING_RECHECK_S passing; the job's own end is
    seen, and a stop asked for is asked about at the next poll."""
    engine.launch(attempt("180.1", instance("node1", "sleep 60")))
    engine.launch(attempt("181.1", instance(drained_node3, "echo never")))
    ids = ["180.1", "181.1"]
    status = wait_for(engine, "180.1", {AttemptPhase.RUNNING, *FINISHED}, timeout_s=30, every_s=0.05)
    assert status.phase is AttemptPhase.RUNNING, status
    polls(engine, ids, 1)  # a squeue that sees both (wait_for polled 180.1 alone)
    squeue_calls.clear()
    assert polls(engine, ids, 5) == {"180.1": AttemptPhase.RUNNING, "181.1": AttemptPhase.PENDING}
    assert squeue_calls == []
    marker = engine.store.job_file("180.1", "rank-0.exit")  # as the rank script writes at its end
    with open(marker, "w") as f:
        f.write("0\n")
    assert polls(engine, ids, 1)["180.1"] is AttemptPhase.RUNNING  # still running in truth
    assert len(squeue_calls) == 1
    os.remove(marker)
    polls(engine, ids, 2)
    assert len(squeue_calls) == 1
    clock.now += RUNNING_RECHECK_S  # an end that writes no exit file (scancel by an admin, a lost node)
    polls(engine, ids, 1)
    assert len(squeue_calls) == 2
    engine.stop("180.1", 0.0)
    polls(engine, ids, 1)
    assert len(squeue_calls) == 3  # the stop: asked at once
    status = wait_for(engine, "180.1", FINISHED, timeout_s=30, every_s=0.05)
    assert status.phase is not AttemptPhase.SUCCEEDED, status


def test_a_running_job_that_ends_is_seen_at_the_next_poll(
    engine: SlurmEngine,
    squeue_calls: list[tuple[str, ...]],
    drained_node3: str,
    clock: HeldClock,
) -> None:
    """With the clock held (no recheck by age), a job's own end is still seen: its exit file makes
    the polls ask squeue until Slurm says it ended."""
    engine.launch(attempt("182.1", instance("node1", "sleep 1; echo done")))
    engine.launch(attempt("183.1", instance(drained_node3, "echo never")))
    ids = ["182.1", "183.1"]
    wait_for(engine, "182.1", {AttemptPhase.RUNNING, *FINISHED}, timeout_s=30, every_s=0.05)
    for _ in range(600):
        statuses = engine.poll(ids)
        if statuses["182.1"].phase in FINISHED:
            break
        time.sleep(0.05)
    assert statuses["182.1"].phase is AttemptPhase.SUCCEEDED, statuses["182.1"]
    assert engine.logs("182.1", 0).data.decode().strip() == "done"
