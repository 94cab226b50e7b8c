"""Health checks Corral runs itself, without Prometheus: GPU readings (sampled into the
database), lost GPUs, ECC errors, Xid events, overheating, lost nodes (heartbeat) and job OOMs.

Each finding becomes an alert from source "corral" (deduplicated by fingerprint like any other,
so it notifies once per change) and, where a job is affected, a `JobEvent` of kind "health" on
that job. Edges (a GPU just lost, new ECC errors) write events; levels (still lost) do not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.models import Attempt, GpuClaim, Group, Job, Node, User
from corral.db.models import Gpu as GpuRow
from corral.monitor.alerts import fingerprint_of, record_alert
from corral.monitor.config import HealthRules
from corral.monitor.gpu import GpuRef, GpuSample, GpuSampler
from corral.monitor.models import Alert, GpuReading, MonitorState
from corral.monitor.runbooks import runbook_url
from corral.scheduler.types import NodeState
from corral.services.lifecycle import record_event
from corral.words import plural

SOURCE = "corral"
OOM_REASONS = ("oom", "cuda_oom")


@dataclass
class HealthPass:
    """What one tick does to alerts: raise or resolve by labels, remembering firing ones."""

    session: Session
    now: float
    channels: Sequence[str]
    firing: dict[str, Alert] = field(default_factory=dict)

    @classmethod
    def start(cls, session: Session, now: float, channels: Sequence[str]) -> HealthPass:
        rows = session.scalars(select(Alert).where(Alert.source == SOURCE, Alert.status == "firing"))
        return cls(session, now, channels, {a.fingerprint: a for a in rows})

    def set(self, labels: dict[str, str], firing: bool, summary: str = "") -> bool:
        """Raise (firing=True) or resolve the alert with these labels; True when it changed."""
        fp = fingerprint_of(labels)
        if not firing and fp not in self.firing:
            return False
        runbook = runbook_url(labels["alertname"])
        annotations = {"summary": summary, "runbook_url": runbook} if summary else None
        change = record_alert(
            self.session, labels=labels, status="firing" if firing else "resolved", now=self.now,
            channels=self.channels, source=SOURCE, annotations=annotations, fingerprint=fp,
        )  # fmt: skip
        return change.changed


def job_event(session: Session, job_id: int, now: float, message: str, kind: str = "health") -> None:
    record_event(session, job_id, now, message, kind=kind)


def gpu_refs(session: Session) -> list[GpuRef]:
    """The GPUs the database knows, each with the Xid count of its stored reading (same uuid):
    where a restarted server's NVML provider counts on from (corral.monitor.gpu)."""
    stored = (GpuReading.node == GpuRow.node_name) & (GpuReading.gpu_index == GpuRow.index)
    stored &= GpuReading.uuid == GpuRow.uuid
    rows = session.execute(
        select(GpuRow.node_name, GpuRow.index, GpuRow.uuid, GpuRow.memory_mib,
               GpuReading.xid_events_total, GpuReading.last_xid).outerjoin(GpuReading, stored)
    )  # fmt: skip
    return [GpuRef(node, index, uuid, mem, xids or 0, last) for node, index, uuid, mem, xids, last in rows]


def store_samples(
    session: Session, samples: Sequence[GpuSample], now: float, known: Sequence[GpuRef] = ()
) -> dict[tuple[str, int], GpuReading]:
    """Upsert the readings; returns the previous readings (detached copies of the values).
    Readings of GPUs no longer in `known` (node removed) are deleted."""
    existing = {(r.node, r.gpu_index): r for r in session.scalars(select(GpuReading))}
    previous = {key: _copy(r) for key, r in existing.items()}
    if known:
        current = {(g.node, g.index) for g in known}
        for key in [k for k in existing if k not in current]:
            session.delete(existing.pop(key))
    for s in samples:
        row = existing.get((s.node, s.index))
        if row is None:
            row = GpuReading(node=s.node, gpu_index=s.index)
            session.add(row)
        row.uuid = s.uuid
        row.present = s.present
        row.utilization_percent = s.utilization_percent
        row.memory_used_mib = s.memory_used_mib
        row.memory_total_mib = s.memory_total_mib
        row.temperature_c = s.temperature_c
        row.power_w = s.power_w
        row.ecc_volatile_corrected = s.ecc_volatile_corrected
        row.ecc_volatile_uncorrected = s.ecc_volatile_uncorrected
        row.ecc_aggregate_corrected = s.ecc_aggregate_corrected
        row.ecc_aggregate_uncorrected = s.ecc_aggregate_uncorrected
        row.xid_events_total = s.xid_events_total
        row.last_xid = s.last_xid
        row.sampled_at = now
    return previous


def _copy(r: GpuReading) -> GpuReading:
    return GpuReading(
        node=r.node, gpu_index=r.gpu_index, present=r.present, temperature_c=r.temperature_c,
        ecc_volatile_uncorrected=r.ecc_volatile_uncorrected, xid_events_total=r.xid_events_total,
        last_xid=r.last_xid,
    )  # fmt: skip


def sample_and_check_gpus(
    session: Session, sampler: GpuSampler, now: float, channels: Sequence[str], rules: HealthRules
) -> list[GpuSample]:
    """One GPU pass: sample every known GPU, store the readings, raise/resolve GPU alerts."""
    refs = gpu_refs(session)
    samples = sampler.sample(refs)
    previous = store_samples(session, samples, now, refs)
    holders = {(c.node, c.gpu_index): c.job_id for c in session.scalars(select(GpuClaim))}
    check = HealthPass.start(session, now, channels)
    for s in samples:
        _check_gpu(check, s, previous.get((s.node, s.index)), holders.get((s.node, s.index)), rules)
    _resolve_removed(check, refs)
    session.commit()
    return samples


GPU_ALERTS = ("CorralGpuLost", "CorralGpuEccErrors", "CorralGpuOverheating", "CorralGpuXid")


def _resolve_removed(check: HealthPass, refs: Sequence[GpuRef]) -> None:
    """Alerts of GPUs the cluster no longer has (removed from their node, or replaced: another
    uuid) resolve: nothing samples those GPUs any more, so they would stay firing for ever."""
    known = {(r.node, str(r.index), r.uuid) for r in refs}
    for alert in list(check.firing.values()):
        labels = alert.labels
        where = (labels.get("node"), labels.get("gpu"), labels.get("uuid"))
        if alert.name in GPU_ALERTS and where not in known:
            check.set(dict(labels), False)


def _check_gpu(
    check: HealthPass, s: GpuSample, prev: GpuReading | None, job_id: int | None, rules: HealthRules
) -> None:
    where = {"node": s.node, "gpu": str(s.index), "uuid": s.uuid}
    name = f"GPU {s.index} on {s.node}"
    notes: list[str] = []
    lost = not s.present
    if check.set(_labels("CorralGpuLost", "critical", where), lost, f"{name} fell off the bus") and lost:
        notes.append(f"{name} ({s.uuid}) was lost")
    ecc = s.ecc_volatile_uncorrected
    summary = f"{name} has {plural(ecc, 'uncorrectable ECC error')} since its last reset"
    check.set(_labels("CorralGpuEccErrors", "critical", where), ecc > 0, summary)
    new_ecc = ecc - (prev.ecc_volatile_uncorrected or 0) if prev is not None else ecc
    if new_ecc > 0:
        notes.append(f"{name}: {plural(new_ecc, 'new uncorrectable ECC error')}")
    hot = s.present and s.temperature_c >= rules.gpu_temperature_c
    summary = f"{name} at {s.temperature_c:.0f} C"
    if check.set(_labels("CorralGpuOverheating", "warning", where), hot, summary) and hot:
        notes.append(f"{name} is overheating ({s.temperature_c:.0f} C)")
    # An Xid is an event, not a level: its alert stays firing for `xid_alert_hold` after the last one.
    new_xids = s.xid_events_total - (prev.xid_events_total or 0 if prev is not None else 0)
    xid_labels = _labels("CorralGpuXid", "critical", where)
    if new_xids > 0:
        check.set(xid_labels, True, f"{name} reported Xid {s.last_xid}")
        notes.append(f"{name} reported Xid {s.last_xid}")
    else:
        held = check.firing.get(fingerprint_of(xid_labels))
        if held is not None and check.now - held.last_received_at >= rules.xid_alert_hold:
            check.set(xid_labels, False)
    if job_id is not None:
        for note in notes:
            job_event(check.session, job_id, check.now, note)


def _labels(alertname: str, severity: str, where: dict[str, str]) -> dict[str, str]:
    return {"alertname": alertname, "severity": severity, **where}


def check_nodes(session: Session, now: float, channels: Sequence[str], rules: HealthRules) -> list[str]:
    """Nodes whose heartbeat is older than `node_lost_after` and that the node loop has marked
    down: alert, and an event on each job holding GPUs there. Returns the names of the nodes
    found lost.

    An old heartbeat alone is not enough: a server that starts after a while down (or takes the
    node loop over from another) finds every node's heartbeat old until its node loop's first
    pass, and the node-lost rule would stop every job of every node. A node that really stopped
    answering is marked down by the node loop within its heartbeat timeout (or by its engine:
    Slurm's DOWN). Nor is `unknown` a loss: it is what an engine outage leaves every node in
    (docs/slurm.md: nothing is failed because of the outage), and the rule would stop their jobs."""
    check = HealthPass.start(session, now, channels)
    lost = []
    for name, last_hb, state in session.execute(select(Node.name, Node.last_heartbeat, Node.state)):
        if last_hb is None:
            continue  # never reported: nothing to compare against
        age = now - last_hb
        is_lost = age > rules.node_lost_after and state == NodeState.DOWN.value
        labels = {"alertname": "CorralNodeLost", "severity": "critical", "node": name}
        changed = check.set(labels, is_lost, f"no heartbeat from {name} for {age:.0f} s")
        if is_lost:
            lost.append(name)
        if changed and is_lost:
            job_ids = set(session.scalars(select(GpuClaim.job_id).where(GpuClaim.node == name)))
            for job_id in sorted(job_ids):
                job_event(session, job_id, now, f"node {name} lost: no heartbeat for {age:.0f} s")
    session.commit()
    return lost


def check_ooms(session: Session, now: float, channels: Sequence[str], rules: HealthRules) -> int:
    """Attempts that ended out of memory since the last pass: alert + job event. Returns count."""
    mark = session.get(MonitorState, "oom_scan")
    if mark is None:
        mark = MonitorState(key="oom_scan", value={"after_id": 0})
        session.add(mark)
    after_id = int(mark.value.get("after_id", 0))
    rows = session.execute(
        select(
            Attempt.id, Attempt.job_id, Attempt.number, Attempt.reason, Attempt.message, User.name, Group.name
        )
        .join(Job, Job.id == Attempt.job_id)
        .join(User, User.id == Job.user_id)
        .join(Group, Group.id == Job.group_id)
        .where(Attempt.id > after_id, Attempt.reason.in_(OOM_REASONS))
        .order_by(Attempt.id)
    ).all()
    check = HealthPass.start(session, now, channels)
    for attempt_id, job_id, number, reason, message, user, group in rows:
        labels = {
            "alertname": "CorralJobOOM", "severity": "warning", "job_id": str(job_id), "attempt": str(number),
            "user": user, "group": group, "reason": reason or "",
        }  # fmt: skip
        what = "host memory (cgroup OOM kill)" if reason == "oom" else "GPU memory (CUDA OOM)"
        check.set(labels, True, f"job {job_id} attempt {number} ran out of {what}")
        job_event(session, job_id, now, f"attempt {number} ran out of {what}: {message}".strip(": "))
        after_id = max(after_id, attempt_id)
    for alert in list(check.firing.values()):
        if alert.name == "CorralJobOOM" and now - alert.starts_at >= rules.oom_alert_hold:
            check.set(dict(alert.labels), False)
    mark.value = {"after_id": after_id}
    session.commit()
    return len(rows)
