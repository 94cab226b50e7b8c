"""Stable Unix ids for the local engine: a uid per user and a gid per group, allocated from
`CORRAL_UID_RANGE` / `CORRAL_GID_RANGE` on first need, recorded in `storage_identities` and never
given to anyone else (rows are never deleted; a new number is always above every number given).

On Slurm the engine's user map (engine/slurm/users.py) says which Unix account runs a user's
jobs; that account's uid owns the user's home and outputs there, and the group gids recorded here
are the gids the site gives its Unix groups (docs/storage.md, "Slurm").
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import and_, func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from corral.db.models import Group, Membership, User
from corral.db.storage_models import StorageIdentity

ALLOCATE_TRIES = 8  # concurrent allocations collide on the unique number; each retry takes the next


@dataclass(frozen=True, slots=True)
class IdRange:
    low: int
    high: int  # inclusive

    @classmethod
    def parse(cls, setting: str, text: str) -> IdRange:
        low_s, sep, high_s = text.partition("-")
        try:
            low, high = int(low_s), int(high_s)
        except ValueError:
            raise ValueError(f"{setting}={text!r}: write it as LOW-HIGH, e.g. 300000-399999") from None
        if not sep or low < 1000 or high < low or high > 2**31 - 2:
            raise ValueError(f"{setting}={text!r}: need 1000 <= LOW <= HIGH < 2^31-1")
        return cls(low, high)

    def overlaps(self, other: IdRange) -> bool:
        return self.low <= other.high and other.low <= self.high


class IdsExhausted(RuntimeError):
    pass


def _allocate(
    session: Session, kind: str, subject_id: int, created_at: float, name: str, rng: IdRange
) -> int:
    for _ in range(ALLOCATE_TRIES):
        top = session.scalar(
            select(func.max(StorageIdentity.number)).where(
                StorageIdentity.kind == kind, StorageIdentity.number.between(rng.low, rng.high)
            )
        )
        number = rng.low if top is None else top + 1
        if number > rng.high:
            raise IdsExhausted(f"no {kind} id left in {rng.low}-{rng.high}: widen the range")
        row = StorageIdentity(
            kind=kind,
            subject_id=subject_id,
            subject_created_at=created_at,
            subject_name=name,
            number=number,
            created_at=time.time(),
        )
        try:
            with session.begin_nested():
                session.add(row)
        except IntegrityError:
            found = _lookup(session, kind, [(subject_id, created_at)])
            if (subject_id, created_at) in found:
                return found[(subject_id, created_at)]
            continue  # the number was taken meanwhile: try the next
        return number
    raise IdsExhausted(f"could not allocate a {kind} id after {ALLOCATE_TRIES} tries")


def _lookup(
    session: Session, kind: str, subjects: Iterable[tuple[int, float]]
) -> dict[tuple[int, float], int]:
    wanted = list(subjects)
    if not wanted:
        return {}
    rows = session.execute(
        select(StorageIdentity.subject_id, StorageIdentity.subject_created_at, StorageIdentity.number).where(
            StorageIdentity.kind == kind, StorageIdentity.subject_id.in_({s for s, _ in wanted})
        )
    ).all()
    return {
        (r.subject_id, r.subject_created_at): r.number
        for r in rows
        if (r.subject_id, r.subject_created_at) in set(wanted)
    }


def ensure_ids(
    session: Session, users: Iterable[User], groups: Iterable[Group], uid_range: IdRange, gid_range: IdRange
) -> tuple[dict[int, int], dict[int, int]]:
    """({user id: uid}, {group id: gid}), allocating what is missing (not committed here)."""
    users, groups = list(users), list(groups)
    uids = _lookup(session, "user", [(u.id, u.created_at) for u in users])
    gids = _lookup(session, "group", [(g.id, g.created_at) for g in groups])
    known_uids = {u.id: uids[(u.id, u.created_at)] for u in users if (u.id, u.created_at) in uids}
    known_gids = {g.id: gids[(g.id, g.created_at)] for g in groups if (g.id, g.created_at) in gids}
    return allocate_missing(session, users, groups, known_uids, known_gids, uid_range, gid_range)


def allocate_missing(
    session: Session,
    users: Iterable[User],
    groups: Iterable[Group],
    known_uids: Mapping[int, int],
    known_gids: Mapping[int, int],
    uid_range: IdRange,
    gid_range: IdRange,
) -> tuple[dict[int, int], dict[int, int]]:
    """ensure_ids for a caller that read the numbers already given ({user id: uid}, {group id:
    gid}, each matched on the subject's id and created_at, as `_lookup` matches them) in the same
    transaction, e.g. joined into another read (storage.plan): the others are allocated."""
    by_user = {
        u.id: known_uids[u.id]
        if u.id in known_uids
        else _allocate(session, "user", u.id, u.created_at, u.name, uid_range)
        for u in users
    }
    by_group = {
        g.id: known_gids[g.id]
        if g.id in known_gids
        else _allocate(session, "group", g.id, g.created_at, g.name, gid_range)
        for g in groups
    }
    return by_user, by_group


def list_ids(session: Session) -> list[StorageIdentity]:
    return list(
        session.scalars(select(StorageIdentity).order_by(StorageIdentity.kind, StorageIdentity.number))
    )


@dataclass(frozen=True, slots=True)
class GroupGid:
    """A Corral group given a gid (its dir on the storage root is of that gid) and its active
    members' user names."""

    name: str
    gid: int
    members: tuple[str, ...]


def groups_with_gids(session: Session) -> list[GroupGid]:
    """Every group that has a gid, by gid: those a job has bound, or `corral storage ids` gave."""
    rows = session.execute(
        select(Group.name, StorageIdentity.number, User.name)
        .join(
            StorageIdentity,
            and_(
                StorageIdentity.kind == "group",
                StorageIdentity.subject_id == Group.id,
                StorageIdentity.subject_created_at == Group.created_at,
            ),
        )
        .outerjoin(Membership, Membership.group_id == Group.id)
        .outerjoin(User, and_(User.id == Membership.user_id, User.active.is_(True)))
        .order_by(StorageIdentity.number, User.name)
    ).all()
    found: dict[tuple[str, int], list[str]] = {}
    for group, gid, member in rows:
        members = found.setdefault((group, gid), [])
        if member is not None:
            members.append(member)
    return [GroupGid(name, gid, tuple(members)) for (name, gid), members in found.items()]
