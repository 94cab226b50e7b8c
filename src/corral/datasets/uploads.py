"""Upload sessions: how a version is pushed in chunks, resumably, checksummed and atomically.

1. `start`: the client declares the name, owner, total bytes and files and the manifest digest
   (names.manifest_digest). The quota is checked here, before any byte is written. A session
   with the same owner, name and digest that is still open is returned instead (resume).
2. `register_files`: the manifest, in batches (path, size, sha256); idempotent.
3. `write_chunk`: bytes of one file at exactly the offset received so far (a resumed client
   asks `pending` where each file stands); a file whose last byte arrives is checked against its
   sha256 (a mismatch starts that file again).
4. `complete`: every file there and checked, the digest recomputed from the rows: the staging
   directory is renamed to the next version's directory and the version row committed.

Open sessions idle for CORRAL_DATASET_UPLOAD_TIMEOUT_S are removed with their staged bytes
(`clean_stale`, run by the leased loop in corral.datasets.loops).
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.exc import StaleDataError

from corral.catalog.access import name_taken
from corral.catalog.retired import carried_over
from corral.datasets.models import Dataset, DatasetUpload, DatasetUploadFile, DatasetVersion
from corral.datasets.names import BadName, check_name, check_path, check_plain, manifest_digest
from corral.datasets.quotas import (
    charge_dataset,
    check_room,
    lock_account,
    owner_account,
    reserved_by_uploads,
)
from corral.datasets.service import Reader, can_push, can_read, owner_words, versions_of
from corral.datasets.store import Store, UploadGone, fd_sha256, file_sha256, walk_files, write_at
from corral.db.base import lock_row
from corral.db.models import Group
from corral.services.accounts import visible_group_id
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.words import plural

MAX_BATCH = 1000  # manifest entries per register_files call
UPLOAD_ID = re.compile(r"[0-9a-f]{32}")
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()


def _owner(
    session: Session, principal: Principal, name: str, group: str | None
) -> tuple[int | None, int | None]:
    """(owner user id, owner group id) of a push: the existing dataset's owner (which the caller
    must be able to push to), else the group asked for (the caller must belong to it) or the caller."""
    existing = session.scalar(select(Dataset).where(Dataset.name == name))
    if existing is not None:
        if not can_push(existing, principal):
            if can_read(session, existing, Reader.of(principal)):  # shared with the caller
                raise Forbidden(
                    f"dataset {name!r} is shared with you to read only: new versions come from its "
                    f"owner ({owner_words(session, existing)}); push yours under another name"
                )
            raise name_taken("dataset", name)
        if group is not None:
            owner_group = session.get(Group, existing.owner_group_id) if existing.owner_group_id else None
            if owner_group is None or owner_group.name != group:
                raise Conflict(f"dataset {name!r} exists and is not owned by group {group!r}")
        return existing.owner_user_id, existing.owner_group_id
    if group is None:
        return principal.user_id, None
    return None, visible_group_id(session, principal, group)


def start(
    session: Session,
    store: Store,
    principal: Principal,
    *,
    name: str,
    group: str | None,
    total_bytes: int,
    total_files: int,
    digest: str,
    now: float,
) -> tuple[DatasetUpload, bool]:
    """(the session, whether it is an existing one resumed)."""
    try:
        check_name(name)
        check_plain(group or "", "group name")
    except BadName as exc:
        raise Invalid(str(exc), ("body", "name"))
    if total_files < 1:
        raise Invalid("a dataset version holds at least one file", ("body", "files"))
    owner_user, owner_group = _owner(session, principal, name, group)
    existing = session.scalar(select(Dataset).where(Dataset.name == name))
    if existing is not None:
        for row in versions_of(session, existing.id):
            if row.digest == digest:
                raise Conflict(
                    f"dataset {name!r} v{row.version} already holds exactly this content "
                    f"(digest {digest[:12]}); nothing to upload"
                )
    resumed = session.scalar(
        select(DatasetUpload).where(
            DatasetUpload.dataset_name == name,
            DatasetUpload.manifest_digest == digest,
            DatasetUpload.state == "open",
            DatasetUpload.created_by == principal.name,
            # the same owner too (docs/datasets.md): a push for oneself must not resume one for a
            # group, nor the reverse (`== None` is IS NULL in SQL)
            DatasetUpload.owner_user_id == owner_user,
            DatasetUpload.owner_group_id == owner_group,
        )
    )
    if resumed is not None:
        resumed.updated_at = now
        session.commit()
        return resumed, True
    # Locked: a concurrent start for the same owner waits, then counts this upload as reserved.
    owner_row = lock_account(owner_account(session, owner_user, owner_group))
    check_room(owner_row, total_bytes, total_files, reserved_by_uploads(session, owner_user, owner_group, ""))
    upload = DatasetUpload(
        id=secrets.token_hex(16),
        dataset_name=name,
        owner_user_id=owner_user,
        owner_group_id=owner_group,
        created_by=principal.name,
        declared_bytes=total_bytes,
        declared_files=total_files,
        manifest_digest=digest,
        registered_bytes=0,
        registered_files=0,
        received_bytes=0,
        state="open",
        created_at=now,
        updated_at=now,
    )
    session.add(upload)
    session.commit()
    store.staging_dir(upload.id).mkdir(parents=True, mode=0o700)
    return upload, False


def get(session: Session, principal: Principal, upload_id: str) -> DatasetUpload:
    upload = session.get(DatasetUpload, upload_id) if UPLOAD_ID.fullmatch(upload_id) else None
    if upload is None or (upload.created_by != principal.name and not principal.is_admin):
        raise NotFound(f"no upload {upload_id!r} (aborted, finished long ago, or removed after its timeout)")
    return upload


def open_uploads(session: Session, principal: Principal) -> list[DatasetUpload]:
    query = select(DatasetUpload).where(DatasetUpload.state == "open").order_by(DatasetUpload.created_at)
    if not principal.is_admin:
        query = query.where(DatasetUpload.created_by == principal.name)
    return list(session.scalars(query))


def _open(session: Session, principal: Principal, upload_id: str) -> DatasetUpload:
    upload = get(session, principal, upload_id)
    if upload.state != "open":
        raise Conflict(f"upload {upload_id} is finished (dataset {upload.dataset_name!r} v{upload.version})")
    return upload


def register_files(
    session: Session,
    store: Store,
    principal: Principal,
    upload_id: str,
    files: list[tuple[str, int, str]],
    now: float,
) -> DatasetUpload:
    upload = _open(session, principal, upload_id)
    if len(files) > MAX_BATCH:
        raise Invalid(f"at most {MAX_BATCH} files per call", ("body", "files"))
    for i, (path, _size, _sha) in enumerate(files):  # before any query: PostgreSQL refuses NUL
        try:
            check_path(path)
        except BadName as exc:
            raise Invalid(str(exc), ("body", "files", i, "path"))
    # Locked and re-read before the files registered are read: the same batch sent twice at once
    # (a client retrying) waits for the first, then finds its files there (idempotent); unlocked,
    # both inserted the same rows and the second commit failed on the primary key (500).
    if not lock_row(session, upload) or upload.state != "open":
        session.rollback()
        raise Conflict(f"upload {upload_id} was aborted or finished meanwhile")
    paths = [f[0] for f in files]
    known = {
        r.path: r
        for r in session.scalars(
            select(DatasetUploadFile).where(
                DatasetUploadFile.upload_id == upload.id, DatasetUploadFile.path.in_(paths)
            )
        )
    }
    seen: set[str] = set()
    empty: list[str] = []
    for i, (path, size, sha) in enumerate(files):
        if size < 0 or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            raise Invalid(
                f"{path!r}: size must be >= 0 and sha256 64 lowercase hex digits", ("body", "files", i)
            )
        if path in seen:
            raise Invalid(f"{path!r} is listed twice", ("body", "files", i, "path"))
        seen.add(path)
        old = known.get(path)
        if old is not None:
            if (old.size, old.sha256) != (size, sha):
                raise Conflict(
                    f"{path!r} was registered with another size or checksum; the directory changed"
                )
            continue
        if size == 0:  # nothing will be sent for it: it is complete once created
            if sha != EMPTY_SHA256:
                raise Invalid(f"{path!r}: an empty file's sha256 is {EMPTY_SHA256}", ("body", "files", i))
            empty.append(path)
        session.add(DatasetUploadFile(upload_id=upload.id, path=path, size=size, sha256=sha, received=0))
        upload.registered_files += 1
        upload.registered_bytes += size
    if upload.registered_files > upload.declared_files or upload.registered_bytes > upload.declared_bytes:
        session.rollback()
        raise Invalid(
            f"the files registered exceed what the upload declared ({plural(upload.declared_files, 'file')}, "
            f"{upload.declared_bytes} bytes)"
        )
    for path in empty:
        try:
            store.write_chunk(upload.id, path, 0, b"")
        except BadName as exc:
            session.rollback()
            raise Invalid(str(exc), ("body", "files"))
    upload.updated_at = now
    session.commit()
    return upload


def pending(
    session: Session, principal: Principal, upload_id: str, after: str, limit: int
) -> list[dict[str, Any]]:
    """Registered files not yet complete, by path after `after`: where a resumed client goes on."""
    upload = get(session, principal, upload_id)
    try:
        check_plain(after, "'after' path")  # before the query: PostgreSQL refuses NUL
    except BadName as exc:
        raise Invalid(str(exc), ("query", "after"))
    rows = session.scalars(
        select(DatasetUploadFile)
        .where(
            DatasetUploadFile.upload_id == upload.id,
            DatasetUploadFile.received < DatasetUploadFile.size,
            DatasetUploadFile.path > after,
        )
        .order_by(DatasetUploadFile.path)
        .limit(limit)
    )
    return [{"path": r.path, "size": r.size, "received": r.received} for r in rows]


def write_chunk(
    session: Session,
    store: Store,
    principal: Principal,
    upload_id: str,
    path: str,
    offset: int,
    data: bytes,
    now: float,
) -> DatasetUploadFile:
    """Append `data` to `path` at `offset` (which must be what was received so far)."""
    upload = _open(session, principal, upload_id)
    try:
        check_path(path)
    except BadName as exc:
        raise Invalid(str(exc), ("query", "path"))
    row = session.get(DatasetUploadFile, (upload.id, path))
    if row is None:
        raise NotFound(f"{path!r} is not a registered file of upload {upload_id}")
    _check_offset(row, offset, data)
    # Re-checked per chunk: the quota may have been lowered since the upload started.
    check_room(
        owner_account(session, upload.owner_user_id, upload.owner_group_id),
        upload.declared_bytes,
        upload.declared_files,
    )
    try:
        with store.staged_file(upload.id, path) as fd:
            # Under the file's lock, read again: a request for the same chunk sent twice at once (a
            # retry, or two pushes resuming one upload) waits for the first, then finds its bytes
            # recorded and writes nothing; unlocked, both passed the offset check and the later one
            # cut the file back over a chunk recorded meanwhile. The file's row is what counts
            # here; the upload's (expired by the rollback) is not read again: by `upload_id`.
            session.rollback()
            locked = session.get(DatasetUploadFile, (upload_id, path))
            if locked is None:  # the upload was aborted (or completed) since it was read
                raise _gone(session, upload_id)
            _check_offset(locked, offset, data)
            _write_locked(session, upload_id, locked, fd, offset, data, now)
    except BadName as exc:
        raise Invalid(str(exc), ("query", "path"))
    except (UploadGone, StaleDataError):
        # Aborted meanwhile: before the file was opened (its staging directory is gone and is not
        # made again), or before the chunk was recorded (its rows were gone: the bytes went to a
        # file the abort removes). Either way nothing of it is left.
        raise _gone(session, upload_id)
    return locked


def _gone(session: Session, upload_id: str) -> Conflict:
    """The answer to a request on an upload that was open when it came and is not any more."""
    session.rollback()
    upload = session.get(DatasetUpload, upload_id)
    if upload is not None and upload.state == "done":
        return Conflict(f"upload {upload_id} is finished (dataset {upload.dataset_name!r} v{upload.version})")
    return Conflict(f"upload {upload_id} was aborted (or removed after its timeout); this chunk was not kept")


def _check_offset(row: DatasetUploadFile, offset: int, data: bytes) -> None:
    if offset != row.received:
        raise Conflict(f"{row.path!r}: expected a chunk at offset {row.received}, got {offset}")
    if row.received + len(data) > row.size:
        raise Invalid(f"{row.path!r}: more bytes than its declared size {row.size}", ("body",))


def _write_locked(
    session: Session,
    upload_id: str,
    row: DatasetUploadFile,
    fd: int,
    offset: int,
    data: bytes,
    now: float,
) -> None:
    """Write the chunk and record it (the caller holds the file's lock); a file whose last byte
    came is checked against its sha256, and started again when it differs."""
    write_at(fd, offset, data)
    row.received += len(data)  # the file's lock makes this read-and-write one
    if row.received == row.size:
        actual = fd_sha256(fd)
        if actual != row.sha256:
            _count_received(session, upload_id, len(data) - row.received, now)  # the file's bytes off
            row.received = 0
            session.commit()
            os.ftruncate(fd, 0)
            raise Invalid(
                f"{row.path!r}: sha256 of the bytes received is {actual}, not {row.sha256}; send it again"
            )
    _count_received(session, upload_id, len(data), now)
    session.commit()


def _count_received(session: Session, upload_id: str, delta: int, now: float) -> None:
    """Add `delta` to the upload's bytes received, in SQL (chunks of its other files are written
    at the same time), by its id: the row is not read for it. StaleDataError when it matched no
    row (the upload was aborted meanwhile), as the ORM's flush of the row raised."""
    done = session.execute(
        update(DatasetUpload)
        .where(DatasetUpload.id == upload_id)
        .values(received_bytes=DatasetUpload.received_bytes + delta, updated_at=now)
        .execution_options(synchronize_session=False)
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise StaleDataError(f"upload {upload_id} is gone")


def complete(
    session: Session, store: Store, principal: Principal, upload_id: str, now: float
) -> DatasetVersion:
    upload = get(session, principal, upload_id)
    # Locked and re-read first: a complete sent again while this one runs (a client retrying
    # after a timeout) waits for it, then answers its version; unlocked, it read the rows the first
    # was deleting and answered 409 "not complete: 0/N files registered", or 500 publishing a
    # staging directory already gone.
    if not lock_row(session, upload):
        raise NotFound(f"no upload {upload_id!r} (abandoned meanwhile)")
    if upload.state == "done":  # a client retrying after a lost answer
        ds = session.scalar(select(Dataset).where(Dataset.name == upload.dataset_name))
        found = ds and session.scalar(
            select(DatasetVersion).where(
                DatasetVersion.dataset_id == ds.id, DatasetVersion.version == upload.version
            )
        )
        if found:
            return found
        raise Conflict(f"upload {upload_id} finished, but its version is gone (deleted)")
    group = upload.owner_group_id
    if group is not None and not (principal.is_admin or principal.is_member(group)):
        # Checked at start only, a member removed from the group meanwhile still added its version.
        raise Forbidden(f"you are no longer a member of the group that owns dataset {upload.dataset_name!r}")
    files = list(session.scalars(select(DatasetUploadFile).where(DatasetUploadFile.upload_id == upload.id)))
    missing = [f.path for f in files if f.received < f.size]
    if len(files) != upload.declared_files or missing:
        raise Conflict(
            f"upload {upload_id} is not complete: {len(files)}/{upload.declared_files} files registered, "
            f"{len(missing)} still receiving" + (f" (first: {missing[0]!r})" if missing else "")
        )
    entries = [(f.path, f.size, f.sha256) for f in files]
    if manifest_digest(entries) != upload.manifest_digest:
        raise Conflict(f"upload {upload_id}: the files registered do not match the declared manifest digest")
    return publish(
        session,
        store,
        Owner(upload.dataset_name, upload.owner_user_id, upload.owner_group_id, upload.created_by),
        store.staging_dir(upload.id),
        entries,
        kind="upload",
        now=now,
        before_commit=lambda v: _finish(session, upload, v),
    )


def _finish(session: Session, upload: DatasetUpload, version: int) -> None:
    upload.state = "done"
    upload.version = version
    session.execute(delete(DatasetUploadFile).where(DatasetUploadFile.upload_id == upload.id))


@dataclass(frozen=True)
class Owner:
    name: str  # the dataset's
    user_id: int | None
    group_id: int | None
    by: str  # who publishes


def publish(
    session: Session,
    store: Store,
    owner: Owner,
    staged: Path,
    entries: list[tuple[str, int, str]],
    *,
    kind: str,
    now: float,
    before_commit: Callable[[int], None] | None = None,
) -> DatasetVersion:
    """Make the staged tree the dataset's next version. The version row is flushed first (the
    unique (dataset, version) key makes a concurrent publisher of the same number wait or fail
    before touching the disk), then the tree is renamed into place, then the commit; a failed
    commit moves the tree back to staging, so nothing half-done is ever visible."""
    ds = session.scalar(select(Dataset).where(Dataset.name == owner.name))
    if ds is not None and (ds.owner_user_id, ds.owner_group_id) != (owner.user_id, owner.group_id):
        # The owner (and the quota charged) was settled when the upload started, when no dataset
        # had this name: one made meanwhile by someone else is not this upload's to add to.
        raise Conflict(
            f"dataset {owner.name!r} was created by someone else while this upload ran; "
            "abandon the upload (DELETE /datasets/uploads/<id>) and push under another name"
        )
    account_row = lock_account(owner_account(session, owner.user_id, owner.group_id))  # first: lock order
    if ds is None:
        ds = Dataset(
            name=owner.name, owner_user_id=owner.user_id, owner_group_id=owner.group_id, public=False,
            description="", created_at=now, created_by=owner.by,
            last_version=carried_over(session, "dataset", owner.name),  # a deleted one's, if any
        )  # fmt: skip
        session.add(ds)
    try:
        session.flush()
        # Never a number given before (the counter, read after the owner's lock, which every
        # publish and delete of this dataset takes): v3 deleted, the next version is v4, not v3 again.
        # (at least every version's number: migration 0020 set it so, and only this sets it since)
        given = session.scalar(select(Dataset.last_version).where(Dataset.id == ds.id))
        version = (given or 0) + 1
        ds.last_version = version
        row = DatasetVersion(
            dataset_id=ds.id, version=version, bytes=sum(e[1] for e in entries), files=len(entries),
            digest=manifest_digest(entries), source=kind, created_at=now, created_by=owner.by,
        )  # fmt: skip
        session.add(row)
        session.flush()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"dataset {owner.name!r} changed while this version was being added; try again")
    charge_dataset(account_row, row.bytes, row.files)
    if before_commit is not None:
        before_commit(version)
    target = store.publish(staged, ds.id, version, entries)
    try:
        session.commit()
    except Exception:
        session.rollback()
        target.rename(staged)
        store.manifest_file(ds.id, version).unlink(missing_ok=True)
        raise
    return row


def abort(session: Session, store: Store, principal: Principal, upload_id: str) -> None:
    """Remove the upload with its staged bytes. A chunk being written meanwhile is refused (409,
    write_chunk) and leaves nothing: its rows are gone, its staging directory is not made again."""
    upload = _open(session, principal, upload_id)
    # A statement, not session.delete: removed meanwhile (aborted twice at once, the timeout) is done.
    removed = session.execute(
        delete(DatasetUpload).where(DatasetUpload.id == upload.id, DatasetUpload.state == "open")
    )
    session.commit()
    if removed.rowcount == 0 and session.get(DatasetUpload, upload_id, populate_existing=True):  # type: ignore[attr-defined]
        raise Conflict(f"upload {upload_id} was completed meanwhile; delete the version instead")
    store.remove(store.staging_dir(upload_id))


def import_roots(text: str) -> list[Path]:
    return [Path(p).resolve() for p in text.split(":") if p.strip()]


def import_path(
    session: Session,
    store: Store,
    principal: Principal,
    *,
    name: str,
    group: str | None,
    path: str,
    roots: list[Path],
    now: float,
) -> DatasetVersion:
    """A new version copied from a server-side directory under one of `roots`
    (CORRAL_DATASET_IMPORT_ROOTS; admins only). Links pointing outside the directory are
    refused; files are checksummed as they are copied into staging, then published like an upload."""
    if not principal.is_admin:
        raise Forbidden("only an administrator may import a dataset from a server path")
    try:
        check_name(name)
    except BadName as exc:
        raise Invalid(str(exc), ("body", "name"))
    try:
        check_plain(group or "", "group name")  # before any query: PostgreSQL refuses NUL
    except BadName as exc:
        raise Invalid(str(exc), ("body", "group"))
    if "\0" in path or not os.path.isabs(path):
        raise Invalid(f"import path {path!r} must be an absolute path", ("body", "path"))
    source = Path(path).resolve()
    if not any(source.is_relative_to(root) for root in roots):
        allowed = ", ".join(str(r) for r in roots) or "none (CORRAL_DATASET_IMPORT_ROOTS is empty)"
        raise Forbidden(f"{path} is not under an allowed import root; allowed: {allowed}")
    if not source.is_dir():
        raise NotFound(f"{path} is not a directory")
    owner_user, owner_group = _owner(session, principal, name, group)
    try:
        files = list(walk_files(source))
    except BadName as exc:
        raise Invalid(str(exc), ("body", "path"))
    if not files:
        raise Invalid(f"{path} holds no files", ("body", "path"))
    total = sum(full.stat().st_size for _, full in files)
    check_room(owner_account(session, owner_user, owner_group), total, len(files))
    staged = store.uploads / f"import-{secrets.token_hex(8)}"
    try:
        entries = []
        for rel, full in files:
            target = store.file_in(staged, rel)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(full, target)
            entries.append((rel, target.stat().st_size, file_sha256(target)))
        return publish(
            session,
            store,
            Owner(name, owner_user, owner_group, principal.name),
            staged,
            entries,
            kind="import",
            now=now,
        )
    finally:
        if staged.exists():
            store.remove(staged)


def clean_stale(session: Session, store: Store, now: float, timeout_s: float) -> list[str]:
    """Remove open uploads idle for `timeout_s` with their staged bytes, finished sessions a
    timeout after they finished, staging directories without a session (a crash between the
    mkdir and the commit) and version directories without a version row (a crash between the
    rename and the commit). Returns the upload ids removed."""
    stale = list(session.scalars(select(DatasetUpload).where(DatasetUpload.updated_at < now - timeout_s)))
    for upload in stale:
        session.delete(upload)
    session.commit()
    for upload in stale:
        store.remove(store.staging_dir(upload.id))
    known = set(session.scalars(select(DatasetUpload.id)))
    if store.uploads.exists():
        for entry in store.uploads.iterdir():
            if entry.name not in known and now - entry.stat().st_mtime > timeout_s:
                store.remove(entry)
    _clean_orphan_versions(session, store, now, timeout_s)
    store.empty_trash()
    return [u.id for u in stale]


def _clean_orphan_versions(session: Session, store: Store, now: float, timeout_s: float) -> None:
    rows = {(r[0], r[1]) for r in session.execute(select(DatasetVersion.dataset_id, DatasetVersion.version))}
    if not store.data.exists():
        return
    for top in store.data.iterdir():
        if not top.name.isdigit():
            continue
        for entry in top.iterdir():
            stem = entry.name.removesuffix(".manifest")
            if not (stem.startswith("v") and stem[1:].isdigit()):
                continue
            if (int(top.name), int(stem[1:])) in rows or now - entry.lstat().st_mtime <= timeout_s:
                continue
            if entry.name.endswith(".manifest"):
                entry.unlink()
            else:
                store.remove(entry)
