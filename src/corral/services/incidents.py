"""Incidents: one record per fault, however many alerts and repeats it produced.

Alerts and platform events reach here through the remediation rules (corral.services.remediation),
whose `incident` action calls `open_or_update` with a grouping key (`fingerprint`): a repeat joins
the open incident, and a fault that comes back within `FlapPolicy.reopen_window_s` of its incident
resolving reopens that incident instead of opening a new one (a flapping GPU is one incident).
Whether a reopen makes the incident *flapping*, and when that ends, is
corral.services.incident_flapping's (docs/operations.md, "Flapping"); it ends at the latest when
the incident is closed. The reopened listeners hear whether a reopen is plain, begins the flapping
or happens while it lasts (`Reopen`), so paging can page once.

States move by compare-and-set, like jobs' (services.lifecycle): triggered -> acknowledged ->
mitigated -> resolved -> closed, where resolved may go back to triggered (it fired again) and
closing a SEV1 or SEV2 incident requires its postmortem. Every change adds a timeline line.

Entry points for other areas (the paging engine, at merge): `open_or_update`, `acknowledge`,
`add_timeline`; listeners registered with `on_opened` hear of each new incident, and those
registered with `on_acknowledged` / `on_resolved` / `on_reopened` (and
incident_flapping.on_flapping_ended) of each first acknowledgement, resolution, reopen and end of
flapping, in the same transaction (corral.services.incident_paging pages and un-pages with them).
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from sqlalchemy import false, func, select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from corral.db.incident_models import Incident, IncidentEvent, Postmortem
from corral.db.models import User
from corral.services import incident_flapping as flapping
from corral.services.errors import Conflict, Invalid, NotFound
from corral.services.incident_flapping import DEFAULT_FLAP, FlapPolicy, Reopen


class Severity(StrEnum):
    SEV1 = "SEV1"  # worst: a cluster-wide outage
    SEV2 = "SEV2"
    SEV3 = "SEV3"
    SEV4 = "SEV4"


class IncidentState(StrEnum):
    TRIGGERED = "triggered"
    ACKNOWLEDGED = "acknowledged"
    MITIGATED = "mitigated"
    RESOLVED = "resolved"
    CLOSED = "closed"


_S = IncidentState
TRANSITIONS: dict[IncidentState, frozenset[IncidentState]] = {
    _S.TRIGGERED: frozenset({_S.ACKNOWLEDGED, _S.MITIGATED, _S.RESOLVED}),
    _S.ACKNOWLEDGED: frozenset({_S.MITIGATED, _S.RESOLVED}),
    _S.MITIGATED: frozenset({_S.RESOLVED, _S.TRIGGERED}),
    _S.RESOLVED: frozenset({_S.TRIGGERED, _S.CLOSED}),
    _S.CLOSED: frozenset(),
}
OPEN_STATES = (_S.TRIGGERED.value, _S.ACKNOWLEDGED.value, _S.MITIGATED.value)


# Time to acknowledge and time to mitigate, per severity (seconds).
SLA_S: dict[Severity, tuple[float, float]] = {
    Severity.SEV1: (5 * 60.0, 60 * 60.0),
    Severity.SEV2: (15 * 60.0, 4 * 3600.0),
    Severity.SEV3: (60 * 60.0, 24 * 3600.0),
    Severity.SEV4: (4 * 3600.0, 72 * 3600.0),
}
NEEDS_POSTMORTEM = frozenset({Severity.SEV1, Severity.SEV2})
LINK_KINDS = ("nodes", "gpus", "jobs", "groups")
TITLE_MAX = 512

OpenedListener = Callable[[Session, Incident], None]
_OPENED_LISTENERS: list[OpenedListener] = []
ChangeListener = Callable[[Session, Incident, str], None]  # (session, incident, by)
_ACKED_LISTENERS: list[ChangeListener] = []
_RESOLVED_LISTENERS: list[ChangeListener] = []
ReopenedListener = Callable[[Session, Incident, Reopen], None]
_REOPENED_LISTENERS: list[ReopenedListener] = []


def on_opened(listener: OpenedListener) -> None:
    """Call `listener(session, incident)` for every new incident, in its opening transaction."""
    _OPENED_LISTENERS.append(listener)


def on_acknowledged(listener: ChangeListener) -> None:
    """Call `listener(session, incident, by)` when an incident is first acknowledged."""
    _ACKED_LISTENERS.append(listener)


def on_resolved(listener: ChangeListener) -> None:
    """Call `listener(session, incident, by)` when an incident resolves (by hand or its alerts)."""
    _RESOLVED_LISTENERS.append(listener)


def on_reopened(listener: ReopenedListener) -> None:
    """Call `listener(session, incident, reopen)` when a resolved incident fires again within
    the reopen window and goes back to triggered (`reopen`: who fired it, and its flapping news)."""
    _REOPENED_LISTENERS.append(listener)


def _tell(listeners: list[ChangeListener], session: Session, incident: Incident, by: str) -> None:
    for listener in list(listeners):
        listener(session, incident, by)


def severity_of(value: str) -> Severity:
    try:
        return Severity(value.upper())
    except ValueError:
        raise Invalid(f"unknown severity {value!r}: use SEV1, SEV2, SEV3 or SEV4", ("body", "severity"))


def _move(
    session: Session, incident: Incident, target: IncidentState, now: float, values: Mapping[str, Any]
) -> bool:
    """Compare-and-set of the incident's state: False when another writer moved it first."""
    current = IncidentState(incident.state)
    if target not in TRANSITIONS[current]:
        raise Conflict(f"incident {incident.id} is {current.value}; it cannot become {target.value}")
    columns = {"state": target.value, "updated_at": now, **values}
    stmt = update(Incident).where(Incident.id == incident.id, Incident.state == current.value).values(columns)
    won = session.connection().execute(stmt).rowcount == 1
    if won:
        for name, value in columns.items():
            set_committed_value(incident, name, value)
    else:
        session.expire(incident)
    return won


def add_timeline(
    session: Session,
    incident_id: int,
    kind: str,
    text: str,
    data: Mapping[str, Any] | None = None,
    *,
    actor: str = "",
    now: float,
) -> None:
    session.add(
        IncidentEvent(
            incident_id=incident_id, at=now, kind=kind, actor=actor, text=text, data=dict(data or {})
        )
    )


def _merge_links(old: Mapping[str, Any], new: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    merged = {k: list(old.get(k, [])) for k in LINK_KINDS}
    for kind, values in new.items():
        if kind not in merged:
            raise ValueError(f"unknown link kind {kind!r}: one of {', '.join(LINK_KINDS)}")
        merged[kind] += [str(v) for v in values if str(v) not in merged[kind]]
    return merged


def _lock_fingerprint(session: Session, fingerprint: str, *, wait: bool = True) -> bool:
    """Hold, to the end of the transaction, a lock on the grouping key before looking for its
    incident. Without it two transactions for one fault at once (the GPU sampling loop's ECC alert
    and the diagnosis watch's event, on two servers of one PostgreSQL) each found none and each
    opened one. PostgreSQL: an advisory lock per key; SQLite: the database's write lock, taken by
    an UPDATE that changes no row (it then lets one writer at a time through anyway).
    `wait=False`: on PostgreSQL, False at once when another transaction holds the key."""
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        digest = hashlib.sha256(f"corral-incident:{fingerprint}".encode()).digest()
        key = int.from_bytes(digest[:8], "big", signed=True)
        if not wait:
            return bool(connection.execute(select(func.pg_try_advisory_xact_lock(key))).scalar())
        connection.execute(select(func.pg_advisory_xact_lock(key)))
    else:
        connection.execute(update(Incident).where(false()).values(fingerprint=Incident.fingerprint))
    return True


def _current(session: Session, fingerprint: str) -> Incident | None:
    return session.scalars(
        select(Incident)
        .where(Incident.fingerprint == fingerprint, Incident.state != _S.CLOSED.value)
        .order_by(Incident.id.desc())
        .limit(1)
    ).one_or_none()


def open_or_update(
    session: Session,
    *,
    fingerprint: str,
    title: str,
    severity: Severity | str,
    source: str,
    labels: Mapping[str, str],
    links: Mapping[str, Sequence[str]],
    now: float,
    alert: str = "",
    why: str = "",
    flap: FlapPolicy = DEFAULT_FLAP,
) -> Incident:
    """The incident of this fault: the open one with `fingerprint`, one that resolved less than
    `flap.reopen_window_s` ago (reopened), or a new one. `alert`: the fingerprint of the firing
    alert it came from (resolving that alert may resolve the incident; '' for an event)."""
    sev = severity if isinstance(severity, Severity) else severity_of(severity)
    fingerprint = fingerprint[:255]  # as stored (the column's size): a longer key must still match
    _lock_fingerprint(session, fingerprint)
    incident = _current(session, fingerprint)
    reopened: Reopen | None = None
    if incident is not None and incident.state == _S.RESOLVED.value:
        flapping.end_if_quiet(session, incident, now, flap)  # before the reopen clears resolved_at
        if now - (incident.resolved_at or now) > flap.reopen_window_s:
            incident = None  # long over: this is a new fault
        elif _move(session, incident, _S.TRIGGERED, now, {"resolved_at": None}):
            add_timeline(session, incident.id, "reopened", f"fired again: {why or title}", now=now)
            news, text = flapping.after_reopen(session, incident, now, flap)
            reopened = Reopen(source, news, text, flap.quiet_s)
        else:
            incident = _current(session, fingerprint)
    if incident is None:
        return _open(session, fingerprint, title, sev, source, labels, links, now, alert, why)
    incident.fire_count += 1
    incident.last_fired_at = incident.updated_at = now
    incident.links = _merge_links(incident.links or {}, links)
    if alert and alert not in (incident.firing or []):
        incident.firing = [*(incident.firing or []), alert]
    raise_severity(session, incident, sev, why, now)
    add_timeline(session, incident.id, "fired", why or title, {"alert": alert} if alert else None, now=now)
    if reopened is not None:  # after the links and severity are merged: a page names what fires now
        for listener in list(_REOPENED_LISTENERS):
            listener(session, incident, reopened)
    return incident


def raise_severity(
    session: Session, incident: Incident, severity: Severity | str, why: str, now: float
) -> bool:
    """Raise `incident` to `severity` if that is more severe (SEV1 over SEV2 ...), with a timeline
    line saying so; never lowers it (a less severe signal of the same fault changes nothing)."""
    sev = severity if isinstance(severity, Severity) else severity_of(severity)
    if _rank(sev) >= _rank(Severity(incident.severity)):
        return False
    add_timeline(session, incident.id, "severity", f"raised {incident.severity} -> {sev}: {why}", now=now)
    incident.severity = sev.value
    return True


# -- flapping: the loop's pass (the rest is corral.services.incident_flapping) -----------------------


def end_quiet_flapping(session: Session, now: float, flap: FlapPolicy = DEFAULT_FLAP) -> list[int]:
    """The incidents loop's pass: end the flapping of every incident quiet for `flap.quiet_s`
    (each under its grouping key's lock, so a reopen at the same time is counted first). The
    keys are locked in one order (by key) and never waited for: a key another transaction holds
    (a remediation opening two incidents, say) is skipped until the next pass, so this pass can
    neither deadlock with one nor stall behind it. Reads only the flapping incidents (a partial
    index, ix_incidents_flapping). Returns the ids; commits nothing. Here, not in incident_flapping,
    because the grouping key's lock is this module's."""
    ended = []
    flapping_now = (
        select(Incident.id, Incident.fingerprint)
        .where(Incident.flapping_since.is_not(None))
        .order_by(Incident.fingerprint, Incident.id)
    )
    for incident_id, fingerprint in session.execute(flapping_now).all():
        if not _lock_fingerprint(session, fingerprint, wait=False):
            continue
        incident = session.get(Incident, incident_id, populate_existing=True)
        if incident is not None and flapping.end_if_quiet(session, incident, now, flap):
            ended.append(incident_id)
    return ended


def _open(
    session: Session,
    fingerprint: str,
    title: str,
    sev: Severity,
    source: str,
    labels: Mapping[str, str],
    links: Mapping[str, Sequence[str]],
    now: float,
    alert: str,
    why: str,
) -> Incident:
    incident = Incident(
        fingerprint=fingerprint[:255], title=title[:TITLE_MAX], severity=sev.value,
        state=_S.TRIGGERED.value, source=source[:64], owner="", labels=dict(labels),
        links=_merge_links({}, links), firing=[alert] if alert else [], fire_count=1, opened_at=now,
        last_fired_at=now, updated_at=now, acknowledged_by="", ack_breached=False, mitigate_breached=False,
    )  # fmt: skip
    session.add(incident)
    session.flush()
    add_timeline(session, incident.id, "opened", f"{sev.value} opened by {source}: {why or title}", now=now)
    for listener in _OPENED_LISTENERS:
        listener(session, incident)
    return incident


def _rank(sev: Severity) -> int:
    return int(sev.value[3:])


def alert_resolved(session: Session, alert: str, now: float, why: str = "") -> list[Incident]:
    """The alert with fingerprint `alert` resolved: incidents it fired that have no other firing
    alert resolve by themselves (the fault cleared)."""
    done = []
    for incident in session.scalars(select(Incident).where(Incident.state.in_(OPEN_STATES))):
        if alert not in (incident.firing or []):
            continue
        incident.firing = [a for a in incident.firing if a != alert]
        add_timeline(
            session, incident.id, "alert_resolved", why or "an alert resolved", {"alert": alert}, now=now
        )
        if not incident.firing and _move(session, incident, _S.RESOLVED, now, {"resolved_at": now}):
            add_timeline(session, incident.id, "resolved", "every alert of the incident resolved", now=now)
            _tell(_RESOLVED_LISTENERS, session, incident, "corral")
            done.append(incident)
    return done


def get(session: Session, incident_id: int) -> Incident:
    incident = session.get(Incident, incident_id)
    if incident is None:
        raise NotFound(f"no incident {incident_id}")
    return incident


def acknowledge(session: Session, incident_id: int, by: str, now: float) -> Incident:
    """Someone owns it now: stops escalation. Acknowledging one already acknowledged (or past
    that) only records who, when nobody had."""
    incident = get(session, incident_id)
    if incident.state == _S.CLOSED.value:
        raise Conflict(f"incident {incident_id} is closed")
    values = {"acknowledged_at": now, "acknowledged_by": by, "owner": incident.owner or by}
    if incident.state == _S.TRIGGERED.value and _move(session, incident, _S.ACKNOWLEDGED, now, values):
        add_timeline(session, incident.id, "acknowledged", f"acknowledged by {by}", actor=by, now=now)
    elif incident.acknowledged_at is None:
        for name, value in values.items():
            setattr(incident, name, value)
        add_timeline(session, incident.id, "acknowledged", f"acknowledged by {by}", actor=by, now=now)
    else:
        return incident  # acknowledged before: the listeners heard of it then
    _tell(_ACKED_LISTENERS, session, incident, by)
    return incident


def mitigate(session: Session, incident_id: int, by: str, now: float, note: str = "") -> Incident:
    incident, _ = _settle(session, incident_id, _S.MITIGATED, by, now, note)
    return incident


def resolve(session: Session, incident_id: int, by: str, now: float, note: str = "") -> Incident:
    incident, moved = _settle(session, incident_id, _S.RESOLVED, by, now, note)
    if moved:
        _tell(_RESOLVED_LISTENERS, session, incident, by)
    return incident


def _settle(
    session: Session, incident_id: int, state: IncidentState, by: str, now: float, note: str
) -> tuple[Incident, bool]:
    """Move to MITIGATED or RESOLVED, stamping `<state>_at`, with its timeline entry; (incident,
    False) when it is there already."""
    incident = get(session, incident_id)
    if incident.state == state.value:
        return incident, False
    if not _move(session, incident, state, now, {f"{state.value}_at": now}):
        raise Conflict(f"incident {incident_id} changed meanwhile (now {incident.state}); try again")
    add_timeline(session, incident.id, state.value, note or f"{state.value} by {by}", actor=by, now=now)
    return incident, True


def close(session: Session, incident_id: int, by: str, now: float) -> Incident:
    """Resolved -> closed; a SEV1 or SEV2 incident needs its postmortem first."""
    incident = get(session, incident_id)
    if incident.state == _S.CLOSED.value:
        raise Conflict(f"incident {incident_id} is already closed")
    if Severity(incident.severity) in NEEDS_POSTMORTEM and session.get(Postmortem, incident_id) is None:
        raise Conflict(
            f"incident {incident_id} is {incident.severity}: write its postmortem before closing it "
            f"(corral incident postmortem {incident_id} ...)"
        )
    if incident.state != _S.RESOLVED.value:
        raise Conflict(f"incident {incident_id} is {incident.state}; resolve it before closing it")
    if not _move(session, incident, _S.CLOSED, now, {"closed_at": now}):
        raise Conflict(f"incident {incident_id} changed meanwhile (now {incident.state}); try again")
    add_timeline(session, incident.id, "closed", f"closed by {by}", actor=by, now=now)
    flapping.end(session, incident, now, f"stopped flapping: closed by {by}", by)  # its page goes too
    return incident


def comment(session: Session, incident_id: int, by: str, text: str, now: float) -> Incident:
    incident = get(session, incident_id)
    add_timeline(session, incident.id, "comment", text, actor=by, now=now)
    incident.updated_at = now
    return incident


def edit(
    session: Session, incident_id: int, by: str, now: float, *, severity: str | None, owner: str | None
) -> Incident:
    """An operator's correction of the severity or the owner."""
    incident = get(session, incident_id)
    if owner and owner != incident.owner:  # "" clears it; checked before anything changes
        _check_owner(session, owner)
    if severity is not None and severity_of(severity).value != incident.severity:
        sev = severity_of(severity).value
        add_timeline(
            session, incident.id, "severity", f"{incident.severity} -> {sev} by {by}", actor=by, now=now
        )
        incident.severity = sev
    if owner is not None and owner != incident.owner:
        add_timeline(
            session, incident.id, "owner", f"owner {owner or '(none)'} set by {by}", actor=by, now=now
        )
        incident.owner = owner
    incident.updated_at = now
    return incident


def _check_owner(
    session: Session, name: str, what: str = "owner", loc: tuple[str, ...] = ("body", "owner")
) -> None:
    """An owner is someone who can work on the incident (or an action item): an active user of the
    platform."""
    user = session.scalar(select(User).where(User.name == name))
    if user is None:
        clear = ', or "" to clear it' if what == "owner" else ""
        raise Invalid(f"{what}: no user named {name!r} (give a user's name{clear})", loc)
    if not user.active:
        raise Invalid(f"{what}: user {name!r} is deactivated", loc)


def write_postmortem(
    session: Session,
    incident_id: int,
    by: str,
    now: float,
    *,
    summary: str,
    impact: str,
    root_cause: str,
    action_items: Sequence[Mapping[str, str]],
) -> Postmortem:
    """Store (or replace) the incident's postmortem. Each action item: what, owner, due (YYYY-MM-DD)."""
    incident = get(session, incident_id)
    for name, value in (("summary", summary), ("impact", impact), ("root_cause", root_cause)):
        if not value.strip():
            raise Invalid(f"the postmortem's {name} is empty", ("body", name))
    items = [_action_item(i, item) for i, item in enumerate(action_items)]
    for i, item in enumerate(items):
        loc = ("body", "action_items", str(i), "owner")
        _check_owner(session, item["owner"], f"action item {i + 1}'s owner", loc)
    row = session.get(Postmortem, incident_id)
    if row is None:
        row = Postmortem(incident_id=incident_id)
        session.add(row)
    row.summary, row.impact, row.root_cause, row.action_items = summary, impact, root_cause, items
    row.author, row.written_at = by, now
    add_timeline(session, incident.id, "postmortem", f"postmortem written by {by}", actor=by, now=now)
    return row


def _action_item(i: int, item: Mapping[str, str]) -> dict[str, str]:
    what, owner, due = (str(item.get(k, "")).strip() for k in ("what", "owner", "due"))
    if not what or not owner:
        raise Invalid(f"action item {i + 1} needs 'what' and 'owner'", ("body", "action_items", str(i)))
    try:
        dt.date.fromisoformat(due)
    except ValueError:
        raise Invalid(
            f"action item {i + 1}: due {due!r} is not a date (YYYY-MM-DD)", ("body", "action_items")
        )
    return {"what": what, "owner": owner, "due": due}


# -- reading -------------------------------------------------------------------------------------


def _mitigated_at(incident: Incident) -> float | None:
    """When the incident stopped hurting: mitigated, or resolved (or closed) without a mitigation."""
    if incident.mitigated_at is not None:
        return incident.mitigated_at
    if incident.state in (_S.RESOLVED.value, _S.CLOSED.value):
        return incident.resolved_at or incident.updated_at
    return None


def sla_view(incident: Incident, now: float) -> dict[str, Any]:
    """Due times and countdowns (negative: overdue) for acknowledging and mitigating."""
    ack_s, mitigate_s = SLA_S[Severity(incident.severity)]
    ack_due, mitigate_due = incident.opened_at + ack_s, incident.opened_at + mitigate_s
    acked = incident.acknowledged_at is not None
    mitigated_at = _mitigated_at(incident)
    mitigated = mitigated_at is not None
    return {
        "ack_due_at": ack_due,
        "ack_remaining_s": None if acked else round(ack_due - now, 1),
        # late is late, whether or not the loop's pass saw it before the acknowledgement
        "ack_breached": incident.ack_breached or (incident.acknowledged_at or now) > ack_due,
        "mitigate_due_at": mitigate_due,
        "mitigate_remaining_s": None if mitigated else round(mitigate_due - now, 1),
        "mitigate_breached": incident.mitigate_breached or (mitigated_at or now) > mitigate_due,
    }


def view(incident: Incident, now: float) -> dict[str, Any]:
    return {
        "id": incident.id,
        "fingerprint": incident.fingerprint,
        "title": incident.title,
        "severity": incident.severity,
        "state": incident.state,
        "source": incident.source,
        "owner": incident.owner,
        "labels": incident.labels,
        "links": incident.links,
        "firing_alerts": len(incident.firing or []),
        "fire_count": incident.fire_count,
        "opened_at": incident.opened_at,
        "last_fired_at": incident.last_fired_at,
        "acknowledged_at": incident.acknowledged_at,
        "acknowledged_by": incident.acknowledged_by,
        "mitigated_at": incident.mitigated_at,
        "resolved_at": incident.resolved_at,
        "closed_at": incident.closed_at,
        "flapping": incident.flapping_since is not None,
        "flapping_since": incident.flapping_since,
        "sla": sla_view(incident, now),
    }


def detail(session: Session, incident_id: int, now: float) -> dict[str, Any]:
    incident = get(session, incident_id)
    events = session.scalars(
        select(IncidentEvent).where(IncidentEvent.incident_id == incident_id).order_by(IncidentEvent.id)
    )
    pm = session.get(Postmortem, incident_id)
    return {
        **view(incident, now),
        "timeline": [
            {"at": e.at, "kind": e.kind, "actor": e.actor, "text": e.text, "data": e.data} for e in events
        ],
        "postmortem": None if pm is None else postmortem_view(pm),
        "postmortem_required": Severity(incident.severity) in NEEDS_POSTMORTEM,
    }


def postmortem_view(pm: Postmortem) -> dict[str, Any]:
    return {
        "summary": pm.summary,
        "impact": pm.impact,
        "root_cause": pm.root_cause,
        "action_items": pm.action_items,
        "author": pm.author,
        "written_at": pm.written_at,
    }


def list_incidents(
    session: Session,
    *,
    state: str | None = None,
    severity: str | None = None,
    node: str | None = None,
    open_only: bool = False,
    flapping: bool | None = None,
    limit: int = 100,
    offset: int = 0,
) -> tuple[list[Incident], int]:
    """Incidents, newest first, filtered; `flapping`: True only flapping ones, False only the
    others, None both."""
    stmt = select(Incident)
    if state:
        stmt = stmt.where(Incident.state == state)
    if open_only:
        stmt = stmt.where(Incident.state.in_(OPEN_STATES))
    if flapping is not None:
        since = Incident.flapping_since
        stmt = stmt.where(since.is_not(None) if flapping else since.is_(None))
    if severity:
        stmt = stmt.where(Incident.severity == severity_of(severity).value)
    stmt = stmt.order_by(Incident.id.desc())
    if node:  # links are JSON: filtered here, portably (SQLite and PostgreSQL)
        rows = [r for r in session.scalars(stmt) if node in (r.links or {}).get("nodes", [])]
        return rows[offset : offset + limit], len(rows)
    total = int(session.scalar(select(func.count()).select_from(stmt.subquery())) or 0)
    return list(session.scalars(stmt.limit(limit).offset(offset))), total


def check_slas(session: Session, now: float) -> list[tuple[int, str]]:
    """Mark (once) and note on the timeline the open incidents past an SLA; returns (id, which)."""
    breaches = []
    for incident in session.scalars(select(Incident).where(Incident.state.in_(OPEN_STATES))):
        sla = sla_view(incident, now)
        if sla["ack_breached"] and not incident.ack_breached:
            incident.ack_breached = True
            breaches.append((incident.id, "ack"))
            add_timeline(session, incident.id, "sla_breached", "not acknowledged within its SLA", now=now)
        if sla["mitigate_breached"] and not incident.mitigate_breached:
            incident.mitigate_breached = True
            breaches.append((incident.id, "mitigate"))
            add_timeline(session, incident.id, "sla_breached", "not mitigated within its SLA", now=now)
    return breaches


Counts = dict[tuple[str, str], int]


def open_counts(session: Session, now: float) -> tuple[Counts, Counts]:
    """For /metrics: open incidents by (severity, state), and those past an SLA by (severity, sla)."""
    by_state: dict[tuple[str, str], int] = {}
    breached: dict[tuple[str, str], int] = {}
    for incident in session.scalars(select(Incident).where(Incident.state.in_(OPEN_STATES))):
        key = (incident.severity, incident.state)
        by_state[key] = by_state.get(key, 0) + 1
        sla = sla_view(incident, now)
        for which in ("ack", "mitigate"):
            if sla[f"{which}_breached"]:
                breached[(incident.severity, which)] = breached.get((incident.severity, which), 0) + 1
    return by_state, breached
