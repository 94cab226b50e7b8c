"""Where an attempt ends: the exit-spec's verdict is computed, recorded and turned into the retry
rule the lifecycle applies (`services.lifecycle.settle_failure(rule=...)`).

`Diagnoser.verdict` runs inside the reconcile loop's transaction with the log tail read before it
(engine I/O stays outside the transaction); `record` writes the `AttemptDiagnosis` row, a job
event, the retry's node/GPU exclusions and backoff (`JobAvoid`), and counts the failure for
`corral_job_failures_total{reason,node}` once the transaction commits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from corral.db.diag_models import AttemptDiagnosis, AttemptFault, JobAvoid
from corral.db.models import Attempt, Job
from corral.diagnosis.exitspec import Category, ExitSpec, Facts, RetryPolicy, Verdict
from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason
from corral.monitor.metrics import JOB_FAILURES_TOTAL
from corral.services.lifecycle import RetryRule, record_event
from corral.services.nodes import ready_node_outside

_PENDING_COUNTS = "diag_failure_counts"


@dataclass
class Diagnoser:
    """The active exit-spec and the log tails read for this batch ({attempt_id: text})."""

    spec: ExitSpec
    tails: dict[str, str] = field(default_factory=dict)

    def verdict(self, session: Session, attempt: Attempt, status: AttemptStatus) -> Verdict | None:
        """None for an attempt that succeeded (nothing to explain)."""
        if status.phase is AttemptPhase.SUCCEEDED:
            return None
        fault = self.fault(session, attempt)
        return self.spec.classify(facts_of(status, fault, self.tails.get(status.attempt_id, "")))

    @staticmethod
    def fault(session: Session, attempt: Attempt) -> AttemptFault | None:
        return session.get(AttemptFault, attempt.id)


def facts_of(status: AttemptStatus, fault: AttemptFault | None, tail: str) -> Facts:
    events: set[str] = set()
    # The end of an attempt Corral stopped for a recorded fault (a hang, an OOM, a GPU fault), read
    # (stopped) or not (status_unreadable), is that fault's end: the fault is why it was stopped,
    # and it alone decides (no line of the log: a rule it matches could make the fault the job's).
    fault_stop = fault is not None and status.reason in (
        FailureReason.STOPPED,
        FailureReason.STATUS_UNREADABLE,
    )
    if fault_stop:
        tail = ""
    unread_fault = fault_stop and status.reason is FailureReason.STATUS_UNREADABLE
    if status.reason is not None and not unread_fault:
        events.add(status.reason.value)
    elif status.phase is AttemptPhase.LOST:
        events.add("lost")
    if fault is not None:
        events.add(fault.event)
    signal = None
    if status.reason is FailureReason.SIGNAL and status.exit_code is not None and status.exit_code > 128:
        signal = status.exit_code - 128
    if status.reason is FailureReason.LAUNCH_FAILED and status.message:
        # Nothing ran, so the log says nothing: the engine's refusal is the text to read, first
        # (`^storage: `), as the dispatch loop reads an engine's raised one (dispatch._record_launch).
        tail = f"{status.message}\n{tail}" if tail else status.message
    return Facts(frozenset(events), status.exit_code, signal, tail)


def retry_rule(verdict: Verdict, fault: AttemptFault | None = None) -> RetryRule:
    cap = verdict.retry.cap
    if fault is not None and fault.event == "hang" and fault.detail.startswith("kill"):
        cap = 0  # on_hang: kill ends the job; requeue lets the exit-spec's policy retry it
    return RetryRule(own_fault=verdict.category.own_fault, cap=cap, label=verdict.reason)


def platform_loss_cap(spec: ExitSpec, latest: Mapping[str, Any] | None, budget: int) -> int:
    """What the next platform loss of the job is counted against, as settle_failure would count
    one like its latest ending: a failure the exit-spec put in a platform, hardware or transient
    category with a retry cap of its own (launch_failed: 2) is held to the lower of that cap and
    the budget; anything else (a lost attempt, whose loss uses the budget alone) to the budget.
    `latest`: the latest ended attempt as the job view shows it (its state and failure)."""
    failure = (latest or {}).get("failure")
    if latest is None or latest.get("state") != "failed" or not failure:
        return budget
    category, rule = failure.get("category"), spec.by_reason(str(failure.get("reason")))
    if category in (None, Category.USER.value, Category.PREEMPTED.value) or rule is None:
        return budget
    cap = rule.retry.cap
    return budget if cap is None else min(cap, budget)


def failing_node(attempt: Attempt, rank: int) -> str:
    placement = attempt.placement or ()
    for p in placement:
        if p.rank == rank:
            return p.node
    return placement[0].node if placement else ""


def record(
    session: Session, job: Job, attempt: Attempt, verdict: Verdict, node: str, now: float, retried: bool
) -> None:
    """Store the verdict and what the retry must avoid (the caller's transaction)."""
    session.add(
        AttemptDiagnosis(
            attempt_pk=attempt.id, job_id=job.id, reason=verdict.reason, category=verdict.category.value,
            message=verdict.message, fix=verdict.fix, evidence=verdict.evidence, node=node,
            user_name=job.user.name, at=now,
        )
    )  # fmt: skip
    text = f"attempt {attempt.number}: {verdict.reason} ({verdict.category.value}): {verdict.message}"
    record_event(session, job.id, now, f"{text} Fix: {verdict.fix}", kind="diagnosis")
    if retried:
        _avoid_for_retry(session, job, attempt, verdict, node, now)
    session.info.setdefault(_PENDING_COUNTS, []).append((verdict.reason, node))


def _avoid_for_retry(
    session: Session, job: Job, attempt: Attempt, verdict: Verdict, node: str, now: float
) -> None:
    """A hardware failure's retry avoids the faulty GPU (or the node, when no GPU is known);
    a backoff delays the next try."""
    fault = session.get(AttemptFault, attempt.id)
    backoff = _backoff(verdict.retry, job)
    if verdict.category is not Category.HARDWARE and backoff <= 0:
        return
    avoid = session.get(JobAvoid, job.id)
    if avoid is None:
        avoid = JobAvoid(job_id=job.id, nodes=[], gpus=[], not_before=None)
        session.add(avoid)
    if verdict.category is Category.HARDWARE:
        if fault is not None and fault.gpu_index is not None:
            pair = [fault.node, fault.gpu_index]
            if pair not in avoid.gpus:
                avoid.gpus = [*avoid.gpus, pair]
        elif node and node not in avoid.nodes and ready_node_outside(session, [*avoid.nodes, node]):
            avoid.nodes = [*avoid.nodes, node]
    avoid.not_before = now + backoff if backoff > 0 else None


def _backoff(policy: RetryPolicy, job: Job) -> float:
    return policy.backoff(max(1, job.own_failures + job.platform_losses))


@event.listens_for(Session, "after_commit")
def _count_failures(session: Session) -> None:
    for reason, node in session.info.pop(_PENDING_COUNTS, ()):
        JOB_FAILURES_TOTAL.labels(reason=reason, node=node).inc()


@event.listens_for(Session, "after_rollback")
def _forget_failures(session: Session) -> None:
    session.info.pop(_PENDING_COUNTS, None)
