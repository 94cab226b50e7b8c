"""Storage: `--code` uploads (which blobs are missing, chunked blob upload, the snapshot's
manifest) and a job's outputs (list, download). Logic is in corral.services.storage."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field
from starlette.concurrency import run_in_threadpool

from corral.api.deps import DB, Admin, CurrentUser, RowId, fast_json
from corral.api.schemas import RequestBody
from corral.services import jobs as jobs_svc
from corral.services import storage as svc
from corral.services.errors import Invalid
from corral.storage import code

router = APIRouter(tags=["storage"])
READ_BLOCK = 1 << 20
# The service checks a path itself, naming the problem; the pattern is the schema's only.
PATH_IN_SCHEMA: dict[str, Any] = {"pattern": code.RELATIVE_PATH_PATTERN}


class MissingIn(RequestBody):
    hashes: list[Annotated[str, Field(pattern=code.SHA_RE.pattern)]] = Field(max_length=svc.MAX_MISSING_QUERY)


@router.post("/code/missing")
def code_missing(body: MissingIn, request: Request, db: DB, principal: CurrentUser) -> Any:
    """Which of these sha256 hashes the caller must upload (those the server does not hold for
    them or their groups: another user's file reads as missing, and is stored once all the same)."""
    return fast_json({"missing": svc.missing_blobs(db, request.app.state.settings, principal, body.hashes)})


@router.put(
    "/code/blobs/{sha}",
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
        }
    },
)
async def code_blob(
    sha: Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")],
    request: Request,
    db: DB,
    principal: CurrentUser,
    offset: Annotated[int, Query(ge=0, le=2**53)] = 0,
    final: bool = False,
) -> Any:
    """One chunk of a blob at `offset` (409 with the offset to resume at when it does not fit);
    `final=true` checks the whole blob's hash and publishes it."""
    data = await request.body()
    settings = request.app.state.settings
    size = await run_in_threadpool(svc.upload_chunk, db, settings, principal, sha, offset, data, final)
    return fast_json({"sha256": sha, "size": size})


@router.post(
    "/code/snapshots",
    status_code=201,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "text/plain": {"schema": {"type": "string", "pattern": r"^([0-9a-f]{64} [x-] [^\n]+\n)+$"}}
            },
        }
    },
)
async def code_snapshot(request: Request, db: DB, principal: CurrentUser) -> Any:
    """The snapshot of a manifest (text: `<sha256> <x|-> <path>` per line) -> its id."""
    try:
        text = (await request.body()).decode("utf-8")
    except UnicodeDecodeError:
        raise Invalid("the manifest is not UTF-8 text", ("body",))
    snap_id = await run_in_threadpool(svc.create_snapshot, db, request.app.state.settings, principal, text)
    return fast_json({"id": snap_id}, 201)


@router.post("/storage/identities")
def storage_identities(request: Request, db: DB, admin: Admin) -> Any:
    """Every user's uid and group's gid (admin); allocates those not given yet."""
    return fast_json({"items": svc.identities(db, request.app.state.settings, admin)})


@router.get("/jobs/{job_id}/outputs")
def job_outputs(job_id: RowId, request: Request, db: DB, principal: CurrentUser) -> Any:
    """The files a job wrote under /outputs (kept after it ends, deleted with the job)."""
    job = jobs_svc.get_job(db, principal, job_id)
    files = svc.list_outputs(request.app.state.settings, job)
    items = [{"path": f.path, "size": f.size, "modified_at": f.modified_at} for f in files]
    return fast_json({"job_id": job_id, "items": items})


@router.get("/jobs/{job_id}/outputs/file")
def job_output_file(
    job_id: RowId,
    request: Request,
    db: DB,
    principal: CurrentUser,
    path: Annotated[str, Query(min_length=1, max_length=code.MAX_PATH, json_schema_extra=PATH_IN_SCHEMA)],
) -> StreamingResponse:
    job = jobs_svc.get_job(db, principal, job_id)
    fd = svc.open_output(request.app.state.settings, job, path)
    size = os.fstat(fd).st_size
    return StreamingResponse(
        _stream(fd),
        media_type="application/octet-stream",
        headers={"Content-Length": str(size), "Content-Disposition": attachment(path.rsplit("/", 1)[-1])},
    )


def attachment(name: str) -> str:
    """A Content-Disposition for a file of any name. Header values are latin-1 bytes on the wire
    (a CJK name failed with UnicodeEncodeError, a latin-1 one reached clients undecodable), so the
    name goes as RFC 6266's `filename*` (UTF-8, percent-encoded) after an ASCII fallback."""
    fallback = "".join(c if " " <= c < "\x7f" and c not in '"\\' else "_" for c in name)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def _stream(fd: int) -> Iterator[bytes]:
    with os.fdopen(fd, "rb") as f:
        while block := f.read(READ_BLOCK):
            yield block
