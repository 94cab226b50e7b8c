"""On-call calendar subscription URLs (`GET /api/v1/oncall/feeds/<name>.<signature>`).

Calendar apps send no credential, so the URL carries its own: an HMAC, with the server's link
key, of the schedule's name and its `feed_nonce`, a random value the schedule gets when it is
created and again when an admin rotates its feed. So a URL works for one schedule row only: once
the schedule is deleted (a new one of the same name has a new nonce) or its feed rotated
(`corral oncall feed rotate NAME`), every URL handed out before is refused. Only admins and
the schedule's own people (its layers' members, its overrides' users, its fallback user) are
shown the URL (docs/operations.md, "iCal feed")."""

from __future__ import annotations

import hashlib
import hmac

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.oncall_models import OncallSchedule, new_feed_nonce
from corral.services import audit
from corral.services.auth import Principal
from corral.services.errors import Forbidden

FEEDS_PATH = "/api/v1/oncall/feeds/"


def feed_token(key: bytes, schedule: str, nonce: str) -> str:
    """The path token of a schedule's subscription URL: its name and an HMAC of name and nonce."""
    message = f"corral-ical-feed:{schedule}:{nonce}".encode()
    return f"{schedule}.{hmac.new(key, message, hashlib.sha256).hexdigest()[:32]}"


def feed_path(key: bytes, row: OncallSchedule) -> str:
    return FEEDS_PATH + feed_token(key, row.name, row.feed_nonce)


def schedule_of_feed(session: Session, key: bytes, token: str) -> OncallSchedule:
    """The schedule a subscription URL's token names, if its signature is that schedule's now.
    A missing schedule is refused alike, so the URL tells nothing it did not before."""
    name = token.rpartition(".")[0]
    row = session.scalar(select(OncallSchedule).where(OncallSchedule.name == name)) if name else None
    if row is None or not hmac.compare_digest(feed_token(key, name, row.feed_nonce), token):
        raise Forbidden(
            "this calendar URL is not valid: it was altered, revoked (its schedule was deleted or "
            "its feed rotated since), or made with another server key; ask an admin or a member of "
            "the schedule for its current URL (`corral oncall schedule show NAME`)"
        )
    return row


def may_see_feed(principal: Principal, row: OncallSchedule) -> bool:
    """Admins and the schedule's own people; anyone else who could read the URL could hand it on
    to someone without a login, and it names who is on call when."""
    return principal.is_admin or principal.user_id in schedule_people(row)


def schedule_people(row: OncallSchedule) -> set[int]:
    """The user ids a schedule names: its layers' members, its overrides' and its fallback."""
    people = {m for layer in row.layers for m in layer.members} | {o.user_id for o in row.overrides}
    if row.fallback_user_id is not None:
        people.add(row.fallback_user_id)
    return people


def rotate_feed(session: Session, principal: Principal, row: OncallSchedule) -> None:
    """A new nonce for the schedule (admins): every subscription URL given out before stops
    working. Committed with its audit record."""
    if not principal.is_admin:
        raise Forbidden("only admins may rotate a schedule's calendar URL")
    row.feed_nonce = new_feed_nonce()
    audit.record(
        session,
        actor=principal,
        action="oncall.schedule.feed_rotate",
        target_kind="oncall_schedule",
        target_id=row.name,
        detail="the calendar subscription URL was replaced; the old one is refused",
    )
    session.commit()
