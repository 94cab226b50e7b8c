"""Storage quotas (bytes and files) per user and per group, and the usage they are held against.

Usage is accounted incrementally, never by a `du` on a request path:
- datasets: a version's bytes and files are added to its owner's account in the transaction that
  publishes it, and taken off in the one that deletes it; registered model versions the same, to
  their model's owner (corral.catalog.models), in the same `dataset_*` columns;
- homes and group directories (`<storage root>/home/<user>`, `<storage root>/group/<group>`): a
  leased background loop (corral.datasets.loops) scans them every CORRAL_STORAGE_SCAN_INTERVAL_S
  and stores the totals (no filesystem project quotas are used: the scan works on any filesystem).

An upload is checked before any byte is written (its declared size and file count, plus the bytes
other open uploads of the same owner declared) and again with every chunk (a quota may be lowered
meanwhile). The schedule loop reads the groups over their storage quota in one SELECT and the
scheduler keeps their new jobs waiting (`corral.scheduler.admission.storage_refusal`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session, object_session

from corral.datasets.models import DatasetUpload, StorageAccount
from corral.datasets.names import human_bytes
from corral.db.base import lock_row
from corral.db.models import Group, User
from corral.services.errors import Forbidden, NotFound
from corral.words import plural

SCOPES = ("user", "group")


class QuotaExceeded(Forbidden):
    """Refused because a storage quota would be exceeded (403, the message says by how much)."""


def account(session: Session, scope: str, name: str) -> StorageAccount:
    """The account row, created (no quota, nothing used) on first use."""
    row = session.get(StorageAccount, (scope, name))
    if row is None:
        row = StorageAccount(
            scope=scope, name=name, dataset_bytes=0, dataset_files=0, scanned_bytes=0, scanned_files=0
        )
        session.add(row)
        session.flush()
    return row


def owner_account(session: Session, owner_user_id: int | None, owner_group_id: int | None) -> StorageAccount:
    if owner_group_id is not None:
        group = session.get(Group, owner_group_id)
        assert group is not None
        return account(session, "group", group.name)
    user = session.get(User, owner_user_id)
    assert user is not None
    return account(session, "user", user.name)


def lock_account(row: StorageAccount) -> StorageAccount:
    """`row`, locked until its transaction ends and re-read: what was committed by then. Without
    it two requests for one owner both read the same usage and act on it (two uploads started at
    once, each under the quota, together over it; two versions charged at once, one charge lost).
    Take it before touching other datasets' rows (one lock order: no deadlock)."""
    session = object_session(row)
    assert session is not None
    if not lock_row(session, row):
        raise RuntimeError(f"storage account {row.scope}/{row.name} is gone (accounts are never deleted)")
    return row


def charge_dataset(row: StorageAccount, nbytes: int, nfiles: int) -> None:
    """Add a version's bytes and files to (or take them off) `row`, which `lock_account` returned
    in this transaction: added to what is committed, not to what this request read earlier."""
    row.dataset_bytes = max(0, row.dataset_bytes + nbytes)
    row.dataset_files = max(0, row.dataset_files + nfiles)


def reserved_by_uploads(
    session: Session, owner_user_id: int | None, owner_group_id: int | None, but: str
) -> tuple[int, int]:
    """Bytes and files that the owner's other open uploads declared (they will land soon)."""
    owner = (
        DatasetUpload.owner_group_id == owner_group_id
        if owner_group_id is not None
        else (DatasetUpload.owner_user_id == owner_user_id) & DatasetUpload.owner_group_id.is_(None)
    )
    row = session.execute(
        select(
            func.coalesce(func.sum(DatasetUpload.declared_bytes), 0),
            func.coalesce(func.sum(DatasetUpload.declared_files), 0),
        ).where(owner, DatasetUpload.state == "open", DatasetUpload.id != but)
    ).one()
    return int(row[0]), int(row[1])


def check_room(
    row: StorageAccount,
    nbytes: int,
    nfiles: int,
    reserved: tuple[int, int] = (0, 0),
    what: str = "this upload",
) -> None:
    """QuotaExceeded when `nbytes`/`nfiles` more would take the account over its quota; `what`
    names the files in the message (an upload, a model version)."""
    who = f"{row.scope} {row.name}"
    if row.max_bytes is not None and row.used_bytes + reserved[0] + nbytes > row.max_bytes:
        raise QuotaExceeded(
            f"storage quota exceeded: {who} may hold {human_bytes(row.max_bytes)}; it holds "
            f"{human_bytes(row.used_bytes)}"
            + (f" (+{human_bytes(reserved[0])} in other uploads)" if reserved[0] else "")
            + f" and {what} needs {human_bytes(nbytes)}; nothing was written"
        )
    if row.max_files is not None and row.used_files + reserved[1] + nfiles > row.max_files:
        raise QuotaExceeded(
            f"file quota exceeded: {who} may hold {plural(row.max_files, 'file')}; it holds {row.used_files}"
            + (f" (+{reserved[1]} in other uploads)" if reserved[1] else "")
            + f" and {what} has {nfiles}; nothing was written"
        )


def set_quota(session: Session, scope: str, name: str, fields: dict[str, int | None]) -> StorageAccount:
    """Admins: change the quota fields given (`max_bytes`, `max_files`; None = no limit)."""
    if scope == "group":
        if session.scalar(select(Group.id).where(Group.name == name)) is None:
            raise NotFound(f"no group named {name!r}")
    elif session.scalar(select(User.id).where(User.name == name)) is None:
        raise NotFound(f"no user named {name!r}")
    row = account(session, scope, name)
    for key in ("max_bytes", "max_files"):
        if key in fields:
            setattr(row, key, fields[key])
    return row


def over_quota(row: StorageAccount) -> str | None:
    """Why the account is over its storage quota, or None."""
    if row.max_bytes is not None and row.used_bytes > row.max_bytes:
        return (
            f"{row.scope} {row.name} holds {human_bytes(row.used_bytes)} of storage, over its quota "
            f"of {human_bytes(row.max_bytes)}; free some space (corral storage usage)"
        )
    if row.max_files is not None and row.used_files > row.max_files:
        holds = plural(row.used_files, "file")
        return f"{row.scope} {row.name} holds {holds}, over its quota of {row.max_files}"
    return None


def groups_over_quota(session: Session) -> dict[str, str]:
    """group name -> why it is over its storage quota. One SELECT (the schedule loop's snapshot)."""
    rows = session.scalars(
        select(StorageAccount).where(
            StorageAccount.scope == "group",
            or_(StorageAccount.max_bytes.is_not(None), StorageAccount.max_files.is_not(None)),
        )
    )
    out = {}
    for row in rows:
        why = over_quota(row)
        if why is not None:
            out[row.name] = why
    return out


@dataclass(frozen=True)
class UsageRow:
    scope: str
    name: str
    used_bytes: int
    used_files: int
    dataset_bytes: int
    scanned_bytes: int
    max_bytes: int | None
    max_files: int | None
    scanned_at: float | None

    def view(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {
            "over_quota": self.over is not None
        }

    @property
    def over(self) -> str | None:
        if self.max_bytes is not None and self.used_bytes > self.max_bytes:
            return "bytes"
        if self.max_files is not None and self.used_files > self.max_files:
            return "files"
        return None


def usage_rows(
    session: Session, users: set[str] | None = None, groups: set[str] | None = None
) -> list[UsageRow]:
    """Every account (None filters), sorted; the rows a caller may see are the router's choice."""
    out = []
    for row in session.scalars(select(StorageAccount).order_by(StorageAccount.scope, StorageAccount.name)):
        if row.scope == "user" and users is not None and row.name not in users:
            continue
        if row.scope == "group" and groups is not None and row.name not in groups:
            continue
        out.append(
            UsageRow(
                row.scope, row.name, row.used_bytes, row.used_files, row.dataset_bytes, row.scanned_bytes,
                row.max_bytes, row.max_files, row.scanned_at,
            )
        )  # fmt: skip
    return out


def metric_samples(session: Session) -> list[tuple[str, str, str, int]]:
    """(metric, scope, name, value) for /metrics: corral_storage_used_bytes, _used_files and,
    where set, corral_storage_quota_bytes, _quota_files."""
    out = []
    for r in usage_rows(session):
        out.append(("corral_storage_used_bytes", r.scope, r.name, r.used_bytes))
        out.append(("corral_storage_used_files", r.scope, r.name, r.used_files))
        if r.max_bytes is not None:
            out.append(("corral_storage_quota_bytes", r.scope, r.name, r.max_bytes))
        if r.max_files is not None:
            out.append(("corral_storage_quota_files", r.scope, r.name, r.max_files))
    return out
