"""On-call schedules, escalation policies and people's contact methods (docs/operations.md,
"On-call"). The arithmetic of rotations is `corral.services.rotation`; paging is
`corral.services.paging`. Schedules and policies are admin-managed; an override may also be
made by a member of the schedule's layers who takes the shift themselves; a person manages their
own email and contact methods (admins anyone's). Every change is audited.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime
from typing import Any

import httpx
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload
from sqlalchemy.orm.exc import StaleDataError

from corral.config import url_host
from corral.db.models import User
from corral.db.notify_models import JobNotifyDelivery
from corral.db.oncall_models import (
    ContactMethod,
    EscalationPolicy,
    OncallLayer,
    OncallOverride,
    OncallSchedule,
    PageNotification,
)
from corral.services import audit, webhook_guard
from corral.services.accounts import check_name, user_by_name
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.services.oncall_feed import schedule_people
from corral.services.rotation import (
    Layer,
    OnCall,
    Override,
    Rotation,
    RotationError,
    Shift,
    parse_hhmm,
    parse_zone,
    utc_text,
)

GAP_HORIZON_S = 14 * 86400.0  # how far ahead a schedule is checked for gaps
# Blanks spelled out rather than `\s`: the schema carries this pattern, and `\s` means other
# characters to JSON Schema (ECMA-262: not U+0085) than to Python and pydantic (U+0085, U+001C-F).
_BLANK = r"\t\n\v\f\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
# No control characters either (NUL above all: the database cannot store it), said in the schema.
_NOT_IN_EMAIL = rf"@{_BLANK}\x00-\x1f\x7f"
EMAIL_RE = re.compile(rf"^[^{_NOT_IN_EMAIL}]+@[^{_NOT_IN_EMAIL}]+\.[^{_NOT_IN_EMAIL}]+$")
CONTACT_KINDS = ("email", "webhook", "slack")
MAX_STEPS = 20
MAX_REPEAT = 10


def _admin(principal: Principal, what: str) -> None:
    if not principal.is_admin:
        raise Forbidden(f"only admins may {what}")


# --- contacts -----------------------------------------------------------------------------------


def _may_manage(principal: Principal, name: str, verb: str = "change") -> None:
    """Checked before the user is looked up, on the name asked for: anyone else gets this 403
    whether `name` is a user or not, so the contact routes tell no one which user names exist
    (as the user routes' password and default-group changes)."""
    if principal.name != name and not principal.is_admin:
        raise Forbidden(f"only {name} and admins may {verb} {name}'s contact methods")


def shown_url(url: str) -> str:
    """A webhook's URL (an alert channel's or a person's contact) as errors and page views show it
    (`corral alert channels`, which every member may read, the pages every person they notified
    may read, and the log): scheme, host and port. The path of a chat webhook is its credential
    (https://hooks.slack.com/services/T000/B000/XXXX), and a user:password may precede the host."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:  # one stored before check_address refused such URLs
        return "(not a valid URL)"
    port = f":{parsed.port}" if parsed.port is not None else ""
    return f"{parsed.scheme}://{url_host(parsed.host)}{port}/..."


def check_address(kind: str, address: str, allowed: Sequence[webhook_guard.Network] = ()) -> str:
    """The address, stripped, if a contact of `kind` may have it. A webhook's host must not be,
    nor resolve to, an address inside the cluster's networks unless `allowed` (the admin's
    CORRAL_WEBHOOK_ALLOW_NETWORKS) holds it (corral.services.webhook_guard); a name that does not
    resolve now is let through, and checked again at every send."""
    address = address.strip()
    if kind not in CONTACT_KINDS:
        raise Invalid(f"kind must be one of {', '.join(CONTACT_KINDS)}, not {kind!r}", ("body", "kind"))
    if kind == "email" and not EMAIL_RE.match(address):
        raise Invalid(f"{address!r} is not an email address", ("body", "address"))
    if kind != "email" and not re.match(r"^https?://[^\s/]+", address):
        raise Invalid(f"a {kind} contact needs an http(s):// URL, not {address!r}", ("body", "address"))
    if kind != "email":
        try:  # what the paging loop will POST to: a control character is no URL
            url = httpx.URL(address)
        except httpx.InvalidURL as exc:
            raise Invalid(f"{address!r} is not a URL a {kind} can be sent to: {exc}", ("body", "address"))
        try:
            webhook_guard.checked_addresses(url.host, webhook_guard.port_of(url), allowed)
        except webhook_guard.Unresolved:
            pass
        except webhook_guard.WebhookRefused as exc:
            raise Invalid(str(exc), ("body", "address")) from None
    return address


def contacts_view(session: Session, user: User) -> dict[str, Any]:
    methods = session.scalars(
        select(ContactMethod).where(ContactMethod.user_id == user.id).order_by(ContactMethod.id)
    ).all()
    return {
        "user": user.name,
        "email": user.email,
        "methods": [{"id": m.id, "kind": m.kind, "address": m.address} for m in methods],
    }


def get_contacts(session: Session, principal: Principal, name: str) -> dict[str, Any]:
    _may_manage(principal, name, "see")
    user = user_by_name(session, name)
    return contacts_view(session, user)


def set_email(session: Session, principal: Principal, name: str, email: str | None) -> dict[str, Any]:
    _may_manage(principal, name)
    user = user_by_name(session, name)
    before = {"email": user.email}
    user.email = check_address("email", email) if email else None
    audit.record(
        session, actor=principal, action="user.set_email", target_kind="user", target_id=user.name,
        before=before, after={"email": user.email},
    )  # fmt: skip
    if before["email"] and before["email"] != user.email:
        _hurry_waiting(session, user.id, "email", before["email"], time.time())
    session.commit()
    return contacts_view(session, user)


def add_contact(
    session: Session,
    principal: Principal,
    name: str,
    kind: str,
    address: str,
    allowed: Sequence[webhook_guard.Network] = (),
) -> dict[str, Any]:
    """Add a contact method; `allowed`: the private networks a webhook may reach (the admin's
    CORRAL_WEBHOOK_ALLOW_NETWORKS)."""
    _may_manage(principal, name)
    user = user_by_name(session, name)
    address = check_address(kind, address, allowed)
    if session.scalar(
        select(ContactMethod.id).where(
            ContactMethod.user_id == user.id, ContactMethod.kind == kind, ContactMethod.address == address
        )
    ):
        raise Conflict(f"{user.name} already has the {kind} contact {address!r}")
    session.add(ContactMethod(user_id=user.id, kind=kind, address=address, created_at=time.time()))
    audit.record(
        session, actor=principal, action="contact.add", target_kind="user", target_id=user.name,
        after={"kind": kind, "address": address},
    )  # fmt: skip
    session.commit()
    return contacts_view(session, user)


def remove_contact(session: Session, principal: Principal, name: str, contact_id: int) -> None:
    _may_manage(principal, name)
    user = user_by_name(session, name)
    row = session.get(ContactMethod, contact_id)
    if row is None or row.user_id != user.id:
        raise NotFound(f"{user.name} has no contact method {contact_id}")
    audit.record(
        session, actor=principal, action="contact.remove", target_kind="user", target_id=user.name,
        before={"kind": row.kind, "address": row.address},
    )  # fmt: skip
    session.delete(row)
    session.flush()
    _hurry_waiting(session, user.id, row.kind, row.address, time.time())
    session.commit()


def _hurry_waiting(session: Session, user_id: int, kind: str, address: str, now: float) -> None:
    """A contact removed (or an email changed): messages still waiting for that address (job
    notifications, pages; not one being sent this moment) are made due now, unless the person
    still has the address another way. Their loops, which check each message's address against
    the person's contacts just before sending (`no_longer_reaches`), then give it up saying why, within a
    pass, rather than when a backoff ends; nothing more is sent there."""
    if (kind, address) in addresses_of(session, user_id):
        return
    for table in (JobNotifyDelivery, PageNotification):
        session.execute(
            update(table)
            .where(
                table.user_id == user_id, table.kind == kind, table.address == address,
                table.state.in_(("pending", "failing")), table.next_attempt_at > now,
            )
            .values(next_attempt_at=now)
            .execution_options(synchronize_session=False)
        )  # fmt: skip


def addresses_of(session: Session, user_id: int) -> list[tuple[str, str]]:
    """Where a page reaches a person: their email, then their contact methods (kind, address)."""
    user = session.get(User, user_id)
    if user is None or not user.active:
        return []
    out = [("email", user.email)] if user.email else []
    for m in session.scalars(
        select(ContactMethod).where(ContactMethod.user_id == user_id).order_by(ContactMethod.id)
    ):
        if (m.kind, m.address) not in out:
            out.append((m.kind, m.address))
    return out


def no_longer_reaches(session: Session, user: User, kind: str, address: str) -> str | None:
    """Why a message queued for `user` at (`kind`, `address`) must not go there now: their
    account is deactivated, or the address is no longer one of their contacts (removed, or an
    email changed, since it was queued; a mature platform sends nothing more to an address its
    owner took away). None: it still reaches them. The words do not name the address."""
    if not user.active:
        return f"{user.name}'s account is deactivated"
    if (kind, address) not in addresses_of(session, user.id):
        return f"the {kind} address is no longer one of {user.name}'s contacts (removed or changed)"
    return None


# --- schedules ----------------------------------------------------------------------------------


def schedule_by_name(session: Session, name: str) -> OncallSchedule:
    found = session.scalar(
        select(OncallSchedule)
        .where(OncallSchedule.name == name)
        .options(selectinload(OncallSchedule.layers), selectinload(OncallSchedule.overrides))
    )
    if found is None:
        raise NotFound(f"no on-call schedule named {name!r}")
    return found


def _user_names(session: Session, ids: set[int]) -> dict[int, str]:
    if not ids:
        return {}
    return dict(session.execute(select(User.id, User.name).where(User.id.in_(ids))).all())


def rotation_of(session: Session, schedule: OncallSchedule) -> Rotation:
    names = _user_names(session, schedule_people(schedule))
    layers = tuple(
        Layer(
            name=layer.name, rotation=layer.rotation, start_date=date.fromisoformat(layer.start_date),
            handoff=parse_hhmm(layer.handoff, "handoff"),
            members=tuple(names.get(m, f"#{m}") for m in layer.members),
            restrict_from=parse_hhmm(layer.restrict_from, "restrict_from") if layer.restrict_from else None,
            restrict_to=parse_hhmm(layer.restrict_to, "restrict_to") if layer.restrict_to else None,
        )
        for layer in schedule.layers
    )  # fmt: skip
    overrides = tuple(
        Override(o.id, names.get(o.user_id, f"#{o.user_id}"), o.start, o.end) for o in schedule.overrides
    )
    fallback = names.get(schedule.fallback_user_id) if schedule.fallback_user_id is not None else None
    return Rotation(parse_zone(schedule.time_zone), layers, overrides, fallback)


def _named_user(session: Session, name: str, loc: tuple[str | int, ...]) -> int:
    """The id of the user a schedule or policy body names: an unknown name is bad input at that
    place of the body (422 naming the field), not a missing resource (404 reads as "no such
    schedule")."""
    user_id = session.scalar(select(User.id).where(User.name == name))
    if user_id is None:
        raise Invalid(f"no user named {name!r}", loc)
    return user_id


def _layers_from_spec(session: Session, specs: list[dict[str, Any]]) -> list[OncallLayer]:
    rows = []
    for i, spec in enumerate(specs):
        where = f"layers[{i}]"
        name = spec.get("name") or f"layer-{i + 1}"
        members = [
            _named_user(session, m, ("body", "layers", i, "members", j))
            for j, m in enumerate(spec.get("members") or [])
        ]
        try:  # the same checks rotation_of relies on, with the layer's place in the message
            start = date.fromisoformat(spec["start_date"])
        except (KeyError, TypeError, ValueError):
            raise Invalid(
                f"{where}.start_date must be a date YYYY-MM-DD", ("body", "layers", i, "start_date")
            )
        try:
            Layer(
                name=name,
                rotation=spec.get("rotation", ""),
                start_date=start,
                handoff=parse_hhmm(spec.get("handoff", "09:00"), f"{where}.handoff"),
                members=tuple(str(m) for m in members),
                restrict_from=parse_hhmm(spec["restrict_from"], f"{where}.restrict_from")
                if spec.get("restrict_from")
                else None,
                restrict_to=parse_hhmm(spec["restrict_to"], f"{where}.restrict_to")
                if spec.get("restrict_to")
                else None,
            )
        except RotationError as exc:
            raise Invalid(str(exc), ("body", "layers", i))
        rows.append(
            OncallLayer(
                position=i, name=name, rotation=spec["rotation"], start_date=start.isoformat(),
                handoff=spec.get("handoff", "09:00"), members=members,
                restrict_from=spec.get("restrict_from") or None, restrict_to=spec.get("restrict_to") or None,
            )
        )  # fmt: skip
    return rows


@contextmanager
def _no_concurrent_change(session: Session, what: str) -> Iterator[None]:
    """A create or replace that another request's (a delete's, a create's) got ahead of is a 409,
    not a 500: the row it read is gone, or the name it was making is taken."""
    try:
        yield
    except (IntegrityError, StaleDataError) as exc:
        session.rollback()
        raise Conflict(f"{what} was changed by another request at the same time; try again") from exc


def put_schedule(
    session: Session, principal: Principal, name: str, spec: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    """Create or replace a schedule's definition (its overrides are kept). (view, created)."""
    _admin(principal, "define on-call schedules")
    check_name(name, "name")
    try:
        parse_zone(spec.get("time_zone") or "UTC")
    except RotationError as exc:
        raise Invalid(str(exc), ("body", "time_zone"))
    layers = _layers_from_spec(session, list(spec.get("layers") or []))
    fallback = spec.get("fallback_user")
    fallback_id = _named_user(session, fallback, ("body", "fallback_user")) if fallback else None
    now = time.time()
    with _no_concurrent_change(session, f"schedule {name!r}"):
        row = session.scalar(select(OncallSchedule).where(OncallSchedule.name == name))
        created = row is None
        before = None if row is None else schedule_definition(session, row)
        if row is None:
            row = OncallSchedule(name=name, created_at=now, time_zone="UTC")
            session.add(row)
        row.time_zone = spec.get("time_zone") or "UTC"
        row.description = spec.get("description") or ""
        row.fallback_user_id = fallback_id
        row.updated_at = now
        row.layers.clear()
        session.flush()  # the old layers' positions are free before the new ones take them
        row.layers.extend(layers)
        session.flush()
        after = schedule_definition(session, row)
        action = "oncall.schedule.create" if created else "oncall.schedule.update"
        audit.record(
            session, actor=principal, action=action,
            target_kind="oncall_schedule", target_id=name, before=before, after=after,
        )  # fmt: skip
        session.commit()
    return schedule_view(session, schedule_by_name(session, name), time.time()), created


def schedule_definition(session: Session, row: OncallSchedule) -> dict[str, Any]:
    names = _user_names(
        session, {m for layer in row.layers for m in layer.members} | {row.fallback_user_id or 0}
    )
    return {
        "name": row.name,
        "time_zone": row.time_zone,
        "description": row.description,
        "fallback_user": names.get(row.fallback_user_id) if row.fallback_user_id else None,
        "layers": [
            {
                "name": layer.name, "rotation": layer.rotation, "start_date": layer.start_date,
                "handoff": layer.handoff, "members": [names.get(m, f"#{m}") for m in layer.members],
                "restrict_from": layer.restrict_from, "restrict_to": layer.restrict_to,
            }
            for layer in row.layers
        ],
    }  # fmt: skip


def gap_warnings(rotation: Rotation, zone_name: str, now: float) -> list[str]:
    zone = parse_zone(zone_name)
    out = []
    for gap in rotation.gaps(now, now + GAP_HORIZON_S):  # every one, as docs/operations.md says
        begin = datetime.fromtimestamp(gap.start, zone).strftime("%Y-%m-%d %H:%M")
        end = datetime.fromtimestamp(gap.end, zone).strftime("%Y-%m-%d %H:%M")
        who = (
            f"the fallback user {rotation.fallback} is paged"
            if rotation.fallback
            else "nobody is paged for this schedule: its escalation step is skipped"
        )
        out.append(f"gap: nobody on call {begin} - {end} {zone_name}; {who}")
    return out


def shift_dict(shift: Shift) -> dict[str, Any]:
    return {"user": shift.user, "source": shift.source, "start": shift.start, "end": shift.end}


def schedule_view(session: Session, row: OncallSchedule, now: float, days: float = 7.0) -> dict[str, Any]:
    rotation = rotation_of(session, row)
    current = rotation.on_call(now)
    shifts = rotation.shifts(now, now + days * 86400.0)
    return {
        **schedule_definition(session, row),
        "on_call": {
            "user": current.user,
            "source": current.source,
            "until": shifts[0].end if shifts else None,
        },
        "shifts": [shift_dict(s) for s in shifts],
        "overrides": [
            {"id": o.id, "user": o.user, "start": o.start, "end": o.end}
            for o in rotation.overrides
            if o.end > now
        ],
        "warnings": gap_warnings(rotation, row.time_zone, now),
    }


def list_schedules(session: Session, now: float) -> list[dict[str, Any]]:
    rows = session.scalars(
        select(OncallSchedule)
        .order_by(OncallSchedule.name)
        .options(selectinload(OncallSchedule.layers), selectinload(OncallSchedule.overrides))
    ).all()
    return [schedule_view(session, row, now, days=1.0) for row in rows]


def delete_schedule(session: Session, principal: Principal, name: str) -> None:
    _admin(principal, "delete on-call schedules")
    row = schedule_by_name(session, name)
    users = [
        p.name
        for p in session.scalars(select(EscalationPolicy))
        if any(s.get("schedule_id") == row.id for s in p.steps)
    ]
    if users:
        raise Conflict(
            f"schedule {name!r} is used by escalation policies {', '.join(sorted(users))}: change them first"
        )
    audit.record(
        session, actor=principal, action="oncall.schedule.delete", target_kind="oncall_schedule",
        target_id=name, before=schedule_definition(session, row),
    )  # fmt: skip
    session.delete(row)
    session.commit()


def who_is_on_call(session: Session, name: str | None, now: float) -> list[dict[str, Any]]:
    rows = (
        [schedule_by_name(session, name)]
        if name
        else session.scalars(select(OncallSchedule).order_by(OncallSchedule.name)).all()
    )
    out = []
    for row in rows:
        rotation = rotation_of(session, row)
        current: OnCall = rotation.on_call(now)
        horizon = now + GAP_HORIZON_S
        upcoming = rotation.shifts(now, horizon)
        # A shift still going at the horizon has no end we know: None, not the horizon itself (it
        # read as a handoff at this minute two weeks on).
        ends = upcoming[0].end if upcoming and upcoming[0].end < horizon else None
        out.append(
            {
                "schedule": row.name, "user": current.user, "source": current.source,
                "until": ends,
                "next": shift_dict(upcoming[1]) if len(upcoming) > 1 else None,
            }
        )  # fmt: skip
    return out


def add_override(
    session: Session, principal: Principal, name: str, user_name: str, start: float, end: float
) -> dict[str, Any]:
    row = schedule_by_name(session, name)
    user = session.get_one(User, _named_user(session, user_name, ("body", "user")))
    members = {m for layer in row.layers for m in layer.members}
    if not principal.is_admin and not (principal.user_id == user.id and user.id in members):
        raise Forbidden(
            f"only admins, or a member of {name!r} taking the shift themselves, may add overrides"
        )
    if end <= start:
        raise Invalid("end must be after start", ("body", "end"))
    if end <= time.time():  # it would change nothing, and the admin thought it would
        raise Invalid(
            f"the override ended at {utc_text(end)}, before now: it would put nobody on call", ("body", "end")
        )
    if end - start > 366 * 86400.0:
        raise Invalid("an override may last at most a year", ("body", "end"))
    override = OncallOverride(
        schedule_id=row.id,
        user_id=user.id,
        start=start,
        end=end,
        created_by=principal.name,
        created_at=time.time(),
    )
    session.add(override)
    session.flush()
    after = {"id": override.id, "user": user.name, "start": utc_text(start), "end": utc_text(end)}
    audit.record(
        session, actor=principal, action="oncall.override.add", target_kind="oncall_schedule",
        target_id=name, after=after,
    )  # fmt: skip
    session.commit()
    return {"id": override.id, "schedule": name, "user": user.name, "start": start, "end": end}


def remove_override(session: Session, principal: Principal, name: str, override_id: int) -> None:
    _admin(principal, "remove overrides")
    row = schedule_by_name(session, name)
    override = session.get(OncallOverride, override_id)
    if override is None or override.schedule_id != row.id:
        raise NotFound(f"schedule {name!r} has no override {override_id}")
    audit.record(
        session, actor=principal, action="oncall.override.remove", target_kind="oncall_schedule",
        target_id=name, before={"id": override.id, "start": override.start, "end": override.end},
    )  # fmt: skip
    session.delete(override)
    session.commit()


# --- escalation policies ------------------------------------------------------------------------


def policy_by_name(session: Session, name: str) -> EscalationPolicy:
    found = session.scalar(select(EscalationPolicy).where(EscalationPolicy.name == name))
    if found is None:
        raise NotFound(f"no escalation policy named {name!r}")
    return found


def _steps_from_spec(session: Session, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not specs:
        raise Invalid("a policy needs at least one step", ("body", "steps"))
    if len(specs) > MAX_STEPS:
        raise Invalid(f"a policy has at most {MAX_STEPS} steps", ("body", "steps"))
    out = []
    for i, spec in enumerate(specs):
        schedule, user = spec.get("schedule"), spec.get("user")
        if (schedule is None) == (user is None):
            raise Invalid(f"steps[{i}]: name exactly one of schedule or user", ("body", "steps", i))
        wait = float(spec.get("wait_minutes", 0)) * 60.0
        if not 0 <= wait <= 7 * 86400.0:
            raise Invalid(f"steps[{i}].wait_minutes must be 0 to 10080", ("body", "steps", i, "wait_minutes"))
        if schedule:
            known = session.scalar(select(OncallSchedule.id).where(OncallSchedule.name == schedule))
            if known is None:
                raise Invalid(f"no on-call schedule named {schedule!r}", ("body", "steps", i, "schedule"))
            target = {"schedule_id": known}
        else:
            target = {"user_id": _named_user(session, str(user), ("body", "steps", i, "user"))}
        out.append({**target, "wait_s": wait})
    return out


def policy_view(session: Session, row: EscalationPolicy) -> dict[str, Any]:
    schedules = dict(session.execute(select(OncallSchedule.id, OncallSchedule.name)).all())
    users = _user_names(session, {s["user_id"] for s in row.steps if "user_id" in s})
    steps = []
    for step in row.steps:
        target = (
            {"schedule": schedules.get(step["schedule_id"], f"#{step['schedule_id']}")}
            if "schedule_id" in step
            else {"user": users.get(step["user_id"], f"#{step['user_id']}")}
        )
        steps.append({**target, "wait_minutes": step["wait_s"] / 60.0})
    return {"name": row.name, "description": row.description, "repeat": row.repeat, "steps": steps}


def put_policy(
    session: Session, principal: Principal, name: str, spec: dict[str, Any]
) -> tuple[dict[str, Any], bool]:
    _admin(principal, "define escalation policies")
    check_name(name, "name")
    repeat = int(spec.get("repeat") or 0)
    if not 0 <= repeat <= MAX_REPEAT:
        raise Invalid(f"repeat must be 0 to {MAX_REPEAT}", ("body", "repeat"))
    steps = _steps_from_spec(session, list(spec.get("steps") or []))
    now = time.time()
    with _no_concurrent_change(session, f"escalation policy {name!r}"):
        row = session.scalar(select(EscalationPolicy).where(EscalationPolicy.name == name))
        created = row is None
        before = None if row is None else policy_view(session, row)
        if row is None:
            row = EscalationPolicy(name=name, created_at=now)
            session.add(row)
        row.steps, row.repeat, row.description, row.updated_at = (
            steps,
            repeat,
            spec.get("description") or "",
            now,
        )
        session.flush()
        after = policy_view(session, row)
        audit.record(
            session, actor=principal, action="oncall.policy.create" if created else "oncall.policy.update",
            target_kind="escalation_policy", target_id=name, before=before, after=after,
        )  # fmt: skip
        session.commit()
    return after, created


def list_policies(session: Session) -> list[dict[str, Any]]:
    return [
        policy_view(session, p)
        for p in session.scalars(select(EscalationPolicy).order_by(EscalationPolicy.name))
    ]


def delete_policy(session: Session, principal: Principal, name: str) -> None:
    _admin(principal, "delete escalation policies")
    row = policy_by_name(session, name)
    audit.record(
        session, actor=principal, action="oncall.policy.delete", target_kind="escalation_policy",
        target_id=name, before=policy_view(session, row),
    )  # fmt: skip
    session.delete(row)
    session.commit()


# --- iCal ---------------------------------------------------------------------------------------


def _ical_text(value: str) -> str:
    return value.replace("\\", "\\\\").replace(";", "\\;").replace(",", "\\,").replace("\n", "\\n")


def _fold(line: str) -> str:
    """RFC 5545 3.1: lines longer than 75 octets continue on lines that start with a space."""
    raw = line.encode()
    if len(raw) <= 75:
        return line
    parts, start = [], 0
    while start < len(raw):
        size = 75 if start == 0 else 74
        end = min(len(raw), start + size)
        while end < len(raw) and (raw[end] & 0xC0) == 0x80:  # never split a UTF-8 character
            end -= 1
        parts.append(raw[start:end].decode())
        start = end
    return "\r\n ".join(parts)


ICAL_REACH_S = 35 * 86400.0  # how far past its window the feed looks for its first and last shift


def _feed_shifts(rotation: Rotation, start: float, end: float) -> list[Shift]:
    """The shifts that overlap [start, end), whole: the first from its handoff before `start` and
    the last to its handoff after `end` (cut at either, the event's start or end and so its UID
    would change with every fetch). A shift longer than ICAL_REACH_S is cut at a UTC midnight."""
    day = 86400.0
    reach_start = (start - ICAL_REACH_S) // day * day
    reach_end = -((-(end + ICAL_REACH_S)) // day) * day
    shifts = rotation.shifts(reach_start, reach_end, with_fallback=False)
    return [s for s in shifts if s.end > start and s.start < end]


def ical_feed(session: Session, name: str, now: float, days: float = 28.0) -> str:
    """The schedule's shifts from a day ago to `days` ahead as an iCalendar (RFC 5545) feed, each
    whole (the first and last too); gaps appear as "nobody on call" events so that they show in
    the calendar too."""
    return ical_of(session, schedule_by_name(session, name), now, days)


def ical_of(session: Session, row: OncallSchedule, now: float, days: float = 28.0) -> str:
    """`ical_feed` of a schedule already loaded (the feed route's, found by its URL's token)."""
    name, rotation = row.name, rotation_of(session, row)
    stamp = datetime.fromtimestamp(now, UTC).strftime("%Y%m%dT%H%M%SZ")

    def utc(ts: float) -> str:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y%m%dT%H%M%SZ")

    lines = [
        "BEGIN:VCALENDAR", "VERSION:2.0", "PRODID:-//Corral//On-call//EN", "CALSCALE:GREGORIAN",
        f"X-WR-CALNAME:{_ical_text(f'On call: {name}')}", f"X-WR-TIMEZONE:{row.time_zone}",
    ]  # fmt: skip
    for shift in _feed_shifts(rotation, now - 86400.0, now + days * 86400.0):
        who = shift.user or (f"gap (fallback {rotation.fallback})" if rotation.fallback else "gap: nobody")
        lines += [
            "BEGIN:VEVENT", f"UID:{name}-{int(shift.start)}-{int(shift.end)}@corral", f"DTSTAMP:{stamp}",
            f"DTSTART:{utc(shift.start)}", f"DTEND:{utc(shift.end)}",
            f"SUMMARY:{_ical_text(f'{who} on call ({name})')}",
            f"DESCRIPTION:{_ical_text(f'source: {shift.source}')}", "END:VEVENT",
        ]  # fmt: skip
    lines.append("END:VCALENDAR")
    return "\r\n".join(_fold(line) for line in lines) + "\r\n"
