"""The admin audit log: `record` writes one row per state-changing action, in the caller's
transaction (a rolled-back change leaves no record; a committed one always has its record);
`list_records` reads them back for `GET /api/v1/audit`; `purge_before` is retention, the only
way a row ever leaves the table (the database refuses any other UPDATE or DELETE:
corral.db.audit_models).

Any service may call `record`: it needs only the SQLAlchemy session and the actor (a Principal,
whose `source` is the request's address, or a system name such as "system:retention").
Secrets never reach the table: `redact` replaces the values of secret-looking keys in before/after.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, delete, func, or_, select, update
from sqlalchemy.orm import Session

from corral.db.audit_models import AuditPurgeGate, AuditRecord
from corral.services.auth import Principal
from corral.services.errors import Invalid

REDACTED = "[redacted]"
# Keys whose values are secrets wherever they appear in before/after (case-insensitive, a match
# anywhere in the key: "password_hash", "token_hash", "csrf_token", "api_key", "secret_value").
SECRET_KEY_RE = re.compile(r"password|secret|token|hash|csrf|api_key|private_key|credential", re.I)
# Keys that match the pattern but name no secret: a token's public id, prefix and name are what an
# auditor needs to tell tokens apart.
NOT_SECRET_KEYS = frozenset({"token_id", "token_name", "token_prefix", "prefix", "name"})
ACTION_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")
MAX_PAGE = 1000
DETAIL_MAX = 2000
SYSTEM_PREFIX = "system:"
# What a record's target can be: `record` refuses any other kind, so a `GET /audit?target=` kind
# outside this set can match nothing and is refused (422) instead of listing nothing.
TARGET_KINDS = frozenset(
    {
        "attempt",
        "audit",
        "cluster",
        "dataset",
        "environment",
        "escalation_policy",
        "gpu",
        "group",
        "incident",
        "job",
        "lockout",
        "model",
        "node",
        "oncall_schedule",
        "page",
        "rule",
        "rules",
        "secret",
        "session",
        "ssh_key",
        "storage",
        "template",
        "token",
        "user",
        "workspace",
    }
)


def redact(value: Any) -> Any:
    """`value` with the value of every secret-looking key replaced by REDACTED, recursively."""
    if isinstance(value, Mapping):
        return {
            str(k): (REDACTED if _is_secret_key(str(k)) and v is not None else redact(v))
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no Infinity/NaN
    return value


def _is_secret_key(key: str) -> bool:
    return key.lower() not in NOT_SECRET_KEYS and SECRET_KEY_RE.search(key) is not None


def record(
    session: Session,
    *,
    actor: Principal | str,
    action: str,
    target_kind: str,
    target_id: str | int,
    before: Mapping[str, Any] | None = None,
    after: Mapping[str, Any] | None = None,
    source: str | None = None,
    detail: str | None = None,
    now: float | None = None,
) -> AuditRecord:
    """Add one audit row to `session`'s transaction (flushed, not committed: the caller commits
    it with the change it describes). `actor`: the Principal acting (its name, user id, credential
    and source address are taken from it) or a system name ("system:<loop>"). `action`: a dotted
    verb, "<kind>.<verb>" (e.g. "user.role.set"). `source` overrides the principal's address.
    `before`/`after`: the target's relevant state (redacted here: no secret is ever stored)."""
    if not ACTION_RE.match(action):
        raise ValueError(f"audit action {action!r} must be dotted lower-case words, e.g. 'group.quota.set'")
    if target_kind not in TARGET_KINDS:
        raise ValueError(f"audit target kind {target_kind!r} is not one of TARGET_KINDS: add it there")
    if isinstance(actor, Principal):
        name, user_id, credential, where = actor.name, actor.user_id, actor.credential, actor.source
    else:
        if not actor.startswith(SYSTEM_PREFIX):
            raise ValueError(f"a non-principal audit actor must be 'system:<name>', not {actor!r}")
        name, user_id, credential, where = actor, None, None, None
    row = AuditRecord(
        at=time.time() if now is None else now,
        actor=name,
        actor_user_id=user_id,
        credential=credential,
        source=source if source is not None else where,
        action=action,
        target_kind=target_kind,
        target_id=str(target_id),
        before=None if before is None else redact(before),
        after=None if after is None else redact(after),
        detail=None if detail is None else detail[:DETAIL_MAX],
    )
    session.add(row)
    session.flush()
    return row


# --- reading ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditFilter:
    """`actor`: exact name; `action`: a prefix on dot boundaries ("group" matches "group.quota.set",
    not "groups.x"); `target_kind`/`target_id`: exact; `since`/`until`: unix seconds (until
    exclusive); newest first, `limit` rows after `offset`."""

    actor: str | None = None
    action: str | None = None
    target_kind: str | None = None
    target_id: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100
    offset: int = 0


def _conditions(flt: AuditFilter) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if flt.actor is not None:
        where.append(AuditRecord.actor == flt.actor)
    if flt.action is not None:
        prefix = flt.action.rstrip(".")
        where.append(
            or_(AuditRecord.action == prefix, AuditRecord.action.startswith(prefix + ".", autoescape=True))
        )
    if flt.target_kind is not None:
        where.append(AuditRecord.target_kind == flt.target_kind)
    if flt.target_id is not None:
        where.append(AuditRecord.target_id == flt.target_id)
    if flt.since is not None:
        where.append(AuditRecord.at >= flt.since)
    if flt.until is not None:
        where.append(AuditRecord.at < flt.until)
    return where


def list_records(session: Session, flt: AuditFilter) -> tuple[list[AuditRecord], int]:
    """The matching records, newest first (one page), and how many match in all."""
    if not 1 <= flt.limit <= MAX_PAGE:
        raise Invalid(f"limit must be between 1 and {MAX_PAGE}", ("query", "limit"))
    if flt.since is not None and flt.until is not None and flt.until <= flt.since:
        raise Invalid("until must be later than since", ("query", "until"))
    where = _conditions(flt)
    total = int(session.scalar(select(func.count()).select_from(AuditRecord).where(*where)) or 0)
    rows = session.scalars(
        select(AuditRecord)
        .where(*where)
        .order_by(AuditRecord.at.desc(), AuditRecord.id.desc())
        .limit(flt.limit)
        .offset(flt.offset)
    )
    return list(rows), total


def record_view(row: AuditRecord) -> dict[str, Any]:
    return {
        "id": row.id,
        "at": row.at,
        "actor": row.actor,
        "credential": row.credential,
        "source": row.source,
        "action": row.action,
        "target_kind": row.target_kind,
        "target_id": row.target_id,
        "before": row.before,
        "after": row.after,
        "detail": row.detail,
    }


DURATION_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def check_target_kind(kind: str) -> str:
    """`kind` of a `target` filter (KIND or KIND:ID), or a 422 naming it and the kinds recorded."""
    if kind not in TARGET_KINDS:
        raise Invalid(
            f"target kind {kind!r} is not one the audit log records; "
            f"use one of {', '.join(sorted(TARGET_KINDS))}",
            ("query", "target"),
        )
    return kind


# The latest time a bound may name (the year 5138): no inf, no nan, which SQLite binds as NULL
# (matching nothing) while PostgreSQL compares them (`until=nan` matched every row).
MAX_UNIX_S = 1e11


def parse_time(value: str, now: float, field: str) -> float:
    """A time for --since/--until: an age ("90m", "7d", "2w": that long before now), unix
    seconds, or an ISO 8601 date/time (UTC unless it says otherwise); a 422 naming the field and
    the value when it is none of them or outside 1970 to the year 5138."""
    at = _parse_time(value, now, field)
    if not math.isfinite(at) or not 0 <= at <= MAX_UNIX_S:
        raise Invalid(
            f"{field} {value!r} is out of range: give a time from 1970 to the year 5138", ("query", field)
        )
    return at


def _parse_time(value: str, now: float, field: str) -> float:
    text = value.strip()
    age = DURATION_RE.match(text)
    if age:
        return now - float(age.group(1)) * DURATION_UNITS[age.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import UTC, datetime

    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise Invalid(
            f"{field} {value!r} is not a time: give an age such as '7d', '12h' or '30m', unix seconds, "
            "or an ISO date such as 2026-11-25T14:00",
            ("query", field),
        )
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


# --- retention --------------------------------------------------------------------------------


def purge_before(session: Session, cutoff: float) -> int:
    """Delete the records written before `cutoff` and commit; returns how many. The only path
    that may delete: it opens the database's purge gate for this transaction alone (set, delete,
    close, then commit), records that it ran, and commits the three together."""
    opened = session.execute(update(AuditPurgeGate).where(AuditPurgeGate.id == 1).values(cutoff=cutoff))
    if opened.rowcount == 0:  # type: ignore[attr-defined]  # a database emptied by hand: restore the row
        session.add(AuditPurgeGate(id=1, cutoff=cutoff))
        session.flush()
    deleted = session.execute(delete(AuditRecord).where(AuditRecord.at < cutoff)).rowcount  # type: ignore[attr-defined]
    session.execute(update(AuditPurgeGate).where(AuditPurgeGate.id == 1).values(cutoff=None))
    if deleted:
        record(
            session,
            actor="system:retention",
            action="audit.purge",
            target_kind="audit",
            target_id="*",
            after={"deleted": deleted, "before": cutoff},
        )
    session.commit()
    return int(deleted)
