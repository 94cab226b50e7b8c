"""Storage services: the submit-time check of a job's mounts and code snapshot, `--code` uploads
(missing hashes, chunks, manifest) and a job's outputs (list, open). The storage root comes from
the server's settings; the mechanics live in corral.storage."""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import ColumnElement, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import InstrumentedAttribute, Session, class_mapper

from corral.catalog import model_mounts as _model_mounts  # noqa: F401  (registers the model/ source)
from corral.config import Settings
from corral.datasets import mounts as _dataset_mounts  # noqa: F401  (registers the data/ source)
from corral.db.models import Group, Job, Membership, User
from corral.db.storage_models import CodeClaim, CodeSnapshotClaim, StorageIdentity
from corral.services import audit
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.spec import JobSpecV1, MountV1
from corral.storage import code
from corral.storage.identities import ensure_ids, list_ids
from corral.storage.layout import outputs_dir
from corral.storage.mounts import MountContext, MountRefused
from corral.storage.plan import id_ranges, resolve_spec_mounts
from corral.words import plural

MAX_MISSING_QUERY = 50_000
MAX_LISTED = 10_000  # outputs entries listed at once


def mount_context(session: Session, principal: Principal, root: Path) -> MountContext:
    ids = list(principal.group_roles)
    names = session.scalars(select(Group.name).where(Group.id.in_(ids))).all() if ids else []
    return MountContext(principal.name, frozenset(names), root, principal.is_admin, session)


def check_job_storage(
    session: Session, principal: Principal, spec: JobSpecV1, settings: Settings
) -> JobSpecV1:
    """The spec's mounts checked against the submitter's rights (403 naming the source) and
    resolvable (422), its code snapshot present; returns the spec with each mount's exact source
    (e.g. a dataset's version: the job's lineage)."""
    root = settings.storage_path
    if spec.code is not None and not _may_run(session, principal, root, spec.code):
        # 404 as for any other object a request names that does not exist (a job's group ...);
        # another user's snapshot reads the same, so an id told to someone runs nobody's code
        raise NotFound(
            f"code snapshot {spec.code} does not exist (none uploaded by you or your groups' members);"
            " upload it with `corral submit --code DIR`"
        )
    if not spec.mounts:
        return spec
    ctx = mount_context(session, principal, root)
    try:
        binds = resolve_spec_mounts(ctx, spec)
    except MountRefused as exc:
        if exc.forbidden:
            raise Forbidden(str(exc)) from exc
        raise Invalid(str(exc), ("body", "mounts")) from exc
    pinned = [
        MountV1(source=b.source or m.source, target=m.target, mode=m.mode)
        for m, b in zip(spec.mounts, binds, strict=True)
    ]
    return spec.model_copy(update={"mounts": pinned})


def identities(session: Session, settings: Settings, principal: Principal) -> list[dict[str, object]]:
    """Every user's uid and group's gid (admin), allocating those not given yet, e.g. for the
    Unix groups a Slurm site makes (docs/storage.md, "Identities"). Commits, with an audit record
    of how many ids were allocated."""
    uid_range, gid_range = id_ranges(settings)
    known = len(list_ids(session))
    ensure_ids(
        session,
        session.scalars(select(User)).all(),
        session.scalars(select(Group)).all(),
        uid_range,
        gid_range,
    )
    allocated = len(list_ids(session)) - known
    audit.record(
        session,
        actor=principal,
        action="storage.identities.allocate",
        target_kind="storage",
        target_id="identities",
        after={"allocated": allocated},
    )
    session.commit()
    return [
        {"kind": r.kind, "name": r.subject_name, "id": r.number, "current": _is_current(session, r)}
        for r in list_ids(session)
    ]


def _is_current(session: Session, row: StorageIdentity) -> bool:
    found = session.get(User if row.kind == "user" else Group, row.subject_id)
    return isinstance(found, (User, Group)) and found.created_at == row.subject_created_at


# -- code uploads ------------------------------------------------------------------------------


# Blobs are stored once for everyone, but a blob counts as present for a caller only when they,
# or a member of one of their groups, uploaded it (a CodeClaim): otherwise the answer is "send
# it", and its bytes, checked against the hash, are dropped for the copy already there. Without
# that, `missing` told anyone whether another user had stored a file of a given hash (a guess
# of its content confirmed), and a manifest naming that hash got them a copy of the file.
CLAIM_BATCH = 500  # hashes per IN (...) of the claims query


def _claimed_by_caller_or_mates(
    principal: Principal, user_id: InstrumentedAttribute[int]
) -> ColumnElement[bool]:
    mates = select(Membership.user_id).where(Membership.group_id.in_(list(principal.group_roles)))
    return or_(user_id == principal.user_id, user_id.in_(mates))


def claimed_blobs(session: Session, principal: Principal, hashes: Iterable[str]) -> set[str]:
    """Those of `hashes` the caller or a member of one of their groups has uploaded."""
    who = _claimed_by_caller_or_mates(principal, CodeClaim.user_id)
    wanted, found = sorted(set(hashes)), set[str]()
    for start in range(0, len(wanted), CLAIM_BATCH):
        batch = wanted[start : start + CLAIM_BATCH]
        found.update(session.scalars(select(CodeClaim.sha256).where(CodeClaim.sha256.in_(batch), who)))
    return found


def _missing_for(session: Session, settings: Settings, principal: Principal, hashes: list[str]) -> list[str]:
    absent = set(code.missing(settings.storage_path, hashes))  # also checks each is a sha256
    return sorted(set(hashes) - claimed_blobs(session, principal, set(hashes) - absent))


def missing_blobs(session: Session, settings: Settings, principal: Principal, hashes: list[str]) -> list[str]:
    """The hashes the caller must upload: not stored, or stored but not theirs (nor their
    groups'), which reads the same."""
    if len(hashes) > MAX_MISSING_QUERY:
        raise Invalid(f"at most {MAX_MISSING_QUERY} hashes per query", ("body", "hashes"))
    try:
        return _missing_for(session, settings, principal, hashes)
    except code.CodeError as exc:
        raise Invalid(str(exc), ("body", "hashes")) from exc


def upload_chunk(
    session: Session,
    settings: Settings,
    principal: Principal,
    sha: str,
    offset: int,
    data: bytes,
    final: bool,
) -> int:
    """One chunk of the caller's upload of blob `sha`; the whole blob, checked, is then theirs.
    A blob they (or their groups) hold already is not received again."""
    uploader = str(principal.user_id)
    try:
        blob = code.blob_path(settings.storage_path, sha)
        # at any offset: an upload of the caller's own blob that another upload of theirs has
        # finished meanwhile is answered as done (a chunk past 0 would otherwise be out of order)
        if blob.exists() and claimed_blobs(session, principal, [sha]):
            return blob.stat().st_size
        size = code.receive_chunk(
            settings.storage_path, sha, offset, data, final, settings.code_max_bytes, uploader=uploader
        )
    except code.ChunkOutOfOrder as exc:
        raise Conflict(f"{exc}; resume at offset {exc.have}") from exc
    except code.CodeError as exc:
        raise Invalid(str(exc), ("body",)) from exc
    if final:
        _claim(session, CodeClaim(sha256=sha, user_id=principal.user_id, created_at=time.time()))
    return size


def _claim(session: Session, claim: CodeClaim | CodeSnapshotClaim) -> None:
    """Record the caller's claim on a blob or a snapshot (commits; kept if they hold it already)."""
    key = class_mapper(type(claim)).primary_key_from_instance(claim)
    if session.get(type(claim), key) is not None:
        return
    session.add(claim)
    try:
        session.commit()
    except IntegrityError:  # the same upload finished by another request of theirs just now
        session.rollback()


def parse_manifest(text: str) -> dict[str, dict[str, object]]:
    """The manifest as sent: one `<sha256> <x|-> <path>` line per file (`x`: executable). Text,
    not JSON: a few thousand files stay within the API's body and JSON-size limits."""
    manifest: dict[str, dict[str, object]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        sha, _, rest = line.partition(" ")
        flag, _, path = rest.partition(" ")
        if flag not in ("x", "-") or not path:
            raise Invalid(f"manifest line {number}: write '<sha256> <x|-> <path>'", ("body",))
        if path in manifest:
            raise Invalid(f"manifest line {number}: {path!r} is listed twice", ("body",))
        manifest[path] = {"sha256": sha, "executable": flag == "x"}
    if not manifest:
        raise Invalid("the manifest lists no files", ("body",))
    return manifest


def _may_run(session: Session, principal: Principal, root: Path, snapshot: str) -> bool:
    """Whether the snapshot exists and the caller or a member of one of their groups claimed it
    (posted its manifest with every blob theirs; migration 0026: named it in a job before)."""
    if not code.snapshot_dir(root, snapshot).is_dir():
        return False
    who = _claimed_by_caller_or_mates(principal, CodeSnapshotClaim.user_id)
    claim = select(CodeSnapshotClaim.snapshot).where(CodeSnapshotClaim.snapshot == snapshot, who).limit(1)
    return session.scalar(claim) is not None


def create_snapshot(session: Session, settings: Settings, principal: Principal, text: str) -> str:
    """The snapshot of the manifest; every blob it names must be the caller's (or their
    groups'): one stored by someone else is "not uploaded yet" as for `missing_blobs`. The
    snapshot is then the caller's to run (and their groups' members'), whoever made it first."""
    manifest = parse_manifest(text)
    try:
        for path in manifest:  # a malformed request (422) before the state of the upload (409)
            code.check_path(path)
        hashes = sorted({str(f["sha256"]) for f in manifest.values()})
        absent = _missing_for(session, settings, principal, hashes)
    except code.CodeError as exc:
        raise Invalid(str(exc), ("body",)) from exc
    if absent:  # the state of the upload, not a malformed request: upload them, then send it again
        raise Conflict(
            f"{plural(len(absent), 'file')} {'was' if len(absent) == 1 else 'were'} not uploaded yet, "
            f"e.g. blob {absent[0]}; upload them first"
        )
    try:
        snap_id = code.make_snapshot(
            settings.storage_path, manifest, settings.code_max_bytes, settings.code_max_files
        )
    except code.CodeError as exc:
        raise Invalid(str(exc), ("body",)) from exc
    _claim(session, CodeSnapshotClaim(snapshot=snap_id, user_id=principal.user_id, created_at=time.time()))
    return snap_id


# -- outputs -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OutputFile:
    path: str
    size: int
    modified_at: float


def list_outputs(settings: Settings, job: Job) -> list[OutputFile]:
    """The plain files below the job's outputs dir (symlinks and others skipped, never followed)."""
    top = outputs_dir(settings.storage_path, job.id)
    found: list[OutputFile] = []
    todo = [""]
    while todo and len(found) < MAX_LISTED:
        rel = todo.pop()
        try:
            entries = sorted(os.scandir(top / rel if rel else top), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if not _utf8(entry.name):  # no URL or JSON names it (it broke the whole listing: 500)
                continue
            path = f"{rel}/{entry.name}" if rel else entry.name
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                todo.append(path)
            elif stat.S_ISREG(st.st_mode):
                found.append(OutputFile(path, st.st_size, st.st_mtime))
    return sorted(found, key=lambda f: f.path)


def _utf8(name: str) -> bool:
    """Whether a name read from disk is UTF-8 (else Python holds its bytes as lone surrogates)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def open_output(settings: Settings, job: Job, path: str) -> int:
    """An fd of one output file, opened without following any symlink on the way (a job's uid
    owns that tree and may have planted links to the server's files)."""
    try:
        code.check_path(path, "output path")
    except code.CodeError as exc:
        raise Invalid(str(exc), ("query", "path")) from exc
    top = outputs_dir(settings.storage_path, job.id)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(top, flags | os.O_DIRECTORY)
    except FileNotFoundError:
        raise NotFound(f"job {job.id} has no outputs") from None
    try:
        parts = path.split("/")
        for part in parts[:-1]:
            nxt = os.open(part, flags | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], flags | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        raise NotFound(f"job {job.id} has no output file {path!r}") from None
    finally:
        os.close(fd)
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise NotFound(f"job {job.id} has no output file {path!r}")
    return out
