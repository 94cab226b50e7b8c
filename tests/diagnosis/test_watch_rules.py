"""The hang suspect and the straggler report, from per-rank log progress and GPU utilisation."""

from __future__ import annotations

from corral.db.diag_models import AttemptFault
from corral.db.models import Attempt
from corral.diagnosis.exitspec import Category, Facts, load_exit_spec
from corral.diagnosis.record import retry_rule
from corral.diagnosis.watch import straggler_report, suspect_of
from corral.domain import InstancePlacement
from corral.services.lifecycle import RetryRule


def attempt(ranks: int) -> Attempt:
    placement = tuple(
        InstancePlacement("worker", r, r, f"node-{r}", (0,), (f"GPU-{r}",), 1.0, 1024) for r in range(ranks)
    )
    return Attempt(number=1, state="running", placement=placement)


def test_the_suspect_is_the_rank_whose_log_stopped_first() -> None:
    # [bytes, last time the log grew, bytes when first seen]
    progress = {0: [900.0, 100.0, 0.0], 1: [400.0, 40.0, 0.0], 2: [880.0, 99.5, 0.0]}
    text = suspect_of(attempt(3), progress, {0: 0.0, 1: 0.0, 2: 0.0}, now=200.0)
    assert text.startswith("rank 1 on node-1: its log stopped first (60 s before the next)")
    assert "no log output for 100 s" in text


def test_when_logs_stopped_together_the_rank_whose_gpu_differs_is_named() -> None:
    progress = {r: [100.0, 50.0, 0.0] for r in range(3)}
    text = suspect_of(attempt(3), progress, {0: 0.0, 1: 4.0, 2: 0.0}, now=100.0)
    assert text.startswith("rank 1 on node-1: its GPU use differs")


def test_a_rank_much_slower_than_its_peers_is_a_straggler() -> None:
    progress = {0: [50_000.0, 10.0, 0.0], 1: [2_000.0, 10.0, 0.0], 2: [48_000.0, 10.0, 0.0]}
    report = straggler_report(attempt(3), progress, {0: 95.0, 1: 90.0, 2: 97.0}, ratio=0.25)
    assert report == "rank 1 on node-1: log grew 2.0 KiB, peers 47.9 KiB"
    by_gpu = straggler_report(
        attempt(3), {r: [10.0, 1.0, 0.0] for r in range(3)}, {0: 90, 1: 92, 2: 10}, 0.25
    )
    assert by_gpu == "rank 2 on node-2: GPU 10 %, peers 91 %"
    assert straggler_report(attempt(2), {0: [10.0, 1.0, 0.0], 1: [12.0, 1.0, 0.0]}, {}, 0.25) == ""


def test_on_hang_kill_is_never_retried_and_requeue_follows_the_exit_spec() -> None:
    verdict = load_exit_spec().classify(Facts(frozenset({"stopped", "hang"})))
    assert (verdict.reason, verdict.category) == ("hang_killed", Category.TRANSIENT)
    kill = AttemptFault(attempt_pk=1, event="hang", node="", detail="kill: rank 1 on n", at=0.0)
    requeue = AttemptFault(attempt_pk=1, event="hang", node="", detail="requeue: rank 1 on n", at=0.0)
    assert retry_rule(verdict, kill) == RetryRule(own_fault=False, cap=0, label="hang_killed")
    assert retry_rule(verdict, requeue) == RetryRule(own_fault=False, cap=1, label="hang_killed")
