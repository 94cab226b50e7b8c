"""The diagnosis watch loop: GPU faults under running jobs, suspected hangs and stragglers, and
nodes that fail the jobs of many users.

- **GPU faults.** A new Xid (other than the application-caused ones) or uncorrectable ECC error,
  or a GPU falling off the bus, on a GPU Corral sampled (monitor readings): the watch emits the
  event `GpuFault` to the remediation rules (corral.services.remediation), whose shipped rule
  `gpu-fault` quarantines the GPU, stops the attempt running on it with an `AttemptFault` and
  opens a SEV2 incident. The attempt's end is then diagnosed `gpu_error` (hardware) and retried
  away from that GPU. The same rule matches the ECC and lost-GPU alerts of the GPU sampling loop,
  which usually sees the fault first; its actions are idempotent, so whichever comes second only
  joins the incident.
- **Hangs.** All ranks alive (the attempt runs), its GPUs near 0 % and no rank's log growing for
  `hang_after_s`: "suspected hang", naming the rank whose log stopped first (or whose GPU differs
  from its peers'); the owner hears of it through the job's events and an alert on the monitor's
  channels; the policy (`on_hang:` in the spec, else the group's, else the server's) may then
  kill or requeue it.
- **Stragglers.** In a multi-instance attempt, a rank whose log grew much less than its peers'
  median, or whose GPUs are much less busy: one line on the job (`corral show`).
- **Bad nodes.** A node where attempts of `node_flag_users` distinct users failed (categories other
  than user and preempted) within `node_flag_window_s` is flagged (`node_flags`, shown by
  `corral node ls`) and raises the alert `CorralNodeFailingJobs`.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from corral.db.diag_models import AttemptDiagnosis, AttemptFault, HangWatch, NodeFlag
from corral.db.models import Attempt, GpuClaim, Job
from corral.diagnosis.logtail import log_size
from corral.diagnosis.settings import DiagnosisSettings, HangAction
from corral.engine.base import Engine, EngineUnavailable
from corral.monitor.alerts import record_alert
from corral.monitor.loops import channel_names
from corral.monitor.models import GpuReading, MonitorState
from corral.server.context import BackgroundLoop, ServerContext
from corral.services import remediation
from corral.services.lifecycle import AttemptState, JobState, record_event
from corral.words import plural

log = logging.getLogger("corral.diagnosis.watch")
SOURCE = "corral"
MARKS_KEY = "diag_gpu_marks"
# Xids an application causes (illegal address, MMU fault from user code, ...): not the GPU's fault.
APPLICATION_XIDS = frozenset({13, 31, 43, 45})


def watch_tick(ctx: ServerContext, now: float) -> None:
    settings = _settings()
    stops: list[tuple[str, float]] = []
    with ctx.session_factory() as session:
        stops += check_gpu_faults(session, now)
        session.commit()
    with ctx.session_factory() as session:
        stops += check_hangs(session, ctx.engine, now, settings, channel_names(ctx))
        session.commit()
    with ctx.session_factory() as session:
        flag_nodes(session, now, settings, channel_names(ctx))
        session.commit()
    for attempt_id, grace in stops:  # after the commit: the fault is on record before the stop
        try:
            ctx.engine.stop(attempt_id, grace)
        except EngineUnavailable as exc:
            log.warning("could not stop %s: %s", attempt_id, exc)
    if stops:
        ctx.wake("reconcile", "monitor-delivery")


_SETTINGS: list[DiagnosisSettings] = []


def _settings() -> DiagnosisSettings:
    if not _SETTINGS:
        _SETTINGS.append(DiagnosisSettings())
    return _SETTINGS[0]


# -- GPU faults ----------------------------------------------------------------------------------


def check_gpu_faults(session: Session, now: float) -> list[tuple[str, float]]:
    """New hardware faults since the last pass; returns the attempts to stop (id, grace)."""
    mark = session.get(MonitorState, MARKS_KEY)
    if mark is None:
        mark = MonitorState(key=MARKS_KEY, value={})
        session.add(mark)
    marks: dict[str, list[int]] = dict(mark.value)
    faults: list[tuple[GpuReading, str]] = []
    for r in session.scalars(select(GpuReading)):
        key = f"{r.node}/{r.gpu_index}"
        seen = marks.get(key)
        current = [r.xid_events_total, r.ecc_volatile_uncorrected, 0 if r.present else 1]
        marks[key] = current
        if seen is None:
            continue  # first sight: its history is not news
        why = _fault_of(r, seen)
        if why:
            faults.append((r, why))
    mark.value = marks
    stops = []
    for reading, why in faults:
        stops += _act_on_fault(session, reading, why, now)
    return stops


def _fault_of(r: GpuReading, seen: Sequence[int]) -> str:
    if not r.present and not seen[2]:
        return "fell off the bus"
    if r.ecc_volatile_uncorrected > seen[1]:
        return plural(r.ecc_volatile_uncorrected - seen[1], "new uncorrectable ECC error")
    if r.xid_events_total > seen[0] and r.last_xid not in APPLICATION_XIDS:
        return f"Xid {r.last_xid}"
    return ""


def _act_on_fault(session: Session, r: GpuReading, why: str, now: float) -> list[tuple[str, float]]:
    """Emit the fault to the remediation rules (the shipped rule quarantines and requeues)."""
    lost = not r.present
    labels = {"node": r.node, "gpu": str(r.gpu_index), "severity": "critical",
              "fault": "lost" if lost else ("ecc" if "ECC" in why else "xid")}  # fmt: skip
    claim = session.get(GpuClaim, (r.node, r.gpu_index))
    if claim is not None:
        labels["job_id"] = str(claim.job_id)
    log.warning("GPU %s on %s: %s", r.gpu_index, r.node, why)
    summary = f"GPU {r.gpu_index} on {r.node}: {why}"
    remediation.on_signal(session, remediation.Signal(name="GpuFault", labels=labels, summary=summary), now)
    return remediation.take_stops(session)


# -- hangs and stragglers ------------------------------------------------------------------------


def check_hangs(
    session: Session, engine: Engine, now: float, settings: DiagnosisSettings, channels: Sequence[str]
) -> list[tuple[str, float]]:
    attempts = session.scalars(
        select(Attempt)
        .join(Job, Job.id == Attempt.job_id)
        .where(Attempt.state == AttemptState.RUNNING.value, Job.state == JobState.RUNNING.value)
        .options(
            selectinload(Attempt.job).selectinload(Job.user),
            selectinload(Attempt.job).selectinload(Job.group),
        )
    ).all()
    # An ended attempt's watch stays (the job's page shows what was suspected); only live ones are read.
    live = [a.id for a in attempts]
    watches = {
        w.attempt_pk: w for w in session.scalars(select(HangWatch).where(HangWatch.attempt_pk.in_(live)))
    }
    util = {(r.node, r.gpu_index): r.utilization_percent for r in session.scalars(select(GpuReading))}
    stops = []
    for attempt in attempts:
        watch = watches.get(attempt.id)
        if watch is None:
            watch = HangWatch(
                attempt_pk=attempt.id, job_id=attempt.job_id, ranks={}, suspect="", stragglers="", acted=""
            )
            session.add(watch)
        try:
            progress = _log_progress(engine, attempt, watch, now)
        except (EngineUnavailable, OSError) as exc:
            log.warning("hang watch: cannot read logs of %s: %s", attempt.attempt_id, exc)
            continue
        ranks_util = _rank_util(attempt, util)
        watch.stragglers = straggler_report(attempt, progress, ranks_util, settings.straggler_ratio)
        stop = _judge_hang(session, attempt, watch, progress, ranks_util, now, settings, channels)
        if stop is not None:
            stops.append(stop)
    return stops


def _log_progress(engine: Engine, attempt: Attempt, watch: HangWatch, now: float) -> dict[int, list[float]]:
    """Per rank [bytes, time the log last grew, bytes when first seen]; cheap when unchanged (one
    one-byte read at the last known size)."""
    ranks = {int(k): list(v) for k, v in (watch.ranks or {}).items()}
    for p in attempt.placement or ():
        known = ranks.get(p.rank)
        if known is not None and not engine.logs(attempt.attempt_id, p.rank, int(known[0]), 1).data:
            continue
        size = float(log_size(engine, attempt.attempt_id, p.rank))
        ranks[p.rank] = [size, now, size] if known is None else [size, now, known[2]]
    watch.ranks = {str(k): v for k, v in ranks.items()}
    return ranks


def _rank_util(attempt: Attempt, util: dict[tuple[str, int], float]) -> dict[int, float]:
    out = {}
    for p in attempt.placement or ():
        values = [util.get((p.node, g), 0.0) for g in p.gpu_indices]
        if values:
            out[p.rank] = sum(values) / len(values)
    return out


def _judge_hang(
    session: Session,
    attempt: Attempt,
    watch: HangWatch,
    progress: dict[int, list[float]],
    ranks_util: dict[int, float],
    now: float,
    settings: DiagnosisSettings,
    channels: Sequence[str],
) -> tuple[str, float] | None:
    job = attempt.job
    idle = bool(ranks_util) and all(u < settings.hang_gpu_util_percent for u in ranks_util.values())
    if not idle:
        watch.idle_since = None
    elif watch.idle_since is None:
        watch.idle_since = now
    last_growth = max((v[1] for v in progress.values()), default=now)
    still_since = max(last_growth, watch.idle_since or now)
    hung = idle and progress and now - still_since >= settings.hang_after_s
    labels = {"alertname": "CorralJobSuspectedHang", "severity": "warning", "job_id": str(job.id),
              "user": job.user.name, "group": job.group.name}  # fmt: skip
    if not hung:
        if watch.suspected_at is not None:
            watch.suspected_at, watch.suspect, watch.acted = None, "", ""
            record_event(session, job.id, now, "no longer suspected hung: it made progress", kind="diagnosis")
            record_alert(session, labels=labels, status="resolved", now=now, channels=channels, source=SOURCE)
        return None
    if watch.suspected_at is not None:
        return None
    watch.suspected_at = now
    watch.suspect = suspect_of(attempt, progress, ranks_util, now)
    policy = hang_policy(job, settings)
    text = f"suspected hang: {watch.suspect}; policy on_hang: {policy}"
    record_event(session, job.id, now, text, kind="diagnosis")
    summary = f"job {job.id} ({job.user.name}) looks hung: {watch.suspect}"
    record_alert(session, labels=labels, status="firing", now=now, channels=channels, source=SOURCE,
                 annotations={"summary": summary})  # fmt: skip
    watch.acted = policy
    if policy == "notify":
        return None
    session.add(
        AttemptFault(
            attempt_pk=attempt.id, event="hang", node="", detail=f"{policy}: {watch.suspect}", at=now
        )
    )
    attempt.stop_requested_at = now
    return attempt.attempt_id, 5.0


def hang_policy(job: Job, settings: DiagnosisSettings) -> HangAction:
    spec_policy = job.spec.on_hang
    if spec_policy is not None:
        return spec_policy
    return settings.group_on_hang.get(job.group.name, settings.on_hang)


def suspect_of(
    attempt: Attempt, progress: dict[int, list[float]], ranks_util: dict[int, float], now: float
) -> str:
    """The rank whose log stopped first, or whose GPUs differ from the others'."""
    nodes = {p.rank: p.node for p in attempt.placement or ()}
    idle_for = f"GPUs near idle, no log output for {now - max(v[1] for v in progress.values()):.0f} s"
    if len(progress) == 1:
        (rank,) = progress
        return f"rank {rank} on {nodes.get(rank, '?')}: {idle_for}"
    order = sorted(progress.items(), key=lambda kv: (kv[1][1], kv[0]))
    (first, first_v), (_, second_v) = order[0], order[1]
    if second_v[1] - first_v[1] >= 1.0:
        gap = second_v[1] - first_v[1]
        where = f"rank {first} on {nodes.get(first, '?')}"
        return f"{where}: its log stopped first ({gap:.0f} s before the next); {idle_for}"
    odd = _odd_one_out(ranks_util)
    if odd is not None:
        return f"rank {odd} on {nodes.get(odd, '?')}: its GPU use differs from its peers'; {idle_for}"
    return f"rank {first} on {nodes.get(first, '?')} (all ranks stopped together); {idle_for}"


def _odd_one_out(values: dict[int, float]) -> int | None:
    if len(values) < 3:
        return None
    median = statistics.median(values.values())
    rank, value = max(values.items(), key=lambda kv: abs(kv[1] - median))
    return rank if abs(value - median) >= 1.0 else None


def straggler_report(
    attempt: Attempt, progress: dict[int, list[float]], ranks_util: dict[int, float], ratio: float
) -> str:
    """Ranks much slower than their peers, by log growth or by GPU utilisation; "" when none."""
    if len(progress) < 2:
        return ""
    nodes = {p.rank: p.node for p in attempt.placement or ()}
    notes = []
    growth = {r: v[0] - v[2] for r, v in progress.items()}
    for rank, grown in sorted(growth.items()):
        peers = [g for r, g in growth.items() if r != rank]
        median = statistics.median(peers)
        if median >= 1024 and grown < ratio * median:
            where = f"rank {rank} on {nodes.get(rank, '?')}"
            notes.append(f"{where}: log grew {grown / 1024:.1f} KiB, peers {median / 1024:.1f} KiB")
    for rank, u in sorted(ranks_util.items()):
        peers = [x for r, x in ranks_util.items() if r != rank]
        median = statistics.median(peers) if peers else 0.0
        if median >= 20 and u < ratio * median:
            notes.append(f"rank {rank} on {nodes.get(rank, '?')}: GPU {u:.0f} %, peers {median:.0f} %")
    return "; ".join(notes)


# -- nodes that fail many users' jobs ------------------------------------------------------------

NOT_THE_NODES_FAULT = ("user", "preempted")


def flag_nodes(
    session: Session, now: float, settings: DiagnosisSettings, channels: Sequence[str]
) -> list[str]:
    """Flag (and alert on) nodes where jobs of `node_flag_users` distinct users failed within the
    window; clear the flag once the window holds fewer. Returns the nodes flagged now."""
    rows = session.execute(
        select(AttemptDiagnosis.node, AttemptDiagnosis.user_name).where(
            AttemptDiagnosis.at >= now - settings.node_flag_window_s,
            AttemptDiagnosis.category.not_in(NOT_THE_NODES_FAULT),
            AttemptDiagnosis.node != "",
        )
    ).all()
    users: dict[str, set[str]] = {}
    for node, user in rows:
        users.setdefault(node, set()).add(user)
    flags = {f.node: f for f in session.scalars(select(NodeFlag))}
    flagged = []
    window_h = settings.node_flag_window_s / 3600
    for node in sorted(set(users) | set(flags)):
        who = users.get(node, set())
        bad = len(who) >= settings.node_flag_users
        flag = flags.get(node)
        labels = {"alertname": "CorralNodeFailingJobs", "severity": "warning", "node": node}
        if bad and (flag is None or not flag.active):
            detail = f"failed jobs of {len(who)} users ({', '.join(sorted(who))}) within {window_h:g} h"
            if flag is None:
                session.add(NodeFlag(node=node, flag="failing_jobs", detail=detail, since=now, active=True))
            else:
                flag.detail, flag.since, flag.active = detail, now, True
            record_alert(session, labels=labels, status="firing", now=now, channels=channels, source=SOURCE,
                         annotations={"summary": f"node {node} {detail}"})  # fmt: skip
            flagged.append(node)
        elif not bad and flag is not None and flag.active:
            flag.active = False
            record_alert(session, labels=labels, status="resolved", now=now, channels=channels, source=SOURCE)
    return flagged


def _loops() -> list[BackgroundLoop]:
    return [BackgroundLoop("diagnosis-watch", _settings().interval_s, watch_tick)]


LOOPS: list[BackgroundLoop] = _loops()
