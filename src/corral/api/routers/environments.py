"""The environments catalogue (corral.environments.service): list, show, create a version (its
build job is queued as you), delete. A job selects one with `environment: NAME[@VERSION]`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field

from corral.api.deps import DB, CurrentUser, fast_json
from corral.api.pattern_words import NAME_WORDS, worded
from corral.api.schemas import RequestBody
from corral.environments import service as svc
from corral.services.policy import active_profile

router = APIRouter(tags=["environments"])
ENV_NAME = worded(svc.NAME_RE.pattern, NAME_WORDS)  # refused in words, not with the regex
EnvName = Annotated[str, Path(pattern=ENV_NAME, max_length=64)]


class EnvironmentIn(RequestBody):
    """A new version of environment `name` (created when new) from a requirements.txt or a
    pyproject.toml text, built by a build job queued as you."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"name": "example-env", "source": "six==1.16.0\n"}]},
    )

    # "default" is the server's own environment: the schema says so too (`not`), as the service does
    name: str = Field(
        pattern=ENV_NAME,
        max_length=64,
        json_schema_extra={"not": {"const": "default"}},
    )
    source: str = Field(min_length=1, max_length=svc.MAX_SOURCE_BYTES)
    source_kind: Literal["requirements", "pyproject"] = "requirements"
    visibility: Literal["private", "group", "public"] = "private"
    group: str | None = Field(None, min_length=1, max_length=64)
    official: bool = False
    description: str = Field("", max_length=4096)


class EnvironmentVersionOut(BaseModel):
    name: str
    version: int
    ref: str  # "name@3", what a job's `environment:` is pinned to
    state: Literal["building", "ready", "failed"]
    source_kind: str
    source: str
    python: str  # the interpreter's version
    interpreter: str  # the interpreter it is built for ("" for versions from before it was recorded)
    lock: str | None
    cache_key: str | None
    cache_hit: bool
    build_job_id: int | None  # its log: GET /jobs/{id}/logs
    error: str
    created_by: str
    created_at: float
    built_at: float | None


class EnvironmentOut(BaseModel):
    name: str
    owner: str
    group: str | None
    visibility: str
    official: bool
    description: str
    created_at: float
    latest_ready: int | None
    versions: list[EnvironmentVersionOut]


@router.get("/environments", response_model=list[EnvironmentOut])
def list_environments(db: DB, principal: CurrentUser) -> Any:
    """The environments you may use: official first, then by name."""
    return fast_json(svc.list_environments(db, principal))


@router.post("/environments", status_code=status.HTTP_201_CREATED, response_model=EnvironmentVersionOut)
def create_environment(body: EnvironmentIn, request: Request, db: DB, principal: CurrentUser) -> Any:
    """Queue the build of a new version; poll GET /environments/{name}/versions/{version}."""
    settings = request.app.state.settings
    req = svc.CreateRequest(**body.model_dump())
    view = svc.create(db, principal, settings, active_profile(settings), req)
    return fast_json(view, status.HTTP_201_CREATED)


@router.get("/environments/{name}", response_model=EnvironmentOut)
def show_environment(name: EnvName, db: DB, principal: CurrentUser) -> Any:
    """An environment the caller may read, with every version (state, lock hash, cache hit, build job)."""
    return fast_json(svc.show(db, principal, name))


@router.get("/environments/{name}/versions/{version}", response_model=EnvironmentVersionOut)
def show_version(
    name: EnvName, version: Annotated[int, Path(ge=1, le=999_999_999)], db: DB, principal: CurrentUser
) -> Any:
    """One version with its lock, interpreter and build job (or why its build failed)."""
    return fast_json(svc.get_version(db, principal, name, version))


@router.delete("/environments/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete_environment(
    name: EnvName,
    db: DB,
    principal: CurrentUser,
    version: Annotated[int | None, Query(ge=1, le=999_999_999, description="only this version")] = None,
) -> Response:
    """The environment (or one version); 409 while an active job uses it or it is building."""
    svc.delete(db, principal, name, version)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
