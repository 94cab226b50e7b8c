"""Incidents page people: the one place where corral.services.incidents meets the paging engine
(corral.services.paging), both of which know nothing of the other.

- An incident opens -> a page with key `incident:<id>` starts on the escalation policy chosen by
  severity: `incident-sev1`..`incident-sev4` if that policy exists, else `incidents`, else nobody
  is paged and the incident's timeline says which policies it looked for.
- The page is acknowledged (its emailed link, `corral oncall ack`) -> the incident is acknowledged
  by that person; the incident is acknowledged (`corral incident ack`, REST) -> its page is
  acknowledged, which stops the escalation. Both acks are idempotent, so each side's listener
  calling the other ends after one hop.
- The incident resolves (by hand, or its alerts resolved) -> its page is cancelled if still open.
- The incident reopens (it fired again within the reopen window, so it is triggered again) -> a
  new page starts, key `incident:<id>/reopen-<n>` (a page key is used once). If someone had
  acknowledged the incident, the page goes to that person first (and names them), then to the
  policy from its top (first round only; not twice when the policy's first step is them): they
  know the fault.
- Flapping (corral.services.incident_flapping): the reopen that makes the incident flapping
  pages once, saying so; the reopens while it flaps page nobody (the timeline says each), and
  resolving does not cancel that page, which stays until someone acknowledges it: the flapping
  itself is the fault to look at. Once the flapping has ended, a reopen pages again. When it ends
  with the incident still firing and nobody holding it (triggered, no page open: its flapping page
  was answered before it reopened), the steady fault is paged then, as a reopen is; when it ends
  with the incident resolved, or because it was closed, its page is cancelled.

Everything happens in the transaction of the change that caused it: an incident is never left
open without its page, nor a page acked without its incident. `install()` registers the
listeners once; the server calls it at start-up (corral.server.run).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from sqlalchemy import ColumnElement, func, or_, select
from sqlalchemy.orm import Session

from corral.config import portal_url
from corral.db.incident_models import Incident
from corral.db.models import User
from corral.db.oncall_models import EscalationPolicy, Page
from corral.domain import span_text
from corral.services import incident_flapping, incidents, paging
from corral.services.incident_flapping import FlapNews, Reopen

log = logging.getLogger(__name__)
KEY_PREFIX = "incident:"
FALLBACK_POLICY = "incidents"
_registered = False  # the listeners are in the lists (they stay: the lists have no removal)
_enabled = False  # and act
_install_lock = threading.Lock()


def page_key(incident_id: int) -> str:
    """The key of the incident's first page; a reopen's page is `<that>/reopen-<n>`."""
    return f"{KEY_PREFIX}{incident_id}"


def incident_of_key(key: str) -> int | None:
    """The incident id of one of its pages' keys (None: not an incident's page)."""
    head = key.removeprefix(KEY_PREFIX).split("/", 1)[0]
    return int(head) if key.startswith(KEY_PREFIX) and head.isdigit() else None


def policy_names(severity: str) -> list[str]:
    """The policies tried for a severity, in order."""
    return [f"incident-{severity.lower()}", FALLBACK_POLICY]


def page_body(incident: Incident, preface: Sequence[str] = ()) -> str:
    links = incident.links or {}
    lines = [
        f"{incident.severity} incident #{incident.id}: {incident.title}",
        *preface,
        f"Opened by {incident.source}.",
    ]
    for kind in incidents.LINK_KINDS:
        if links.get(kind):
            lines.append(f"{kind.capitalize()}: {', '.join(links[kind])}")
    lines += ["", f"Portal: {portal_url()}/incidents/{incident.id}",
              f"CLI: corral incident show {incident.id}"]  # fmt: skip
    return "\n".join(lines)


def _page_opened(session: Session, incident: Incident) -> None:
    if _enabled:
        _start_page(session, incident, page_key(incident.id), incident.opened_at, "paged")


def _page_reopened(session: Session, incident: Incident, reopen: Reopen) -> None:
    """A reopened incident is triggered again: page again, on a page of its own (the first one
    was cancelled when the incident resolved, or acknowledged for the fault as it was then) and
    to whoever acknowledged it before first; once only when it began flapping, not while it flaps."""
    if not _enabled:
        return
    now = incident.updated_at
    if reopen.flap is FlapNews.ONGOING:
        text = f"not paged: the incident is flapping (until quiet for {span_text(reopen.quiet_s)})"
        incidents.add_timeline(session, incident.id, "paging", text, now=now)
        return
    preface, verb = [], "reopened: paged again"
    if reopen.flap is FlapNews.STARTED:
        quiet = span_text(reopen.quiet_s)
        preface.append(f"{reopen.text}; its further reopens page nobody until it is quiet for {quiet}.")
        verb = f"{reopen.text}: paged once"
    _page_again(session, incident, now, verb, preface)


def _page_again(session: Session, incident: Incident, now: float, verb: str, preface: list[str]) -> None:
    """A triggered incident needs someone again: a new page `incident:<id>/reopen-<n>` (unless one
    is still open), to whoever acknowledged the incident before first."""
    if _open_page(session, incident.id) is not None:
        return
    earlier = session.scalar(select(func.count()).select_from(Page).where(_pages_of(incident.id)))
    key = f"{page_key(incident.id)}/reopen-{earlier or 0}"
    first = _earlier_acknowledger(session, incident)
    if first is not None:
        preface.append(f"Reopened after {first.name} acknowledged it: paged to {first.name} first.")
    _start_page(session, incident, key, now, verb, preface, first)


def _earlier_acknowledger(session: Session, incident: Incident) -> User | None:
    """Who acknowledged the incident before it reopened, while they can still answer a page."""
    if not incident.acknowledged_by:
        return None
    user = session.scalar(select(User).where(User.name == incident.acknowledged_by))
    return user if user is not None and user.active else None


def _start_page(
    session: Session, incident: Incident, key: str, now: float, verb: str,
    preface: Sequence[str] = (), first: User | None = None,
) -> None:  # fmt: skip
    tried = policy_names(incident.severity)
    policy = session.scalar(
        select(EscalationPolicy.name).where(EscalationPolicy.name.in_(tried))
        .order_by(EscalationPolicy.name == FALLBACK_POLICY)  # the severity's own one first
        .limit(1)
    )  # fmt: skip
    if policy is None:
        text = f"nobody paged: no escalation policy named {' or '.join(repr(n) for n in tried)}"
        incidents.add_timeline(session, incident.id, "paging", text, now=now)
        return
    flapping = "flapping: " if incident.flapping_since is not None else ""
    paging.start(
        session, key=key, policy=policy, subject=f"[{incident.severity}] {flapping}{incident.title}",
        body=page_body(incident, preface), now=now, first_user_id=None if first is None else first.id,
    )  # fmt: skip
    text = f"{verb} via policy {policy}" + (f", to {first.name} first" if first is not None else "")
    incidents.add_timeline(session, incident.id, "paging", text, {"policy": policy, "page": key}, now=now)


def _pages_of(incident_id: int) -> ColumnElement[bool]:
    first = page_key(incident_id)
    # "/" and the digits are no LIKE wildcards, so this matches this incident's pages only
    return or_(Page.key == first, Page.key.like(f"{first}/%"))


def _open_page(session: Session, incident_id: int) -> Page | None:
    """The incident's page still under way (at most one: a reopen pages only when none is)."""
    return session.scalar(
        select(Page).where(_pages_of(incident_id), Page.state.in_(paging.OPEN_STATES))
        .order_by(Page.id.desc()).limit(1)
    )  # fmt: skip


def _page_acked(session: Session, key: str, by: str) -> None:
    """The page was acknowledged: so is its incident (unless it is already closed or gone)."""
    if not _enabled:
        return
    incident_id = incident_of_key(key)
    if incident_id is None:
        return  # not one of ours (a hand-made page whose key merely starts alike)
    incident = session.get(Incident, incident_id)
    if incident is None or incident.state == incidents.IncidentState.CLOSED.value:
        return
    incidents.acknowledge(session, incident_id, by, time.time())


def _incident_acked(session: Session, incident: Incident, by: str) -> None:
    """The incident was acknowledged: its page stops escalating."""
    if not _enabled:
        return
    if (page := _open_page(session, incident.id)) is not None:
        paging.ack(session, page.key, by, time.time())


def _incident_resolved(session: Session, incident: Incident, by: str) -> None:
    """Nobody needs to answer a page about a fault that is over; but a flapping one is not over
    when it resolves (it comes back): its page stays while it flaps."""
    if _enabled and incident.flapping_since is None:
        _cancel_open_page(session, incident, "page cancelled: the incident resolved")


def _flapping_ended(session: Session, incident: Incident, by: str) -> None:
    """A flapping incident that stayed resolved for its quiet period, or was closed, is over after
    all: its page is cancelled now, as it would have been when it resolved. One that stayed
    firing is a steady fault: when nobody holds it (triggered, its last page answered or none),
    it is paged again, as a reopen is. One acknowledged or mitigated keeps whoever has it."""
    if not _enabled:
        return
    state = incidents.IncidentState(incident.state)
    if state is incidents.IncidentState.CLOSED:
        _cancel_open_page(session, incident, "page cancelled: the incident was closed")
    elif state is incidents.IncidentState.RESOLVED:
        _cancel_open_page(session, incident, "page cancelled: the incident stopped flapping, resolved")
    elif state is incidents.IncidentState.TRIGGERED:
        preface = ["It stopped flapping and is still firing: the fault has settled."]
        verb = "stopped flapping; still firing: paged again"
        _page_again(session, incident, incident.updated_at, verb, preface)


def _cancel_open_page(session: Session, incident: Incident, text: str) -> None:
    if (page := _open_page(session, incident.id)) is not None:
        now = time.time()
        if paging.cancel(session, page.key, now).state == "cancelled":  # not acked meanwhile
            incidents.add_timeline(session, incident.id, "paging", text, now=now)


def install() -> None:
    """Connect incidents and paging (registers once per process; a second call does nothing)."""
    global _registered, _enabled
    with _install_lock:
        if not _registered:
            incidents.on_opened(_page_opened)
            incidents.on_acknowledged(_incident_acked)
            incidents.on_resolved(_incident_resolved)
            incidents.on_reopened(_page_reopened)
            incident_flapping.on_flapping_ended(_flapping_ended)
            paging.register_ack_listener(KEY_PREFIX, _page_acked)
            _registered = True
        _enabled = True


def uninstall() -> None:
    """Disconnect them again (tests that install in their own process; the server never does)."""
    global _enabled
    _enabled = False
