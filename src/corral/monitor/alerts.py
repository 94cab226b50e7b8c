"""Alert intake and storage: Alertmanager webhook payloads and Corral's own health alerts end up
as `Alert` rows deduplicated by fingerprint. A change of status (new, firing -> resolved, resolved
-> firing again) queues one `AlertNotification` per configured channel; nothing here sends, so a
broken channel can never slow down or fail intake."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator
from sqlalchemy import ColumnElement, String, and_, cast, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.api.schemas import RequestBody
from corral.db.models import Group, Job
from corral.monitor.models import Alert, AlertNotification
from corral.services import remediation
from corral.services.auth import Principal
from corral.services.jobs import visibility

log = logging.getLogger(__name__)
ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's "not set"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def parse_time(value: str | None) -> float | None:
    """Unix seconds from an RFC 3339 time (Alertmanager sends nanoseconds); None for the zero time."""
    if not value or value.startswith("0001-01-01"):
        return None
    match = _RFC3339.match(value.strip())
    if not match:
        raise ValueError(f"not an RFC 3339 time: {value!r}")
    base, frac, zone = match.groups()
    frac = (frac or ".0")[:7]  # datetime takes microseconds at most
    zone = "+00:00" if zone == "Z" else zone
    return datetime.fromisoformat(f"{base}{frac}{zone}").timestamp()


class WebhookAlert(RequestBody):
    model_config = ConfigDict(extra="ignore")

    status: Literal["firing", "resolved"]
    labels: dict[str, str] = Field(min_length=1)
    annotations: dict[str, str] = Field(default_factory=dict)
    startsAt: str
    endsAt: str = ZERO_TIME
    generatorURL: str = ""
    fingerprint: str = Field(default="", max_length=64)

    @field_validator("fingerprint")
    @classmethod
    def _fingerprint_without_control_characters(cls, value: str) -> str:
        # The dedup key, and an email header's value: a line break made every email of the alert
        # fail (EmailMessage refuses it), review113 #2. Such a fingerprint is replaced by the
        # labels' own (record_alert's fallback for none), not refused: a 400 dropped the whole
        # batch, the other alerts too, and Alertmanager does not retry a 4xx (review114 #8).
        if bad := _CONTROL.search(value):
            log.warning("an alert fingerprint holds a control character (%r): its labels' used", bad.group())
            return ""
        return value


class WebhookPayload(RequestBody):
    """Alertmanager's webhook body (version 4)."""

    model_config = ConfigDict(extra="ignore")

    version: str = "4"
    status: Literal["firing", "resolved"]
    receiver: str = ""
    groupKey: str = ""
    alerts: list[WebhookAlert] = Field(min_length=1)


@dataclass(frozen=True)
class AlertChange:
    alert_id: int
    name: str
    status: str
    changed: bool  # True when the status is new: notifications were queued


def fingerprint_of(labels: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]


def record_alert(
    session: Session,
    *,
    labels: dict[str, str],
    status: str,
    now: float,
    channels: Sequence[str],
    source: str,
    annotations: dict[str, str] | None = None,
    starts_at: float | None = None,
    ends_at: float | None = None,
    fingerprint: str | None = None,
    generator_url: str = "",
) -> AlertChange:
    """Insert or update the alert with this fingerprint. Repeats of the same status only bump
    counters; a stale `resolved` for an older episode than the stored one is ignored.

    Two deliveries of one change at once (an Alertmanager HA pair sends both; two servers behind
    one address, or a check and a webhook) make one change: the insert and the status change are
    compare-and-set, so only one of them notifies and runs the remediation rules."""
    fingerprint = fingerprint or fingerprint_of(labels)
    starts = starts_at if starts_at is not None else now
    alert = session.scalars(select(Alert).where(Alert.fingerprint == fingerprint)).one_or_none()
    if alert is None:
        alert = Alert(
            fingerprint=fingerprint, source=source, name=labels.get("alertname", "unnamed"), status=status,
            severity=labels.get("severity", "warning"), labels=labels, annotations=annotations or {},
            starts_at=starts, ends_at=ends_at if status == "resolved" else None, first_received_at=now,
            last_received_at=now, receive_count=1, generator_url=generator_url,
        )  # fmt: skip
        try:
            with session.begin_nested():
                session.add(alert)
        except IntegrityError:  # the same alert inserted by another delivery meanwhile: update it
            alert = session.scalars(select(Alert).where(Alert.fingerprint == fingerprint)).one()
        else:
            _queue_notifications(session, alert, channels, now)
            _remediate(session, alert, now)
            return AlertChange(alert.id, alert.name, status, True)
    alert.last_received_at = now
    alert.receive_count += 1
    stale = status == "resolved" and starts_at is not None and starts_at < alert.starts_at - 1e-3
    if status == alert.status or stale or not _status_moved(session, alert, status):
        if annotations and not stale:
            alert.annotations = annotations
        return AlertChange(alert.id, alert.name, alert.status, False)
    alert.status = status
    alert.labels = labels
    if annotations:
        alert.annotations = annotations
    if status == "firing":
        alert.starts_at = starts
        alert.ends_at = None
    else:
        alert.ends_at = ends_at if ends_at is not None else now
    _queue_notifications(session, alert, channels, now)
    _remediate(session, alert, now)
    return AlertChange(alert.id, alert.name, status, True)


def _status_moved(session: Session, alert: Alert, status: str) -> bool:
    """Move the stored status from the one this delivery read to `status`; False (and `alert`
    read again) when another delivery changed it meanwhile: this one is then a repeat of it."""
    moved = session.execute(
        update(Alert)
        .where(Alert.id == alert.id, Alert.status == alert.status)
        .values(status=status)
        .execution_options(synchronize_session=False)
    )
    if moved.rowcount == 1:  # type: ignore[attr-defined]
        return True
    session.refresh(alert)
    return False


def _remediate(session: Session, alert: Alert, now: float) -> None:
    """Each change of an alert's status goes through the remediation rules (incidents, actions)
    in the transaction that records it: an alert is never stored without its remedy."""
    summary = str((alert.annotations or {}).get("summary", ""))
    signal = remediation.Signal(
        name=alert.name, labels={str(k): str(v) for k, v in (alert.labels or {}).items()},
        status=alert.status, source=alert.source, fingerprint=alert.fingerprint, summary=summary,
    )  # fmt: skip
    remediation.on_signal(session, signal, now)


def _queue_notifications(session: Session, alert: Alert, channels: Sequence[str], now: float) -> None:
    for channel in channels:
        session.add(
            AlertNotification(
                alert_id=alert.id, channel=channel, alert_status=alert.status, state="pending", attempts=0,
                next_attempt_at=now, last_error="", created_at=now,
            )
        )  # fmt: skip


def ingest_webhook(
    session: Session, payload: WebhookPayload, now: float, channels: Sequence[str]
) -> list[AlertChange]:
    """Store every alert of one Alertmanager delivery (the caller commits once: all or nothing)."""
    changes = []
    for item in payload.alerts:
        changes.append(
            record_alert(
                session, labels=item.labels, status=item.status, now=now, channels=channels,
                source="alertmanager", annotations=item.annotations, starts_at=parse_time(item.startsAt),
                ends_at=parse_time(item.endsAt), fingerprint=item.fingerprint or None,
                generator_url=item.generatorURL,
            )
        )  # fmt: skip
    return changes


def alert_to_dict(alert: Alert) -> dict[str, Any]:
    return {
        "id": alert.id,
        "fingerprint": alert.fingerprint,
        "name": alert.name,
        "status": alert.status,
        "severity": alert.severity,
        "source": alert.source,
        "labels": alert.labels,
        "annotations": alert.annotations,
        "starts_at": alert.starts_at,
        "ends_at": alert.ends_at,
        "first_received_at": alert.first_received_at,
        "last_received_at": alert.last_received_at,
        "receive_count": alert.receive_count,
        "generator_url": alert.generator_url,
    }


def _label(key: str) -> ColumnElement[str]:
    """An alert label as SQL text; a missing or empty label reads as ''."""
    return func.coalesce(Alert.labels[key].as_string(), "")


def alert_visibility(principal: Principal) -> ColumnElement[bool] | None:
    """SQL condition for the alerts `principal` may list; None = all (admin).

    An alert about a job (label `job_id` naming an existing job) is seen by whoever may see the
    job: its owner, the admins of its group, admins. An alert that names a user or group but no
    known job is seen by that user and the admins of that group. An alert that names no job, user
    or group (a node, a GPU without a job, the server itself) concerns the whole cluster: every
    logged-in member sees it.
    """
    if principal.is_admin:
        return None
    job_id, user, group = _label("job_id"), _label("user"), _label("group")
    job_of_alert = cast(Job.id, String) == job_id
    visible_job = select(Job.id).where(job_of_alert)
    jobs_seen = visibility(principal)
    if jobs_seen is not None:
        visible_job = visible_job.where(jobs_seen)
    administered = select(Group.id).where(Group.name == group, Group.id.in_(principal.admin_group_ids))
    names_them = or_(and_(user != "", user == principal.name), administered.exists())
    return or_(
        and_(job_id == "", user == "", group == ""),  # cluster-wide
        visible_job.exists(),
        and_(~select(Job.id).where(job_of_alert).exists(), names_them),
    )


def list_alerts(
    session: Session,
    principal: Principal,
    *,
    status: str | None = None,
    name: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[Alert], int]:
    """The alerts `principal` may see (alert_visibility), newest first, and how many in all."""
    stmt = select(Alert)
    seen = alert_visibility(principal)
    if seen is not None:
        stmt = stmt.where(seen)
    if status:
        stmt = stmt.where(Alert.status == status)
    if name:
        stmt = stmt.where(Alert.name == name)
    total = int(session.scalar(select(func.count()).select_from(stmt.subquery())) or 0)
    rows = session.scalars(
        stmt.order_by(Alert.last_received_at.desc(), Alert.id.desc()).limit(limit).offset(offset)
    )
    return list(rows), total
