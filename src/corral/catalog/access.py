"""Who may read and manage a catalogue entry (a template or a model): one rule for both.

Read: a platform admin, the owner, members of the entry's group when it is shared with the group,
everyone when it is public. Manage (new versions, stages, sharing, deletion): a platform admin,
the owner, or an admin of the entry's group. An entry the caller may not read is "not found",
never "forbidden": its name is not a leak."""

from __future__ import annotations

import re
from typing import Protocol, TypeVar

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.db.models import Group
from corral.services import audit
from corral.services.accounts import visible_group_id
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound

VISIBILITIES = ("private", "group", "public")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_PATTERN = NAME_RE.pattern


class Shared(Protocol):
    owner_user_id: int
    group_id: int | None
    visibility: str


class NamedShared(Shared, Protocol):
    name: str


Entry = TypeVar("Entry", bound=NamedShared)


def check_name(what: str, name: str) -> str:
    if not NAME_RE.match(name):
        raise Invalid(
            f"{what} name {name!r} must be 1-64 letters, digits, '.', '_' or '-', starting with a "
            "letter or digit",
            ("body", "name"),
        )
    return name


def name_taken(kind: str, name: str) -> Conflict:
    """The one answer of every catalogue's create path (templates, models, datasets, environments)
    for a name another user holds, whether or not the caller may see that entry. Names are global,
    so that a name is taken cannot be hidden; one status and one wording for all four keep it
    to that, and say nothing of the entry (docs/security.md)."""
    return Conflict(f"{kind} name {name!r} is taken by another user; choose another")


def can_read(entry: Shared, principal: Principal) -> bool:
    if principal.is_admin or entry.owner_user_id == principal.user_id or entry.visibility == "public":
        return True
    return entry.visibility == "group" and entry.group_id is not None and principal.is_member(entry.group_id)


def can_read_as(entry: Shared, user_id: int, group_ids: set[int], is_admin: bool) -> bool:
    """can_read for a mount, which knows the user by id and its groups, not a Principal."""
    if is_admin or entry.owner_user_id == user_id or entry.visibility == "public":
        return True
    return entry.visibility == "group" and entry.group_id in group_ids


def can_manage(entry: Shared, principal: Principal) -> bool:
    if principal.is_admin or entry.owner_user_id == principal.user_id:
        return True
    return entry.group_id is not None and principal.is_group_admin(entry.group_id)


def readable(session: Session, entity: type[Entry], kind: str, name: str, principal: Principal) -> Entry:
    """The entry of that kind and name that the caller may read; else "not found" (not a leak)."""
    check_name(kind, name)
    row = session.scalar(select(entity).filter_by(name=name))
    if row is None or not can_read(row, principal):
        raise NotFound(f"no {kind} named {name!r}")
    return row


def managed(session: Session, entity: type[Entry], kind: str, name: str, principal: Principal) -> Entry:
    row = readable(session, entity, kind, name, principal)
    if not can_manage(row, principal):
        raise Forbidden(f"only the owner of {kind} {name!r} (or an admin of its group) may change it")
    return row


def group_id_of(session: Session, principal: Principal, name: str | None) -> int | None:
    """The id of group `name`, which the caller must be a member of (None: no group)."""
    if name is None:
        return None
    return visible_group_id(session, principal, name)


def group_name(session: Session, group_id: int | None) -> str | None:
    return None if group_id is None else session.scalar(select(Group.name).where(Group.id == group_id))


def flush_or_conflict(session: Session, what: str) -> None:
    """Flush new rows; a concurrent request that took the same name or version number first
    makes this one a 409 (try again), not a 500."""
    try:
        session.flush()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"{what} was changed by a concurrent request; try again") from None


def check_sharing(visibility: str, group_id: int | None) -> None:
    if visibility not in VISIBILITIES:
        raise Invalid(f"visibility must be one of {', '.join(VISIBILITIES)}", ("body", "visibility"))
    if visibility == "group" and group_id is None:
        raise Invalid(
            "visibility 'group' needs a group: name one with 'group' (`--group` in the CLI)",
            ("body", "group"),
        )


def share_entry(
    session: Session,
    principal: Principal,
    entry: Shared,
    *,
    kind: str,
    name: str,
    visibility: str,
    group: str | None,
) -> None:
    """Set a template's or model's visibility (and group), audited as `<kind>.share`; the caller
    has checked that `principal` manages it and commits."""
    before = {"visibility": entry.visibility, "group": group_name(session, entry.group_id)}
    group_id = group_id_of(session, principal, group) if group is not None else entry.group_id
    check_sharing(visibility, group_id)
    entry.visibility, entry.group_id = visibility, group_id
    audit.record(
        session,
        actor=principal,
        action=f"{kind}.share",
        target_kind=kind,
        target_id=name,
        before=before,
        after={"visibility": visibility, "group": group_name(session, group_id)},
    )
