"""Datasets, their uploads, and storage quotas and usage. Logic is in corral.datasets."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response, status
from fastapi.responses import FileResponse
from pydantic import ConfigDict, Field, model_validator
from pydantic.config import JsonDict
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from corral.api.deps import DB, Admin, CurrentUser, NameInPath
from corral.api.pattern_words import worded
from corral.api.schemas import ACCOUNT_NAME, BooleansApart
from corral.datasets import quotas, uploads
from corral.datasets import service as svc
from corral.datasets.names import MAX_PATH, NAME, BadName, check_path, parse_version
from corral.datasets.store import Store
from corral.services import audit
from corral.services.auth import Principal
from corral.services.errors import Invalid, NotFound
from corral.storage.code import RELATIVE_PATH_PATTERN

router = APIRouter(tags=["datasets"])


# The REST API's refusals of a bad name or version in words, as the SDK's own check says them
# ("does not match pattern ^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9_-])?$" said nothing).
DATASET_NAME = worded(
    NAME.pattern,
    "is not a dataset name: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit "
    "and not ending with '.'",
)


class _In(BooleansApart):  # `false` is no byte count, as the schema says
    model_config = ConfigDict(extra="forbid")


# A group's name as the schema states it; the services say what is wrong with one (a control
# character) or that no group has it.
GroupName = Annotated[str, Field(max_length=64, json_schema_extra={"pattern": ACCOUNT_NAME})]


# Byte counts are bounded at 2**53 (8 PiB): every JSON reader holds any integer up to it exactly
# (a float beyond it rounds, so 2**60 + 23 would look equal to a bound of 2**60).
MAX_BYTES = 2**53
# The pattern is the schema's only: the services check a path themselves, with a message that
# names the problem (path traversal, a control character ...) instead of a regex.
PATH_IN_SCHEMA: JsonDict = {"pattern": RELATIVE_PATH_PATTERN}
FILE_PATH = Field(min_length=1, max_length=MAX_PATH, json_schema_extra=PATH_IN_SCHEMA)


class UploadIn(_In):
    name: str = Field(pattern=DATASET_NAME)
    group: GroupName | None = Field(None, description="owning group; default: the caller")
    bytes: int = Field(ge=0, le=MAX_BYTES, description="total bytes of all files")
    files: int = Field(ge=1, le=100_000_000, description="number of files")
    digest: str = Field(pattern="^[0-9a-f]{64}$", description="corral.datasets.names.manifest_digest")


class FileIn(_In):
    path: str = FILE_PATH
    size: int = Field(ge=0, le=MAX_BYTES)
    sha256: str = Field(pattern="^[0-9a-f]{64}$")


class FilesIn(_In):
    files: list[FileIn] = Field(max_length=uploads.MAX_BATCH)


class ShareIn(_In):
    add_groups: list[GroupName] = Field(default_factory=list, max_length=100)
    remove_groups: list[GroupName] = Field(default_factory=list, max_length=100)
    public: bool | None = None


class ImportIn(_In):
    name: str = Field(pattern=DATASET_NAME)
    group: GroupName | None = None
    path: str = Field(  # absolute, on the server: "does not match pattern ^/[^\x00]*$" said neither
        min_length=2,
        max_length=4096,
        pattern=worded(r"^/[^\x00]*$", "is not an absolute path on the server (e.g. /srv/imports/cifar)"),
    )


class StorageQuotaIn(_In):
    """Only the fields present change; `null` = no limit."""

    model_config = ConfigDict(json_schema_extra={"minProperties": 1})

    max_bytes: int | None = Field(None, ge=0, le=MAX_BYTES)
    max_files: int | None = Field(None, ge=0, le=MAX_BYTES)

    @model_validator(mode="after")
    def _something(self) -> StorageQuotaIn:
        if not self.model_fields_set:  # as the schema's minProperties says
            raise ValueError("give max_bytes, max_files or both (null: no limit)")
        return self


def store_of(request: Request) -> Store:
    """The app's dataset store (made, with its directories, on first use)."""
    store: Store | None = getattr(request.app.state, "dataset_store", None)
    if store is None:
        store = Store(request.app.state.settings.storage_path)
        store.ensure()
        request.app.state.dataset_store = store
    return store


def chunk_bytes(request: Request) -> int:
    # The chunk route's body limit (corral.api.limits) is this size.
    return int(request.app.state.settings.dataset_chunk_bytes)


def upload_view(upload: Any, request: Request, resumed: bool = False) -> dict[str, Any]:
    return {
        "id": upload.id,
        "name": upload.dataset_name,
        "state": upload.state,
        "version": upload.version,
        "bytes": upload.declared_bytes,
        "files": upload.declared_files,
        "registered_files": upload.registered_files,
        "received_bytes": upload.received_bytes,
        "chunk_bytes": chunk_bytes(request),
        "resumed": resumed,
        "created_at": upload.created_at,
        "updated_at": upload.updated_at,
    }


# Path parameters as the schema states them (names.NAME; "v3", "3" or "latest"), so what the
# schema allows is what the routes accept.
DatasetName = Annotated[str, Path(pattern=DATASET_NAME)]
VersionNumber = Annotated[
    str, Path(pattern=worded(r"^[vV]?0*[1-9][0-9]{0,8}$", "is not a version: write a number such as 3 or v3"))
]
LATEST_OR_NUMBER = r"^(latest|[vV]?0*[1-9][0-9]{0,8})$"
VersionRef = Annotated[
    str, Path(pattern=worded(LATEST_OR_NUMBER, "is not a version: write a number such as 3 or v3, or latest"))
]


def _version(text: str) -> int | None:
    if text == "latest":
        return None
    try:
        return parse_version(text)
    except BadName as exc:
        raise Invalid(str(exc), ("path", "version"))


# -- datasets -----------------------------------------------------------------------------------


@router.get("/datasets")
def list_datasets(db: DB, principal: CurrentUser) -> Any:
    """The datasets the caller may read: their own, their groups', shared with them, public."""
    return svc.list_readable(db, principal)


@router.get("/datasets/uploads")
def list_uploads(request: Request, db: DB, principal: CurrentUser) -> Any:
    """The caller's uploads still open (interrupted pushes, resumed by pushing again)."""
    return [upload_view(u, request) for u in uploads.open_uploads(db, principal)]


@router.get("/datasets/{name}")
def show_dataset(name: DatasetName, db: DB, principal: CurrentUser) -> Any:
    """A dataset the caller may read: owner, sharing and every version (404 as for none when they may not
    read it)."""
    return svc.dataset_view(db, svc.readable(db, name, principal))


@router.delete("/datasets/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_dataset(name: DatasetName, request: Request, db: DB, principal: CurrentUser) -> Response:
    """Delete every version (refused with 409 naming the jobs while one not yet ended uses it)."""
    svc.delete_dataset(db, store_of(request), svc.managed(db, name, principal, "delete it"))
    _record_after(db, principal, "dataset.delete", name)
    return Response(status_code=204)


@router.delete("/datasets/{name}/versions/{version}", status_code=status.HTTP_204_NO_CONTENT)
def delete_version(
    name: DatasetName, version: VersionNumber, request: Request, db: DB, principal: CurrentUser
) -> Response:
    """Delete one version (owner, an admin of its group, admins); 409 naming the jobs while one not yet
    ended uses it. Its number is never given again."""
    ds = svc.managed(db, name, principal, "delete its versions")
    number = _version(version)
    if number is None:
        raise Invalid("name the version to delete (e.g. v2), not 'latest'", ("path", "version"))
    svc.delete_version(db, store_of(request), ds, number)
    _record_after(db, principal, "dataset.version.delete", f"{name}@{number}")
    return Response(status_code=204)


@router.put("/datasets/{name}/share")
def share_dataset(name: DatasetName, body: ShareIn, db: DB, principal: CurrentUser) -> Any:
    """Read-only access for groups, or everyone (`public`); owners and admins. A group is one the
    caller belongs to (a platform admin: any): another, existing or not, is the same 404."""
    ds = svc.managed(db, name, principal, "share it")
    before = svc.dataset_view(db, ds)
    svc.share(
        db, ds, principal, add_groups=body.add_groups, remove_groups=body.remove_groups, public=body.public
    )
    after = svc.dataset_view(db, ds)
    audit.record(
        db,
        actor=principal,
        action="dataset.share",
        target_kind="dataset",
        target_id=name,
        before={k: before.get(k) for k in SHARE_FIELDS},
        after={k: after.get(k) for k in SHARE_FIELDS},
    )
    db.commit()
    return svc.dataset_view(db, ds)


@router.get("/datasets/{name}/versions/{version}/manifest")
def version_manifest(
    name: DatasetName, version: VersionRef, request: Request, db: DB, principal: CurrentUser
) -> Any:
    """The version's files, one "path<TAB>size<TAB>sha256" line each (text/plain); the
    `X-Corral-Version` header says which version "latest" was."""
    ds = svc.readable(db, name, principal)
    row = svc.version_of(db, ds, _version(version))
    path = store_of(request).manifest_file(ds.id, row.version)
    return FileResponse(
        path,
        media_type="text/plain",
        headers={"X-Corral-Version": str(row.version), "X-Corral-Digest": row.digest},
    )


@router.get("/datasets/{name}/versions/{version}/files/{path:path}")
def version_file(
    name: DatasetName, version: VersionRef, path: str, request: Request, db: DB, principal: CurrentUser
) -> Any:
    """One file of a version (`latest` or a number), as raw bytes."""
    ds = svc.readable(db, name, principal)
    row = svc.version_of(db, ds, _version(version))
    store = store_of(request)
    try:
        target = store.file_in(store.version_dir(ds.id, row.version), path)
    except BadName as exc:
        raise Invalid(str(exc), ("path", "path"))
    if target.is_symlink() or not target.is_file():
        raise NotFound(f"dataset {name!r} v{row.version} has no file {path!r}")
    return FileResponse(target, media_type="application/octet-stream")


@router.post("/datasets/import", status_code=status.HTTP_201_CREATED)
def import_dataset(body: ImportIn, request: Request, db: DB, admin: Admin) -> Any:
    """A new version copied from a server directory under CORRAL_DATASET_IMPORT_ROOTS (admins)."""
    roots = uploads.import_roots(request.app.state.settings.dataset_import_roots)
    row = uploads.import_path(
        db,
        store_of(request),
        admin,
        name=body.name,
        group=body.group,
        path=body.path,
        roots=roots,
        now=time.time(),
    )
    _record_after(db, admin, "dataset.import", f"{body.name}@{row.version}")
    return {"name": body.name, **svc.version_view(row)}


# -- uploads ------------------------------------------------------------------------------------


@router.post("/datasets/uploads", status_code=status.HTTP_201_CREATED)
def start_upload(body: UploadIn, request: Request, db: DB, principal: CurrentUser) -> Any:
    """Start (or resume: same name, owner and digest) an upload. The quota is checked here,
    against the declared size, before any byte is sent."""
    upload, resumed = uploads.start(
        db, store_of(request), principal, name=body.name, group=body.group, total_bytes=body.bytes,
        total_files=body.files, digest=body.digest, now=time.time(),
    )  # fmt: skip
    return upload_view(upload, request, resumed)


@router.get("/datasets/uploads/{upload_id}")
def show_upload(upload_id: str, request: Request, db: DB, principal: CurrentUser) -> Any:
    """One of the caller's open uploads: its files registered and bytes received."""
    return upload_view(uploads.get(db, principal, upload_id), request)


@router.post("/datasets/uploads/{upload_id}/files")
def register_files(upload_id: str, body: FilesIn, request: Request, db: DB, principal: CurrentUser) -> Any:
    """Register up to 1000 of the upload's files ({path, size, sha256}); idempotent."""
    files = [(f.path, f.size, f.sha256) for f in body.files]
    return upload_view(
        uploads.register_files(db, store_of(request), principal, upload_id, files, time.time()), request
    )


@router.get("/datasets/uploads/{upload_id}/pending")
def pending_files(
    upload_id: str,
    db: DB,
    principal: CurrentUser,
    after: str = "",
    limit: Annotated[int, Query(ge=1, le=1000)] = 1000,
) -> Any:
    """Registered files not yet all received, by path after `after`: {path, size, received}."""
    return uploads.pending(db, principal, upload_id, after, limit)


@router.put("/datasets/uploads/{upload_id}/chunk")
async def put_chunk(
    upload_id: str,
    request: Request,
    db: DB,
    principal: CurrentUser,
    path: Annotated[str, Query(min_length=1, max_length=MAX_PATH, json_schema_extra=PATH_IN_SCHEMA)],
    offset: Annotated[int, Query(ge=0, le=MAX_BYTES)],
) -> Any:
    """Bytes of `path` at `offset` (application/octet-stream; at most `chunk_bytes`)."""
    data = await request.body()
    try:
        check_path(path)
    except BadName as exc:
        raise Invalid(str(exc), ("query", "path"))
    row = await run_in_threadpool(
        uploads.write_chunk, db, store_of(request), principal, upload_id, path, offset, data, time.time()
    )
    return {"path": row.path, "size": row.size, "received": row.received}


@router.post("/datasets/uploads/{upload_id}/complete", status_code=status.HTTP_201_CREATED)
def complete_upload(upload_id: str, request: Request, db: DB, principal: CurrentUser) -> Any:
    """Every byte received and checked: the version appears (atomically) and is returned."""
    upload = uploads.get(db, principal, upload_id)
    row = uploads.complete(db, store_of(request), principal, upload_id, time.time())
    _record_after(db, principal, "dataset.version.create", f"{upload.dataset_name}@{row.version}")
    return {"name": upload.dataset_name, **svc.version_view(row)}


@router.delete("/datasets/uploads/{upload_id}", status_code=status.HTTP_204_NO_CONTENT)
def abort_upload(upload_id: str, request: Request, db: DB, principal: CurrentUser) -> Response:
    """Abandon an open upload: its rows, then its staged bytes."""
    uploads.abort(db, store_of(request), principal, upload_id)
    return Response(status_code=204)


# -- storage quotas and usage ---------------------------------------------------------------------


@router.get("/storage/usage")
def storage_usage(db: DB, principal: CurrentUser) -> Any:
    """Storage used vs quota per user and group: every account for admins; else the caller's
    own and those of their groups."""
    if principal.is_admin:
        rows = quotas.usage_rows(db)
    else:
        rows = quotas.usage_rows(
            db, users={principal.name}, groups=svc.member_group_names(db, principal.user_id)
        )
    return [r.view() for r in rows]


@router.put("/storage/quota/{scope}/{name}")
def set_storage_quota(
    scope: Literal["user", "group"], name: NameInPath, body: StorageQuotaIn, db: DB, admin: Admin
) -> Any:
    """Admins: a user's or a group's storage quota (bytes, files)."""
    if scope not in quotas.SCOPES:
        raise Invalid(f"scope must be one of {', '.join(quotas.SCOPES)}, not {scope!r}", ("path", "scope"))
    changes = body.model_dump(include=body.model_fields_set)
    quotas.set_quota(db, scope, name, changes)
    audit.record(
        db, actor=admin, action="storage.quota.set", target_kind=scope, target_id=name, after=changes
    )
    db.commit()
    return next(r.view() for r in quotas.usage_rows(db) if (r.scope, r.name) == (scope, name))


SHARE_FIELDS = ("shared_with", "public")


def _record_after(db: Session, principal: Principal, action: str, target: str) -> None:
    """The audit record of a dataset change whose files moved with its rows: written right after
    that commit (files are not transactional; the service commits once they are in place)."""
    audit.record(db, actor=principal, action=action, target_kind="dataset", target_id=target)
    db.commit()
