"""The model registry: models, versions (register from a job's outputs, show, files, promote,
delete), compare, share. Logic is in corral.catalog.models."""

from __future__ import annotations

import os
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response, status
from fastapi.responses import FileResponse
from pydantic import ConfigDict, Field

from corral.api.deps import DB, MAX_ROW_ID, CurrentUser, fast_json
from corral.api.pattern_words import NAME_WORDS, worded
from corral.api.schemas import RequestBody
from corral.catalog import model_files
from corral.catalog import models as svc
from corral.catalog.access import NAME_PATTERN
from corral.services.errors import Invalid, NotFound

router = APIRouter(tags=["models"])
ModelName = Annotated[str, Path(pattern=worded(NAME_PATTERN, NAME_WORDS))]
VersionNumber = Annotated[int, Path(ge=1, le=1_000_000_000)]
# A version as a model reference names one: a number (3, v3) or a stage (the newest version in it).
VersionRef = Annotated[
    str,
    Path(
        pattern=worded(
            r"^([vV]?0*[1-9][0-9]{0,8}|none|staging|production|archived)$",
            "is not a version: write a number such as 3 or v3, or a stage (none, staging, production, "
            "archived)",
        )
    ),
]
Metric = float | int | str | bool


class _In(RequestBody):
    model_config = ConfigDict(extra="forbid")


class RegisterIn(_In):
    job_id: int = Field(ge=1, le=MAX_ROW_ID, description="a job that succeeded")
    path: str = Field(
        "",
        max_length=1024,
        description="under the job's /outputs ('' = all of it)",
        json_schema_extra={"pattern": model_files.PATH_PATTERN},  # the service explains refusals
    )
    framework: str = Field("", max_length=64)
    metrics: dict[str, Metric] = Field(default_factory=dict, max_length=256)
    card: str = Field("", max_length=svc.MAX_CARD, description="the model card (markdown)")
    code_checksum: str | None = Field(None, max_length=128)
    group: str | None = Field(None, min_length=1, max_length=64, description="owning group (new model)")
    description: str | None = Field(None, max_length=4096)


class PromoteIn(_In):
    stage: Literal["none", "staging", "production", "archived"]


class ShareIn(_In):
    visibility: Literal["private", "group", "public"]
    group: str | None = Field(None, min_length=1, max_length=64)


def root_of(request: Request) -> Any:
    return request.app.state.settings.storage_path


@router.get("/models")
def list_models(db: DB, principal: CurrentUser) -> Any:
    """The models the caller may read: their own, their groups' (shared), public ones."""
    return fast_json(svc.list_models(db, principal))


@router.get("/models/{name}")
def show(name: ModelName, db: DB, principal: CurrentUser) -> Any:
    """A model with every version (stage, metrics, source job)."""
    return fast_json(svc.model_view(db, svc.readable(db, name, principal), detail=True))


@router.delete("/models/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_model(name: ModelName, request: Request, db: DB, principal: CurrentUser) -> Response:
    """Every version (409 naming the jobs while one not yet ended mounts one)."""
    svc.delete_model(db, principal, root_of(request), name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/models/{name}/versions", status_code=status.HTTP_201_CREATED)
def register(name: ModelName, body: RegisterIn, request: Request, db: DB, principal: CurrentUser) -> Any:
    """A new version from a finished job's outputs (copied: it outlives the job), with lineage."""
    view = svc.register(
        db,
        principal,
        root_of(request),
        name,
        body.job_id,
        path=body.path,
        framework=body.framework,
        metrics=body.metrics,
        card=body.card,
        code_checksum=body.code_checksum,
        group=body.group,
        description=body.description,
    )
    return fast_json(view, status.HTTP_201_CREATED)


@router.get("/models/{name}/versions/{version}")
def show_version(name: ModelName, version: VersionRef, db: DB, principal: CurrentUser) -> Any:
    """One version with its card and lineage: `3`, `v3`, or a stage (`production`: the newest
    version in it, as `model/NAME@production` mounts)."""
    return fast_json(svc.show_version(db, principal, name, version))


@router.delete("/models/{name}/versions/{version}", status_code=status.HTTP_204_NO_CONTENT)
def delete_version(
    name: ModelName, version: VersionNumber, request: Request, db: DB, principal: CurrentUser
) -> Response:
    """409 naming the jobs while a job not yet ended mounts this version."""
    svc.delete_version(db, principal, root_of(request), name, version)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/models/{name}/versions/{version}/stage")
def promote(name: ModelName, version: VersionNumber, body: PromoteIn, db: DB, principal: CurrentUser) -> Any:
    """Move the version to another stage (none, staging, production, archived); 409 for a move
    corral.catalog.models.TRANSITIONS does not allow, naming both stages."""
    return fast_json(svc.promote(db, principal, name, version, body.stage))


@router.get("/models/{name}/versions/{version}/files")
def files(name: ModelName, version: VersionNumber, request: Request, db: DB, principal: CurrentUser) -> Any:
    """A version's files, {path, size} each."""
    top = svc.files_of(db, principal, root_of(request), name, version)
    return fast_json({"name": name, "version": version, "items": model_files.list_files(top)})


@router.get("/models/{name}/versions/{version}/file")
def file(
    name: ModelName,
    version: VersionNumber,
    request: Request,
    db: DB,
    principal: CurrentUser,
    path: Annotated[str, Query(min_length=1, max_length=1024)],
) -> FileResponse:
    """One file of a version (`path` as GET .../files lists it), as raw bytes."""
    top = svc.files_of(db, principal, root_of(request), name, version)
    try:
        found = model_files.file_of(top, path)
    except model_files.OutsideOutputs as exc:
        raise Invalid(str(exc), ("query", "path")) from None
    except FileNotFoundError:
        raise NotFound(f"model {name!r} v{version} has no file {path!r}") from None
    return FileResponse(found, filename=os.path.basename(path), media_type="application/octet-stream")


@router.get("/models/{name}/compare")
def compare(
    name: ModelName,
    db: DB,
    principal: CurrentUser,
    a: Annotated[int, Query(ge=1, le=1_000_000_000)],
    b: Annotated[int, Query(ge=1, le=1_000_000_000)],
) -> Any:
    """Two versions' metrics side by side, with b - a where both are numbers."""
    return fast_json(svc.compare(db, principal, name, a, b))


@router.post("/models/{name}/share")
def share(name: ModelName, body: ShareIn, db: DB, principal: CurrentUser) -> Any:
    """Who may read it (`private`, `group` with `group`, `public`): its owner, an admin of its group or
    an admin."""
    return fast_json(svc.share(db, principal, name, body.visibility, body.group))
