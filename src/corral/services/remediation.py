"""Remediation: the active rules (corral.services.remediation_rules) applied to every alert change
and platform event, in the transaction that records it.

Callers: `corral.monitor.alerts.record_alert` (Alertmanager's webhook and Corral's own health
checks, on each change of status) and the diagnosis watch (the `GpuFault` event). A matching
rule's actions run in order, `incident` first so that the others land on its timeline; each run
is a `RemediationRun` row, an audit record and a timeline line. Dry-run rules only record what
they would do. A rule over its `rate_limit`, or a removal (cordon, drain, quarantine) past the
blast-radius guard, is not carried out: an incident for a human is opened or raised instead.

Node, GPU and job state changes go through corral.services.lifecycle and corral.services.nodes.
Attempts to stop are queued on the session (`take_stops`) for the caller to send to the engine
after its commit; the incidents loop sends any left over.
"""

from __future__ import annotations

import logging
import string
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.db.diag_models import AttemptFault
from corral.db.incident_models import Incident, RemediationRun, RuleSetVersion
from corral.db.models import Attempt, GpuClaim, Job, Node
from corral.db.models import Gpu as GpuRow
from corral.domain import span_text
from corral.services import audit
from corral.services import incidents as inc
from corral.services import nodes as node_svc
from corral.services.errors import Conflict, NotFound
from corral.services.lifecycle import (
    AttemptState,
    GpuHealth,
    JobState,
    move_attempt,
    move_gpu,
    record_event,
    request_cancel,
    transition,
)
from corral.services.remediation_rules import DEFAULT_RULES, REMOVING, Action, Rule, RuleSet, parse_rules
from corral.words import plural

log = logging.getLogger("corral.services.remediation")
ACTOR = "system:remediation"
STOPS_KEY = "corral.remediation.stops"
LIVE_ATTEMPTS = (AttemptState.STARTING.value, AttemptState.RUNNING.value)


@dataclass(frozen=True)
class Signal:
    """An alert change or a platform event, as the rules see it."""

    name: str
    labels: Mapping[str, str]
    status: str = "firing"  # firing | resolved (events are always firing)
    source: str = "event"  # alertmanager | corral | event
    fingerprint: str = ""  # the alert's ('' for an event)
    summary: str = ""

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")


@dataclass
class _Run:
    rule: Rule
    signal: Signal
    dry_run: bool
    results: list[dict[str, Any]] = field(default_factory=list)
    incident: Incident | None = None
    removed_nodes: int = 0
    removed_gpus: int = 0
    outcome: str = "ran"
    message: str = ""  # the action being carried out's `message` (notify_owner)
    held: tuple[Incident, str] | None = None  # the incident an earlier rule opened for this signal


# -- the active rules ----------------------------------------------------------------------------

_CACHE: dict[str, RuleSet] = {}  # parsed rules by their text (several databases in one process)


def active_version(session: Session) -> int:
    return int(session.scalar(select(func.max(RuleSetVersion.version))) or 0)


def active_rules(session: Session) -> tuple[int, RuleSet]:
    """(version, rules); version 0 is the shipped defaults."""
    version, text = active_text(session)
    rules = _CACHE.get(text)
    if rules is None:
        rules = _CACHE[text] = parse_rules(text)
    return version, rules


def active_text(session: Session) -> tuple[int, str]:
    row = session.execute(
        select(RuleSetVersion.version, RuleSetVersion.text).order_by(RuleSetVersion.version.desc()).limit(1)
    ).first()
    return (0, DEFAULT_RULES) if row is None else (int(row[0]), str(row[1]))


def apply_rules(session: Session, text: str, author: str, now: float) -> int:
    """Store `text` as the next version (parse_rules raises first: a bad file changes nothing)."""
    parse_rules(text)
    version = active_version(session) + 1
    try:
        with session.begin_nested():
            session.add(RuleSetVersion(version=version, text=text, author=author, created_at=now))
    except IntegrityError as exc:
        # another admin applied this version number at the same moment (both read the same last one):
        # refuse rather than 500, since this file was written without seeing theirs
        raise Conflict(
            f"rules version {version} was applied by someone else at the same moment; "
            "read it (corral rules show) and apply yours again"
        ) from exc
    return version


def history(session: Session) -> list[RuleSetVersion]:
    return list(session.scalars(select(RuleSetVersion).order_by(RuleSetVersion.version.desc())))


def version_text(session: Session, version: int) -> str:
    if version == 0:
        return DEFAULT_RULES
    row = session.get(RuleSetVersion, version)
    if row is None:
        raise NotFound(f"no rules version {version}")
    return row.text


# -- matching and running ------------------------------------------------------------------------


def matches(rule: Rule, signal: Signal) -> bool:
    m = rule.match
    return (
        (not m.name or signal.name in m.name)
        and (not m.severity or signal.severity in m.severity)
        and (not m.source or signal.source in m.source)
        and all(signal.labels.get(k) == v for k, v in m.labels.items())
    )


def on_signal(session: Session, signal: Signal, now: float) -> list[RemediationRun]:
    """Run every rule that matches a firing signal; a resolved alert may resolve its incidents.
    The first rule whose incident action opens or joins an incident holds the signal's incident:
    the incident actions of later matching rules join that one (one alert is one fault)."""
    if signal.status == "resolved":
        if signal.fingerprint:
            inc.alert_resolved(session, signal.fingerprint, now, f"{signal.name} resolved")
        return []
    version, ruleset = active_rules(session)
    runs = []
    held: tuple[Incident, str] | None = None  # (incident, rule): one alert or event is one fault
    for rule in ruleset.rules:
        if matches(rule, signal):
            run = _run_rule(session, ruleset, version, rule, signal, now, held)
            runs.append(run)
            if held is None and run.incident_id is not None and not run.dry_run:
                held = (session.get_one(Incident, run.incident_id), rule.name)
    return runs


def _run_rule(
    session: Session,
    ruleset: RuleSet,
    version: int,
    rule: Rule,
    signal: Signal,
    now: float,
    held: tuple[Incident, str] | None = None,
) -> RemediationRun:
    run = _Run(rule, signal, dry_run=ruleset.dry_run or rule.dry_run, held=held)
    limited = rule.rate_limit is not None and _runs_within(session, rule.name, now - rule.rate_limit.per) >= (
        rule.rate_limit.max
    )
    ordered = sorted(rule.actions, key=lambda a: a.kind != "incident")
    for action in ordered:
        if action.kind == "incident":
            _incident(session, ruleset, run, action, now)
        elif limited:
            run.outcome = "rate_limited"
            run.results.append({"action": action.kind, "result": "skipped: the rule is over its rate limit"})
        else:
            _act(session, ruleset, run, action, now)
    if limited:
        why = f"rule {rule.name} is over its rate limit"
        if run.dry_run:  # a dry run opens no incident, the guard's neither (its earlier runs count)
            result = f"would open or join SEV2 incident guard/{rule.name}: {why}"
            run.results.append({"action": "escalate", "result": result})
        else:
            _page_a_human(session, ruleset, run, why, now)
    row = RemediationRun(
        rule=rule.name, rules_version=version, signal=signal.name, at=now, dry_run=run.dry_run,
        outcome="dry_run" if run.dry_run and run.outcome == "ran" else run.outcome, actions=run.results,
        removed_nodes=run.removed_nodes, removed_gpus=run.removed_gpus,
        incident_id=run.incident.id if run.incident else None,
    )  # fmt: skip
    session.add(row)
    summary = "; ".join(f"{r['action']}: {r['result']}" for r in run.results)
    if run.incident is not None:
        prefix = "dry run, would have done" if run.dry_run else "remedy"
        text = f"{prefix} {rule.name} (rules v{version}): {summary}"
        data = {"rule": rule.name, "actions": run.results, "outcome": row.outcome}
        inc.add_timeline(session, run.incident.id, "remedy", text, data, now=now)
    audit.record(
        session, actor=ACTOR, action="remediation.run", target_kind="rule", target_id=rule.name,
        after={"signal": signal.name, "labels": dict(signal.labels), "outcome": row.outcome,
               "actions": run.results, "rules_version": version},
        now=now,
    )  # fmt: skip
    return row


def _runs_within(session: Session, rule: str, since: float) -> int:
    stmt = select(func.count()).where(
        RemediationRun.rule == rule,
        RemediationRun.at >= since,
        RemediationRun.outcome.in_(("ran", "guarded")),
    )
    return int(session.scalar(stmt) or 0)


class _Labels(dict[str, str]):
    def __missing__(self, key: str) -> str:
        return "?"


def render(template: str, signal: Signal) -> str:
    values = _Labels({**signal.labels, "name": signal.name, "summary": signal.summary or signal.name})
    try:
        return string.Formatter().vformat(template, (), values)
    except (ValueError, IndexError, AttributeError, KeyError):
        return template  # a template the labels cannot fill stays as written


def _links(signal: Signal) -> dict[str, list[str]]:
    labels = signal.labels
    links: dict[str, list[str]] = defaultdict(list)
    if labels.get("node"):
        links["nodes"].append(labels["node"])
        if labels.get("gpu"):
            links["gpus"].append(f"{labels['node']}/{labels['gpu']}")
    if labels.get("job_id"):
        links["jobs"].append(labels["job_id"])
    if labels.get("group"):
        links["groups"].append(labels["group"])
    return dict(links)


def _incident(session: Session, ruleset: RuleSet, run: _Run, action: Action, now: float) -> None:
    signal = run.signal
    severity = action.severity or ruleset.severity_for(dict(signal.labels))
    key = render(action.key, signal) if action.key else f"{signal.name}/{signal.fingerprint or signal.name}"
    title = render(action.title, signal) if action.title else (signal.summary or signal.name)
    if run.dry_run:
        run.results.append({"action": "incident", "result": f"would open or join {severity} incident {key}"})
        return
    if run.held is not None:  # a second incident for the same alert would page twice for one fault
        run.incident, by = run.held
        # ... but the fault is as severe as the most severe rule it matches says
        inc.raise_severity(
            session, run.incident, severity, f"rule {run.rule.name}: {signal.summary or signal.name}", now
        )
        result = f"incident {run.incident.id} ({run.incident.severity}), opened for this alert by rule {by}"
        run.results.append({"action": "incident", "result": result})
        return
    run.incident = inc.open_or_update(
        session, fingerprint=key, title=title, severity=severity, source=f"rule:{run.rule.name}",
        labels=dict(signal.labels), links=_links(signal), now=now, alert=signal.fingerprint,
        why=signal.summary or signal.name, flap=ruleset.incidents.flap_policy(),
    )  # fmt: skip
    run.results.append(
        {"action": "incident", "result": f"incident {run.incident.id} ({run.incident.severity})"}
    )


def _page_a_human(
    session: Session, ruleset: RuleSet, run: _Run, why: str, now: float, *, detail: str = ""
) -> None:
    """A guard stopped an automatic action: a human decides (an incident, raised to SEV2).
    `why` is the incident's title; `detail`, when given, what its timeline says instead."""
    labels = dict(run.signal.labels)
    incident = inc.open_or_update(
        session, fingerprint=f"guard/{run.rule.name}", title=f"remediation held back: {why}", severity="SEV2",
        source="remediation-guard", labels=labels, links=_links(run.signal), now=now, why=detail or why,
        flap=ruleset.incidents.flap_policy(),
    )  # fmt: skip
    run.results.append({"action": "escalate", "result": f"incident {incident.id}: {detail or why}"})


# -- actions -------------------------------------------------------------------------------------


def _act(session: Session, ruleset: RuleSet, run: _Run, action: Action, now: float) -> None:
    kind, labels = action.kind, run.signal.labels
    node, gpu, job_id = labels.get("node", ""), labels.get("gpu", ""), labels.get("job_id", "")
    needs = {"cordon": node, "drain": node, "quarantine_gpu": node and gpu, "requeue_jobs": node,
             "stop_job": job_id, "notify_owner": job_id}  # fmt: skip
    if not needs[kind]:
        run.results.append({"action": kind, "result": "skipped: the alert names no " + _needed(kind)})
        return
    removes = kind in REMOVING and not _nothing_to_remove(session, run, kind, node, gpu)
    guarded = removes and not run.dry_run
    refusal = _guard_refusal(session, ruleset, run, (kind, node, gpu), now) if guarded else None
    if refusal is not None:
        run.outcome = "guarded"
        run.results.append({"action": kind, "result": "held back by the blast-radius guard"})
        target = f"GPU {gpu} on {node}" if kind == "quarantine_gpu" else f"node {node}"
        title = f"blast-radius guard: {kind} {target} refused"
        _page_a_human(session, ruleset, run, title, now, detail=f"{title}: {refusal}")
        return
    run.message = action.message
    result = _ACTIONS[kind](session, run, node, gpu, job_id, now)
    run.results.append({"action": kind, "result": result})


def _nothing_to_remove(session: Session, run: _Run, kind: str, node: str, gpu: str) -> bool:
    """The target is missing or already out of service: the action is a no-op, not a removal."""
    if kind == "quarantine_gpu":
        row = session.get(GpuRow, (node, int(gpu))) if gpu.isdigit() else None
        target = "lost" if _lost(run.signal) else "quarantined"
        return row is None or row.health == target or (row.health == "lost" and target == "quarantined")
    node_row = session.get(Node, node)
    wanted = "cordoned" if kind == "cordon" else "draining"
    return node_row is None or node_row.admin_state in (wanted, "draining")


def _needed(kind: str) -> str:
    return {"quarantine_gpu": "node and gpu", "stop_job": "job_id", "notify_owner": "job_id"}.get(
        kind, "node"
    )


def _guard_refusal(
    session: Session, ruleset: RuleSet, run: _Run, removal: tuple[str, str, str], now: float
) -> str | None:
    """None while one more removal (kind, node, gpu) stays within the blast-radius guard; else
    why not and what a human does about it, in words. Quarantines count against the cluster's
    GPUs (floor `min_gpu_removals`), cordons and drains against its nodes (floor `min_removals`)."""
    guard, (kind, node, gpu) = ruleset.guard, removal
    nodes_done, gpus_done = session.execute(
        select(func.coalesce(func.sum(RemediationRun.removed_nodes), 0),
               func.coalesce(func.sum(RemediationRun.removed_gpus), 0))
        .where(RemediationRun.at >= now - guard.window, RemediationRun.dry_run.is_(False))
    ).one()  # fmt: skip
    # this run's own earlier removals are counted in `run` (its row is written at the end)
    if kind == "quarantine_gpu":
        unit, floor, floor_name = "GPU", guard.min_gpu_removals, "min_gpu_removals"
        done = int(gpus_done) + run.removed_gpus
        total = int(session.scalar(select(func.count()).select_from(GpuRow)) or 0)
    else:
        unit, floor, floor_name = "node", guard.min_removals, "min_removals"
        done = int(nodes_done) + run.removed_nodes
        total = int(session.scalar(select(func.count()).select_from(Node)) or 0)
    limit = guard.limit(total, floor)
    if done + 1 <= limit:
        return None
    by_hand = f"corral node gpu {node} {gpu} quarantine" if unit == "GPU" else f"corral node {kind} {node}"
    rule = f"max_fraction {guard.max_fraction:g} of the {unit}s, never below {floor_name} {floor}"
    counted = (
        f"rules took {done} of the cluster's {plural(total, unit)} out of service within "
        f"{span_text(guard.window)}, the most the guard allows ({limit}: {rule}). So many at once "
        "is more often a bad driver, a failing node or a false alarm than independent faults"
        if limit
        else f"the guard allows rules no removal on a cluster of {plural(total, unit)} ({rule})"
    )
    return (
        f"{counted}: look at what the rule's alerts say (`corral incident ls`); if this {unit} is "
        f"faulty, take it out by hand (`{by_hand}`); if such faults are usual on a cluster this "
        f"size, raise guard.{floor_name} or guard.max_fraction in the rules file (`corral rules "
        "show`, docs/operations.md)"
    )


def _cordon(session: Session, run: _Run, node: str, gpu: str, job_id: str, now: float) -> str:
    return _admin_state(session, run, node, "cordon", now)


def _drain(session: Session, run: _Run, node: str, gpu: str, job_id: str, now: float) -> str:
    result = _admin_state(session, run, node, "drain", now)
    if run.dry_run or result.startswith("no node"):
        return result
    preempted = requeued = 0
    why = f"node {node} drained by rule {run.rule.name}"
    for job, attempt in node_svc.live_on(session, (node,)):
        if job.state == JobState.SCHEDULED.value:
            # Placed, not launched (or its launch under way): back in the queue now, the attempt
            # cancelled and its GPUs freed. A launch in flight finds the job settled when it is
            # recorded and stops its process (server.dispatch); one claimed by a server that died
            # may have started one, so it is stopped too (a stop is idempotent).
            requeued += _requeue_scheduled(session, job, attempt, why, now)
        elif job.state in (JobState.STARTING.value, JobState.RUNNING.value):
            # Starting too: the reconcile loop stops a preempted job's attempt with its stop
            # grace and requeues the job when it ends (services.lifecycle).
            preempted += transition(session, job, JobState.PREEMPTED, now=now, message=why)
    return (
        f"{result}; {plural(preempted, 'job')} preempted with their stop grace, "
        f"{requeued} not yet started requeued"
    )


def _requeue_scheduled(session: Session, job: Job, attempt: Attempt, why: str, now: float) -> bool:
    message = f"{why} before attempt {attempt.number} started; back in the queue"
    if not transition(session, job, JobState.QUEUED, now=now, message=message, values={"reason": message}):
        return False  # launched, cancelled or settled meanwhile: the next look decides
    ended = {"ended_at": now, "reason": "stopped", "message": message}
    if not move_attempt(session, attempt, AttemptState.CANCELLED, ended):
        raise Conflict(f"attempt {attempt.attempt_id} changed while node drain requeued its job")
    node_svc.release_claims(session, [attempt])
    if job.lease_owner is not None:
        session.info.setdefault(STOPS_KEY, []).append((attempt.attempt_id, 0.0))
    return True


def _admin_state(session: Session, run: _Run, node: str, action: str, now: float) -> str:
    row = session.get(Node, node)
    if row is None:
        return f"no node {node}"
    wanted = "cordoned" if action == "cordon" else "draining"
    if row.admin_state in ("cordoned", "draining") and (action == "cordon" or row.admin_state == wanted):
        return f"node {node} already {row.admin_state}"
    if run.dry_run:
        return f"would {action} node {node}"
    before = row.admin_state
    node_svc.set_admin_state(session, node, action)
    run.removed_nodes += 1
    audit.record(session, actor=ACTOR, action=f"node.{action}", target_kind="node", target_id=node,
                 before={"admin_state": before}, after={"admin_state": wanted},
                 detail=f"rule {run.rule.name}", now=now)  # fmt: skip
    return f"node {node} {wanted}"


def quarantine_gpu(session: Session, gpu: GpuRow, lost: bool, why: str, now: float | None = None) -> bool:
    """Out of placement (quarantined; lost when it fell off the bus) until an operator returns it."""
    target = GpuHealth.LOST if lost else GpuHealth.QUARANTINED
    if gpu.health == target.value or (gpu.health == GpuHealth.LOST.value and not lost):
        return False
    before = gpu.health
    if not move_gpu(session, gpu, target):
        return False
    audit.record(session, actor=ACTOR, action=f"gpu.{target.value}" if lost else "gpu.quarantine",
                 target_kind="gpu", target_id=f"{gpu.node_name}:{gpu.index}", before={"health": before},
                 after={"health": target.value}, detail=why, now=now)  # fmt: skip
    return True


def _lost(signal: Signal) -> bool:
    return signal.name == "CorralGpuLost" or signal.labels.get("fault") == "lost"


def _quarantine(session: Session, run: _Run, node: str, gpu: str, job_id: str, now: float) -> str:
    row = session.get(GpuRow, (node, int(gpu))) if gpu.isdigit() else None
    if row is None:
        return f"node {node} has no GPU {gpu}"
    lost = _lost(run.signal)
    target = "lost" if lost else "quarantined"
    if row.health == target or (row.health == "lost" and not lost):
        return f"GPU {gpu} on {node} already {row.health}"
    if run.dry_run:
        return f"would mark GPU {gpu} on {node} {target}"
    if not quarantine_gpu(session, row, lost, f"rule {run.rule.name}: {run.signal.summary}", now):
        return f"GPU {gpu} on {node} changed meanwhile"
    run.removed_gpus += 1
    return f"GPU {gpu} on {node} {target}"


def _jobs_on(session: Session, node: str, gpu: int | None) -> list[Job]:
    stmt = select(GpuClaim.job_id).where(GpuClaim.node == node)
    if gpu is not None:
        stmt = stmt.where(GpuClaim.gpu_index == gpu)
    ids = sorted(set(session.scalars(stmt)))
    return list(session.scalars(select(Job).where(Job.id.in_(ids)).order_by(Job.id))) if ids else []


def _requeue(session: Session, run: _Run, node: str, gpu: str, job_id: str, now: float) -> str:
    """Stop the attempts on the GPU (or the whole node) with a hardware fault on record: their end
    is diagnosed gpu_error, retried on the platform's budget, and the retry avoids the GPU (node)."""
    index = int(gpu) if gpu.isdigit() else None
    if index is None and not node_svc.ready_node_outside(session, [node]):
        # The retry would have to avoid the only node and could never run: a lost node's work
        # is settled by the node loop (requeued), and placed there again once it is back.
        return f"left to the node loop: no other ready node than {node}"
    lost = _lost(run.signal)
    stopped = []
    for job in _jobs_on(session, node, index):
        attempt = session.scalars(
            select(Attempt).where(Attempt.job_id == job.id, Attempt.state.in_(LIVE_ATTEMPTS))
        ).first()
        if attempt is None or session.get(AttemptFault, attempt.id) is not None:
            continue  # already being stopped for a fault
        stopped.append(str(job.id))
        if run.dry_run:
            continue
        where = f"GPU {index} on {node}" if index is not None else f"node {node}"
        event = "gpu_lost" if lost else "gpu_error"
        detail = run.signal.summary or run.signal.name
        session.add(
            AttemptFault(
                attempt_pk=attempt.id, event=event, node=node, gpu_index=index, detail=detail, at=now
            )
        )
        text = (
            f"{where}: {run.signal.summary or run.signal.name}; attempt {attempt.number} stopped and requeued"
        )
        record_event(session, job.id, now, f"{text} (rule {run.rule.name})", kind="diagnosis")
        attempt.stop_requested_at = now
        attempt.stop_grace_s = 0.0
        session.info.setdefault(STOPS_KEY, []).append((attempt.attempt_id, 0.0))
    if not stopped:
        return "no running job there"
    jobs = "job" if len(stopped) == 1 else "jobs"
    return f"{'would requeue' if run.dry_run else 'requeued'} {jobs} {', '.join(stopped)}"


def _stop_job(session: Session, run: _Run, node: str, gpu: str, job_id: str, now: float) -> str:
    job = session.get(Job, int(job_id)) if job_id.isdigit() else None
    if job is None or JobState(job.state).terminal:
        return f"job {job_id} is not running"
    if job.cancel_requested:
        return f"job {job_id} already being stopped"
    if run.dry_run:
        return f"would stop job {job_id}"
    why = f"stopped by rule {run.rule.name}: {run.signal.summary}"
    if not request_cancel(session, job, now=now, why=why, kind="remediation"):
        return f"job {job_id} is not running"  # it ended since it was read
    return f"job {job_id} stopped"


def _notify_owner(session: Session, run: _Run, node: str, gpu: str, job_id: str, now: float) -> str:
    job = session.get(Job, int(job_id)) if job_id.isdigit() else None
    if job is None:
        return f"no job {job_id}"
    if run.dry_run:
        return f"would notify the owner of job {job_id}"
    # this action's own message: a rule may notify twice (e.g. before and after a drain)
    message = render(run.message, run.signal) if run.message else run.signal.summary or run.signal.name
    record_event(
        session, job.id, now, f"notice from the operators ({run.rule.name}): {message}", kind="notice"
    )
    return f"owner of job {job_id} notified"


_ACTIONS = {
    "cordon": _cordon,
    "drain": _drain,
    "quarantine_gpu": _quarantine,
    "requeue_jobs": _requeue,
    "stop_job": _stop_job,
    "notify_owner": _notify_owner,
}


def take_stops(session: Session) -> list[tuple[str, float]]:
    """The attempts this session's rules stopped (attempt id, grace), for the engine, once."""
    stops: list[tuple[str, float]] = session.info.pop(STOPS_KEY, [])
    return stops


def faulted_live_attempts(session: Session, since: float, before: float) -> list[str]:
    """Attempts with a fault recorded between `since` and `before` that still run: stops not
    delivered (the engine's stop is idempotent). Hang faults too: the diagnosis watch records one
    only when its policy stops the attempt (kill, requeue), and acts once per suspicion, so a stop
    of its that did not go out (server killed after the commit, engine unreachable) has no other
    second chance."""
    rows = session.execute(
        select(Attempt.job_id, Attempt.number)
        .join(AttemptFault, AttemptFault.attempt_pk == Attempt.id)
        .where(Attempt.state.in_(LIVE_ATTEMPTS))
        .where(AttemptFault.at >= since, AttemptFault.at <= before)
    )
    return [f"{job_id}.{number}" for job_id, number in rows]


def recent_runs(session: Session, *, limit: int = 100, rule: str | None = None) -> list[dict[str, Any]]:
    stmt = select(RemediationRun).order_by(RemediationRun.id.desc()).limit(limit)
    if rule:
        stmt = stmt.where(RemediationRun.rule == rule)
    return [
        {"id": r.id, "rule": r.rule, "rules_version": r.rules_version, "signal": r.signal, "at": r.at,
         "dry_run": r.dry_run, "outcome": r.outcome, "actions": r.actions, "incident_id": r.incident_id}
        for r in session.scalars(stmt)
    ]  # fmt: skip
