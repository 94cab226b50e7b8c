"""Flapping incidents: an incident that keeps resolving and firing again (FlapPolicy).

corral.services.incidents reopens an incident that fires again within `FlapPolicy.reopen_window_s`
of resolving, and asks this module what each reopen means (`after_reopen`): the `reopens`-th
within `within_s` makes it *flapping* (`flapping_since`, a compare-and-set), with a timeline line.
It is flapping until it has neither reopened nor resolved for `quiet_s` (`end_if_quiet`: the
incidents loop's pass, and each reopen first), or until it is closed (`end`). Only reopens since
its last flapping ended count towards the next. The flapping-ended listeners (`on_flapping_ended`)
hear of each end in its transaction; corral.services.incident_paging pages, or un-pages, with them.

Below corral.services.incidents (it imports this module, never the other way round): the grouping
key's lock and the state machine stay there, and the timeline lines are written here directly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from corral.db.incident_models import Incident, IncidentEvent
from corral.domain import span_text

# A fault that fires again within this long after its incident resolved reopens that incident
# (the default of the rules file's `incidents.reopen_window`, FlapPolicy.reopen_window_s).
FLAP_WINDOW_S = 15 * 60.0


@dataclass(frozen=True)
class FlapPolicy:
    """When reopens count as flapping. Defaults: the 3rd reopen within an hour (one reopen is a
    fix that did not hold, two may be chance; three in an hour means the fault comes and goes at
    least every 20 minutes), over after 30 minutes with no reopen and no resolve (twice the
    reopen window: a fault that stays put, firing or resolved, for that long has settled)."""

    reopen_window_s: float = FLAP_WINDOW_S  # fires again within this long after resolving: reopens
    reopens: int = 3  # this many reopens ...
    within_s: float = 3600.0  # ... within this long: flapping
    quiet_s: float = 1800.0  # no reopen and no resolve for this long: flapping ends


DEFAULT_FLAP = FlapPolicy()


class FlapNews(StrEnum):
    """What a reopen means for flapping."""

    NONE = "none"  # not flapping
    STARTED = "started"  # this reopen made it flapping
    ONGOING = "ongoing"  # it was flapping already


@dataclass(frozen=True)
class Reopen:
    """A reopen, as corral.services.incidents' reopened listeners hear of it."""

    by: str  # the source that fired it
    flap: FlapNews
    text: str  # when STARTED: "flapping: reopened 3 times in 40 min"
    quiet_s: float  # how long without a reopen or resolve ends the flapping


EndedListener = Callable[[Session, Incident, str], None]  # (session, incident, by)
_ENDED_LISTENERS: list[EndedListener] = []


def on_flapping_ended(listener: EndedListener) -> None:
    """Call `listener(session, incident, by)` when an incident's flapping ends: quiet for its
    period (by "corral"), or closed (by whoever closed it)."""
    _ENDED_LISTENERS.append(listener)


def _note(
    session: Session, incident: Incident, kind: str, text: str, data: Mapping[str, Any], now: float
) -> None:
    """A line on the incident's timeline (as incidents.add_timeline writes them)."""
    event = IncidentEvent(incident_id=incident.id, at=now, kind=kind, actor="", text=text, data=dict(data))
    session.add(event)


def _set_flapping(
    session: Session, incident: Incident, expected: float | None, value: float | None, now: float
) -> bool:
    """Compare-and-set of `flapping_since` (stamping `updated_at`): False when another writer
    changed it first."""
    stmt = (
        update(Incident)
        .where(Incident.id == incident.id)
        .where(Incident.flapping_since.is_(None) if expected is None else Incident.flapping_since == expected)
        .values(flapping_since=value, updated_at=now)
    )
    won = session.connection().execute(stmt).rowcount == 1
    if won:
        set_committed_value(incident, "flapping_since", value)
        set_committed_value(incident, "updated_at", now)
    return won


def _event_times(session: Session, incident_id: int, kind: str, since: float) -> list[float]:
    return list(
        session.scalars(
            select(IncidentEvent.at)
            .where(
                IncidentEvent.incident_id == incident_id,
                IncidentEvent.kind == kind,
                IncidentEvent.at >= since,
            )
            .order_by(IncidentEvent.at)
        )
    )


def after_reopen(session: Session, incident: Incident, now: float, flap: FlapPolicy) -> tuple[FlapNews, str]:
    """Count this reopen (its `reopened` timeline line already added): the `flap.reopens`-th within
    `flap.within_s` (counting only reopens since its last flapping ended) makes the incident
    flapping, with a timeline line. Returns the news and, when STARTED, that line's text."""
    if incident.flapping_since is not None:
        return FlapNews.ONGOING, ""
    session.flush()  # the reopen's own timeline line counts
    ended = _event_times(session, incident.id, "flapping_ended", now - flap.within_s)
    since = max([now - flap.within_s, *ended])
    reopens = [at for at in _event_times(session, incident.id, "reopened", since) if at <= now]
    if len(reopens) < flap.reopens or not _set_flapping(session, incident, None, now, now):
        return FlapNews.NONE, ""
    text = f"flapping: reopened {len(reopens)} times in {span_text(now - reopens[0])}"
    data = {"reopens": len(reopens), "span_s": round(now - reopens[0], 1), "quiet_s": flap.quiet_s}
    _note(session, incident, "flapping", text, data, now)
    return FlapNews.STARTED, text


def _last_flip(session: Session, incident: Incident) -> float:
    """When the incident last began flapping, reopened or resolved: its quiet period runs from it."""
    since = incident.flapping_since or 0.0
    reopens = _event_times(session, incident.id, "reopened", since)
    return max([since, *reopens, incident.resolved_at or 0.0])


def end_if_quiet(session: Session, incident: Incident, now: float, flap: FlapPolicy) -> bool:
    """End the incident's flapping when it has neither reopened nor resolved for `flap.quiet_s`;
    the timeline says how it stayed (resolved, or open). The caller holds its grouping key."""
    if incident.flapping_since is None:
        return False
    quiet = now - _last_flip(session, incident)
    if quiet < flap.quiet_s:
        return False
    # resolved_at is set while it is resolved or closed; a reopen clears it
    stayed = "resolved" if incident.resolved_at is not None else "open (firing)"
    text = f"stopped flapping: stayed {stayed} for {span_text(quiet)}; a reopen pages again"
    return end(session, incident, now, text, "corral")


def end(session: Session, incident: Incident, now: float, text: str, by: str) -> bool:
    """Clear `flapping_since` (compare-and-set), with the timeline line `text`, and tell the
    flapping-ended listeners. False when it was not flapping, or another writer ended it first."""
    since = incident.flapping_since
    if since is None or not _set_flapping(session, incident, since, None, now):
        return False
    _note(session, incident, "flapping_ended", text, {"flapping_since": since}, now)
    for listener in list(_ENDED_LISTENERS):
        listener(session, incident, by)
    return True
