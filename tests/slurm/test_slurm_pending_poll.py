"""Less of the server's own work per Slurm job (docs/slurm.md, ninth round). While Slurm holds every
live attempt's job pending, a poll does not ask squeue again (for up to PENDING_RECHECK_S) unless
a job shows it started (slurmstepd made its output file) or a stop was asked for; and launches
walk the state dir's parents (are they passable by the job accounts?) once a minute, not per job."""

from __future__ import annotations

import os
import time

import pytest

from corral.engine.base import AttemptPhase, AttemptStatus
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.engine import PENDING_RECHECK_S
from corral.engine.slurm.scripts import BATCH_OUTPUT
from corral.engine.slurm.state import AttemptRecord, StateStore
from corral.scheduler.types import NodeState
from tests.slurm.helpers import FINISHED, HeldClock, attempt, instance, wait_for

pytestmark = pytest.mark.slurm


def polls_pending(engine: SlurmEngine, aid: str, times: int) -> None:
    for _ in range(times):
        status = engine.poll([aid])[aid]
        assert status.phase is AttemptPhase.PENDING, status


def test_polls_while_every_job_pends_ask_squeue_again_only_when_one_starts(
    engine: SlurmEngine, squeue_calls: list[tuple[str, ...]], drained_node3: str, clock: HeldClock
) -> None:
    """Five polls in a row of a pending job: one squeue (before: five). Its batch output appearing
    (the job started) makes the next poll ask again; so does PENDING_RECHECK_S passing. Resumed,
    the job runs and is seen to end."""
    ref = engine.launch(attempt("140.1", instance(drained_node3, "echo ran")))
    squeue_calls.clear()
    polls_pending(engine, "140.1", 5)
    assert len(squeue_calls) == 1, squeue_calls
    # as slurmstepd does when the job starts on its node: the next poll asks squeue
    marker = engine.store.job_file("140.1", BATCH_OUTPUT.format(job_id=ref))
    with open(marker, "w"):
        pass
    polls_pending(engine, "140.1", 1)  # still pending in truth: the marker was ours
    assert len(squeue_calls) == 2
    os.remove(marker)
    polls_pending(engine, "140.1", 2)
    assert len(squeue_calls) == 2
    clock.now += PENDING_RECHECK_S  # a job may end without starting (cancelled, launch failed)
    polls_pending(engine, "140.1", 1)
    assert len(squeue_calls) == 3
    engine.set_node_state(drained_node3, NodeState.READY)
    status = wait_for(engine, "140.1", FINISHED, timeout_s=30, every_s=0.05)
    assert status.phase is AttemptPhase.SUCCEEDED, status
    assert engine.logs("140.1", 0).data.decode().strip() == "ran"


def test_a_stop_of_a_pending_job_is_asked_about_at_the_next_poll(
    engine: SlurmEngine, squeue_calls: list[tuple[str, ...]], drained_node3: str
) -> None:
    engine.launch(attempt("141.1", instance(drained_node3, "echo never")))
    polls_pending(engine, "141.1", 2)
    asked = len(squeue_calls)
    engine.stop("141.1", 5.0)
    status = engine.poll(["141.1"])["141.1"]
    assert len(squeue_calls) > asked  # not the remembered PENDING: squeue says it was cancelled
    if status.phase not in FINISHED:  # scancel is asynchronous in slurmctld
        status = wait_for(engine, "141.1", FINISHED, timeout_s=10, every_s=0.05)
    assert status.phase is not AttemptPhase.SUCCEEDED, status


def test_launches_walk_the_state_dirs_parents_once_a_minute(
    engine: SlurmEngine, monkeypatch: pytest.MonkeyPatch, drained_node3: str
) -> None:
    """Each launch checks that the job accounts can pass every parent of the state dir (a stat per
    parent): found passable, not again for PASSABLE_CACHE_S (before: at every launch)."""
    walks: list[str] = []
    real = StateStore.unreachable_parent

    def counted(self: StateStore) -> object:
        walks.append(str(self.root))
        return real(self)

    monkeypatch.setattr(StateStore, "unreachable_parent", counted)
    for n in range(3):
        engine.launch(attempt(f"{150 + n}.1", instance(drained_node3, "true")))
    assert len(walks) == 1, walks
    engine._passable_until.clear()  # as if a minute had passed
    engine.launch(attempt("153.1", instance(drained_node3, "true")))
    assert len(walks) == 2, walks


def test_launches_are_remembered_as_pending_only_while_a_poll_is_fresh(
    engine: SlurmEngine, squeue_calls: list[tuple[str, ...]], drained_node3: str, clock: HeldClock
) -> None:
    """A server that launches but does not poll (another server holds the reconcile lease) keeps
    nothing per launched job; right after a poll found every job pending, a new launch joins that
    memory and the next poll still needs no squeue."""
    for n in range(3):
        engine.launch(attempt(f"{160 + n}.1", instance(drained_node3, "true")))
    assert engine._pending == {}  # before: one entry per launch, never dropped without a poll
    live = [f"{160 + n}.1" for n in range(3)]
    assert {s.phase for s in engine.poll(live).values()} == {AttemptPhase.PENDING}
    asked = len(squeue_calls)
    engine.launch(attempt("163.1", instance(drained_node3, "true")))
    statuses = engine.poll([*live, "163.1"])
    assert {s.phase for s in statuses.values()} == {AttemptPhase.PENDING}
    assert len(squeue_calls) == asked


def test_an_older_squeue_answer_ending_last_is_not_remembered(engine: SlurmEngine) -> None:
    """`corral exec` polls from an API thread beside the reconcile loop: a squeue asked earlier
    (every job pending) that returns after a later one (a job running) must not bring back the
    "all pending" memory, or polls would answer PENDING for a running job."""
    record = AttemptRecord("170.1", slurm_job_id="9170")
    pending = {"170.1": AttemptStatus("170.1", AttemptPhase.PENDING)}
    running = {"170.1": AttemptStatus("170.1", AttemptPhase.RUNNING)}
    now = time.monotonic()
    engine._note_pending([record], running, asked_at=now)
    engine._note_pending([record], pending, asked_at=now - 0.01)
    assert engine._still_pending([record]) is None  # squeue is asked
    engine._note_pending([record], pending, asked_at=now + 0.01)
    assert engine._still_pending([record]) == pending
