"""Paging: a small engine that walks a page through an escalation policy until someone
acknowledges it. It knows nothing of what is paged about (incidents plug in through `start` and
an ack listener; docs/operations.md, "Escalation").

- `start(session, key=..., policy=..., subject=..., body=..., now=...)`: one page per key
  (a second start with the same key returns the first page, whatever its state).
- `escalate_due(session, now)`: run by the paging loop (corral.monitor.pager, a leased
  singleton): each due page runs its next step, which queues one `PageNotification` per person
  and address (their email and contact methods) in the same transaction; then it waits the
  step's `wait_s`. After the last step the steps run again `repeat` more times; then the page is
  `exhausted` (still acknowledgeable). A step that reaches nobody (a schedule gap without a
  fallback, a user with no address) is logged and the next step runs at once.
- `ack(session, key, by, now)`: stops the escalation; the ack listeners registered for a prefix
  of the key are called with (session, key, by) in the same transaction. Notifications still
  queued for the page are dropped by the delivery step ("skipped").
- Acknowledge links (`ack_token` / `read_ack_token`): HMAC-SHA256 over (page, person, expiry)
  with a key derived from the server's secrets key (corral.services.secrets), so a link works
  without logging in, for that person and page only, until it expires.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import User
from corral.db.oncall_models import OncallSchedule, Page, PageNotification
from corral.services import audit, notify
from corral.services.accounts import user_by_name
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound, ServiceError
from corral.services.oncall import addresses_of, policy_by_name, rotation_of, schedule_by_name, shown_url
from corral.services.rotation import utc_text
from corral.words import plural

log = logging.getLogger(__name__)
ESCALATE_BATCH = 500
MAX_KEY = 200  # pages.key
OPEN_STATES = ("triggered", "exhausted")  # a page someone may still acknowledge
FIRST_ROUND_ONLY = "once"  # a page step's flag: run in its first round only (start's first_user_id)
AckListener = Callable[[Session, str, str], None]
_listeners: list[tuple[str, AckListener]] = []


def register_ack_listener(prefix: str, fn: AckListener) -> None:
    """`fn(session, key, by)` is called when a page whose key starts with `prefix` is acked."""
    _listeners.append((prefix, fn))


def _trigger_loop(session: Session) -> None:
    notify.changed(session, notify.Topic.PAGES)


# --- starting, acknowledging, cancelling ---------------------------------------------------------


def start(
    session: Session, *, key: str, policy: str, subject: str, body: str, now: float,
    first_user_id: int | None = None,
) -> Page:  # fmt: skip
    """Open the page `key` on `policy` (idempotent per key); its first step runs on the paging
    loop's next tick, which this wakes once the caller commits. Commits nothing itself.
    `first_user_id`: a person paged before the policy's steps (for as long as its first step
    waits), e.g. who answered the same incident before; the policy follows from its top. That
    step is first-round only (a repeat starts at the policy's top), and left out when the
    policy's first step reaches that person now anyway (their user, or their schedule's shift)."""
    if not 0 < len(key) <= MAX_KEY:
        raise Invalid(f"a page key is 1 to {MAX_KEY} characters, not {len(key)}", ("body", "key"))
    existing = session.scalar(select(Page).where(Page.key == key))
    if existing is not None:
        return existing
    row = policy_by_name(session, policy)
    steps = list(row.steps)
    if first_user_id is not None and steps and first_user_id not in _first_reached(session, steps[0], now):
        wait_s = float(steps[0].get("wait_s", 0.0))
        steps.insert(0, {"user_id": first_user_id, "wait_s": wait_s, FIRST_ROUND_ONLY: True})
    page = Page(
        key=key, policy_name=row.name, steps=steps, repeat=row.repeat,
        subject=subject[:300], body=body, state="triggered", step=0, round=0, next_at=now,
        created_at=now, log=[],
    )  # fmt: skip
    try:
        with session.begin_nested():  # two starts of one key at once: one row, the other reads it
            session.add(page)
    except IntegrityError:
        found = session.scalar(select(Page).where(Page.key == key))
        if found is None:
            raise
        return found
    _trigger_loop(session)
    return page


def _first_reached(session: Session, step: dict[str, Any], now: float) -> list[int]:
    """Who a policy's first step reaches now; [] when that cannot be told (its schedule's person
    is gone): then who answered before is paged first anyway, and the step finds out at its turn."""
    try:
        return _Resolver(session, now).targets(step)[0]
    except ServiceError:
        return []


def page_by_key(session: Session, key: str) -> Page:
    page = session.scalar(select(Page).where(Page.key == key))
    if page is None:
        raise NotFound(f"no page with key {key!r}")
    return page


def ack(session: Session, key: str, by: str, now: float) -> Page:
    """Acknowledge: the escalation stops and the listeners run. Acking an acknowledged page again
    changes nothing (the first ack stands); a cancelled page answers 409. Commits nothing."""
    page = page_by_key(session, key)
    if page.state == "acknowledged":
        return page
    if page.state not in OPEN_STATES:
        raise Conflict(f"page {key!r} was {page.state}; there is nothing to acknowledge")
    done = session.execute(
        update(Page)
        .where(Page.id == page.id, Page.state.in_(OPEN_STATES))
        .values(state="acknowledged", acked_at=now, acked_by=by, next_at=None, ended_at=now,
                log=[*page.log, f"{utc_text(now)} acknowledged by {by}"])
        .execution_options(synchronize_session=False)
    )  # fmt: skip
    session.refresh(page)
    if done.rowcount == 1:  # type: ignore[attr-defined]
        for prefix, fn in list(_listeners):
            if key.startswith(prefix):
                fn(session, key, by)
    elif page.state != "acknowledged":  # cancelled since it was read: as for any cancelled page
        raise Conflict(f"page {key!r} was {page.state}; there is nothing to acknowledge")
    return page


def cancel(session: Session, key: str, now: float) -> Page:
    """Stop a page nobody needs to answer any more (e.g. its cause resolved). Commits nothing."""
    page: Page = page_by_key(session, key)
    if page.state in OPEN_STATES:  # conditional, like ack: an ack committed since the read stands
        session.execute(
            update(Page)
            .where(Page.id == page.id, Page.state.in_(OPEN_STATES))
            .values(
                state="cancelled", next_at=None, ended_at=now, log=[*page.log, f"{utc_text(now)} cancelled"]
            )
            .execution_options(synchronize_session=False)
        )
        session.refresh(page)
    return page


# --- escalation ----------------------------------------------------------------------------------


class _Resolver:
    """Who a step reaches and where, resolved once per escalation pass: a burst of pages on one
    policy asks the same schedule at the same instant, so it is read once, not once per page."""

    def __init__(self, session: Session, now: float) -> None:
        self.session, self.now = session, now
        self._targets: dict[tuple[str, int], tuple[list[int], str]] = {}
        self._addresses: dict[int, list[tuple[str, str]]] = {}

    def targets(self, step: dict[str, Any]) -> tuple[list[int], str]:
        """The user ids a step notifies now, and what to log about it."""
        key = ("user", int(step["user_id"])) if "user_id" in step else ("schedule", int(step["schedule_id"]))
        if key not in self._targets:
            self._targets[key] = self._resolve(*key)
        return self._targets[key]

    def _resolve(self, kind: str, target: int) -> tuple[list[int], str]:
        if kind == "user":
            user = self.session.get(User, target)
            return [target], f"user {user.name}" if user is not None else f"user #{target}"
        schedule = self.session.get(OncallSchedule, target)
        if schedule is None:
            return [], f"schedule #{target} no longer exists"
        schedule = schedule_by_name(self.session, schedule.name)  # with its layers and overrides
        current = rotation_of(self.session, schedule).on_call(self.now)
        if current.user is None:
            return [], f"schedule {schedule.name}: nobody on call (gap, no fallback)"
        uid = user_by_name(self.session, current.user).id
        return [uid], f"schedule {schedule.name}: {current.user} ({current.source})"

    def addresses(self, user_id: int) -> list[tuple[str, str]]:
        if user_id not in self._addresses:
            self._addresses[user_id] = addresses_of(self.session, user_id)
        return self._addresses[user_id]


def _queue(session: Session, resolver: _Resolver, page: Page, user_ids: list[int], now: float) -> int:
    queued = 0
    for uid in user_ids:
        for kind, address in resolver.addresses(uid):
            session.add(
                PageNotification(
                    page_id=page.id, round=page.round, step=page.step, user_id=uid, kind=kind,
                    address=address, state="pending", attempts=0, next_attempt_at=now,
                    last_error="", created_at=now,
                )
            )  # fmt: skip
            queued += 1
    return queued


def _advance(session: Session, resolver: _Resolver, page: Page, now: float) -> None:
    """Run the page's due step(s): queue its notifications, then set when the next one is due."""
    entries = list(page.log)
    for _ in range(len(page.steps) * (page.repeat + 1) + 1):  # bounded: each pass moves on a step
        if page.step >= len(page.steps):
            if page.round >= page.repeat:
                page.state, page.next_at, page.ended_at = "exhausted", None, now
                entries.append(
                    f"{utc_text(now)} exhausted: nobody acknowledged after {plural(page.round + 1, 'round')}"
                )
                break
            page.round, page.step = page.round + 1, 0
        step = page.steps[page.step]
        if page.round > 0 and step.get(FIRST_ROUND_ONLY):
            page.step += 1  # who answered before was asked in round 1; a repeat is the policy's
            continue
        users, what = resolver.targets(step)
        queued = _queue(session, resolver, page, users, now)
        label = f"round {page.round + 1} step {page.step + 1}"
        entries.append(f"{utc_text(now)} {label}: {what}: {plural(queued, 'notification')}")
        page.step += 1
        if queued:
            page.next_at = now + float(step.get("wait_s", 0.0))
            break
    page.log = entries


def escalate_due(session: Session, now: float) -> int:
    """Run every due step of every triggered page, in one transaction (a failure anywhere leaves
    every page as it was, to be retried next pass). Returns how many pages advanced."""
    due = session.scalars(
        select(Page)
        .where(Page.state == "triggered", Page.next_at <= now)
        .order_by(Page.next_at, Page.id)
        .limit(ESCALATE_BATCH)
    ).all()
    advanced = 0
    resolver = _Resolver(session, now)
    for page in due:
        # Claim the page as it was read (on PostgreSQL this also locks the row until the commit):
        # an ack committed since the select wins, and this pass leaves the page alone.
        claimed = session.execute(
            update(Page)
            .where(Page.id == page.id, Page.state == "triggered")
            .where(Page.step == page.step, Page.round == page.round)
            .values(step=page.step)
            .execution_options(synchronize_session=False)
        )
        if claimed.rowcount != 1:  # type: ignore[attr-defined]
            continue  # the UPDATE changed nothing: nothing to undo
        _advance(session, resolver, page, now)
        advanced += 1
    session.commit()
    return advanced


def purge_ended(session: Session, before: float) -> int:
    """Delete pages that ended (acknowledged, cancelled, exhausted) before `before`, with their
    notifications; commits. Returns how many pages went."""
    ended = select(Page.id).where(Page.state != "triggered", Page.ended_at < before)
    ids = list(session.scalars(ended.limit(ESCALATE_BATCH)))
    if ids:
        session.execute(delete(PageNotification).where(PageNotification.page_id.in_(ids)))
        session.execute(delete(Page).where(Page.id.in_(ids)))
    session.commit()
    return len(ids)


# --- acknowledge links ---------------------------------------------------------------------------


class LinkError(ServiceError):
    """A link that cannot be used: `status_code` says why (400 malformed, 403 forged, 410 expired)."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def link_key(settings: Settings) -> bytes:
    """The links' HMAC key: derived from the secrets key, kept like it (never stored apart)."""
    from corral.services.secrets import box_for

    return hmac.new(box_for(settings).key, b"corral-paging-ack-link:v1", hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def ack_token(key: bytes, page_id: int, user_id: int, expires_at: float) -> str:
    payload = _b64(
        json.dumps({"p": page_id, "u": user_id, "e": int(expires_at)}, separators=(",", ":")).encode()
    )
    signature = _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())
    return f"{payload}.{signature}"


@dataclass(frozen=True)
class AckClaim:
    page_id: int
    user_id: int
    expires_at: float


def read_ack_token(key: bytes, token: str, now: float) -> AckClaim:
    payload, dot, signature = token.partition(".")
    if not dot or not payload or not signature:
        raise LinkError("this acknowledge link is malformed (it was cut short or altered)", 400)
    expected = _b64(hmac.new(key, payload.encode(), hashlib.sha256).digest())
    if not hmac.compare_digest(expected, signature):
        raise LinkError(
            "this acknowledge link's signature does not match: it was altered, or made by another server key",
            403,
        )
    try:
        data = json.loads(_unb64(payload))
        claim = AckClaim(int(data["p"]), int(data["u"]), float(data["e"]))
    except (binascii.Error, ValueError, KeyError, TypeError):
        raise LinkError("this acknowledge link is malformed", 400) from None
    if now >= claim.expires_at:
        raise LinkError(
            f"this acknowledge link expired at {utc_text(claim.expires_at)}; acknowledge in Corral instead",
            410,
        )
    return claim


# --- what the API and the portal show and do ------------------------------------------------------


def page_view(session: Session, page: Page, *, viewer_id: int, viewer_is_admin: bool) -> dict[str, Any]:
    """A page as `viewer_id` may see it: every notification's person, kind and delivery, and the
    address it went to only on the viewer's own notifications, or on all of them for an admin."""
    rows = session.execute(
        select(PageNotification, User.name)
        .join(User, User.id == PageNotification.user_id)
        .where(PageNotification.page_id == page.id)
        .order_by(PageNotification.id)
    ).all()
    return {
        "id": page.id, "key": page.key, "policy": page.policy_name, "subject": page.subject,
        "body": page.body, "state": page.state, "round": page.round + 1, "next_step": page.step + 1,
        "next_at": page.next_at, "created_at": page.created_at, "acked_at": page.acked_at,
        "acked_by": page.acked_by, "ended_at": page.ended_at, "log": list(page.log),
        "notifications": [
            {"user": name, **_notification_view(n, shows_address=viewer_is_admin or n.user_id == viewer_id)}
            for n, name in rows
        ],
    }  # fmt: skip


def view_for(session: Session, page: Page, principal: Principal) -> dict[str, Any]:
    return page_view(session, page, viewer_id=principal.user_id, viewer_is_admin=principal.is_admin)


def _notification_view(n: PageNotification, *, shows_address: bool) -> dict[str, Any]:
    """One notification as a page view shows it. Its address (and an error that names it) only to
    its person and admins, like their contact methods; everyone else the page notified reads
    `address: null` with the kind and the delivery. Even then a webhook or Slack contact's URL
    shows as scheme://host:port/... only (its path is the webhook's credential), in its address and
    in an error kept before errors named it so."""
    address: str | None = n.address
    error = n.last_error
    if not shows_address:
        address, error = None, error.replace(n.address, f"({n.kind} address hidden)")
    elif n.kind != "email":
        address = shown_url(n.address)
        error = error.replace(n.address, address)
    return {
        "kind": n.kind, "address": address, "round": n.round + 1, "step": n.step + 1, "state": n.state,
        "attempts": n.attempts, "sent_at": n.sent_at, "last_error": error,
    }  # fmt: skip


def _paged(session: Session, page_id: int, user_id: int) -> bool:
    found = session.scalar(
        select(PageNotification.id)
        .where(PageNotification.page_id == page_id, PageNotification.user_id == user_id)
        .limit(1)
    )
    return found is not None


def list_pages(session: Session, principal: Principal, state: str | None, limit: int) -> list[dict[str, Any]]:
    """Admins see every page; others the pages that notified them."""
    query = select(Page).order_by(Page.id.desc()).limit(limit)
    if state:
        query = query.where(Page.state == state)
    if not principal.is_admin:
        mine = select(PageNotification.page_id).where(PageNotification.user_id == principal.user_id)
        query = query.where(Page.id.in_(mine))
    return [view_for(session, p, principal) for p in session.scalars(query)]


def _visible_page(session: Session, principal: Principal, page_id: int) -> Page:
    page = session.get(Page, page_id)
    if page is None or not (principal.is_admin or _paged(session, page.id, principal.user_id)):
        raise NotFound(f"no page {page_id}")  # the same answer whether it exists for others or not
    return page


def get_page(session: Session, principal: Principal, page_id: int) -> dict[str, Any]:
    return view_for(session, _visible_page(session, principal, page_id), principal)


def open_page(
    session: Session,
    principal: Principal,
    *,
    policy: str,
    subject: str,
    body: str,
    key: str | None,
    now: float,
) -> tuple[dict[str, Any], bool]:
    """An admin's page by hand (or a test of the set-up): (view, created)."""
    if not principal.is_admin:
        raise Forbidden("only admins may page by hand")
    key = key or f"manual:{uuid.uuid4().hex}"
    existed = session.scalar(select(Page.id).where(Page.key == key)) is not None
    page = start(session, key=key, policy=policy, subject=subject, body=body, now=now)
    if not existed:
        audit.record(
            session, actor=principal, action="page.start", target_kind="page", target_id=key,
            after={"policy": policy, "subject": subject},
        )  # fmt: skip
    session.commit()
    return view_for(session, page, principal), not existed


def ack_as(session: Session, principal: Principal, page_id: int, now: float) -> dict[str, Any]:
    """Acknowledge in Corral: admins, and the people the page notified."""
    return _ack_audited(session, principal, _visible_page(session, principal, page_id), now)


def cancel_as(session: Session, principal: Principal, page_id: int, now: float) -> dict[str, Any]:
    if not principal.is_admin:
        raise Forbidden("only admins may cancel a page")
    page = _visible_page(session, principal, page_id)
    before = page.state
    cancel(session, page.key, now)
    audit.record(
        session, actor=principal, action="page.cancel", target_kind="page", target_id=page.key,
        before={"state": before}, after={"state": page.state},
    )  # fmt: skip
    session.commit()
    return view_for(session, page, principal)


def page_for_link(session: Session, key: bytes, token: str, now: float) -> tuple[Page, User]:
    """The page and person a link names; LinkError (400/403/410) or NotFound when unusable."""
    claim = read_ack_token(key, token, now)
    page = session.get(Page, claim.page_id)
    user = session.get(User, claim.user_id)
    if page is None:
        raise NotFound("the page this link acknowledges no longer exists")
    if user is None or not user.active:
        raise LinkError("the person this link was sent to no longer has an active account", 403)
    return page, user


def ack_with_link(session: Session, key: bytes, token: str, now: float, source: str) -> dict[str, Any]:
    """Acknowledge as the person the link was sent to; audited as them, with the link as credential."""
    page, user = page_for_link(session, key, token, now)
    actor = Principal(
        user_id=user.id, name=user.name, is_admin=False, default_group_id=None, via="ack-link",
        credential=f"ack-link:page:{page.id}", source=source,
    )  # fmt: skip
    return _ack_audited(session, actor, page, now)


def _ack_audited(session: Session, actor: Principal, page: Page, now: float) -> dict[str, Any]:
    """`actor` acknowledges `page`, in the audit log; committed."""
    before = page.state
    page = ack(session, page.key, actor.name, now)
    audit.record(
        session, actor=actor, action="page.ack", target_kind="page", target_id=page.key,
        before={"state": before}, after={"state": page.state, "acked_by": page.acked_by},
    )  # fmt: skip
    session.commit()
    return view_for(session, page, actor)
