"""Job templates: list, show, publish (from a spec or a job), use (render + submit), share,
delete. Logic is in corral.catalog.templates."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request, Response, status
from pydantic import ConfigDict, Field

from corral.api.deps import DB, MAX_ROW_ID, CurrentUser, fast_json
from corral.api.pattern_words import NAME_WORDS, worded
from corral.api.schemas import NO_NUL_PATTERN, RequestBody
from corral.catalog import templates as svc
from corral.catalog.access import NAME_PATTERN
from corral.catalog.model_mounts import SANDBOX_MODELS
from corral.catalog.models import mount_ref
from corral.services.policy import active_profile
from corral.spec import MountV1

router = APIRouter(tags=["templates"])
TEMPLATE_NAME = worded(NAME_PATTERN, NAME_WORDS)  # refused in words, not with the regex
TemplateName = Annotated[str, Path(pattern=TEMPLATE_NAME)]
Value = str | int | float | bool
MODEL_REF = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}(@[A-Za-z0-9]{1,16})?$"


class _In(RequestBody):
    model_config = ConfigDict(extra="forbid")


class PublishIn(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [{"required": ["spec"]}, {"required": ["from_job"]}],
            "examples": [
                {
                    "name": "example-sweep",
                    "spec": {
                        "name": "sweep",
                        "parameters": {"seconds": {"default": 1}},
                        "command": "sleep {{ seconds }}",
                    },
                }
            ],
        },
    )
    name: str = Field(pattern=TEMPLATE_NAME)
    spec: str | dict[str, Any] | None = Field(
        None, description="the template: a job spec (YAML text or an object) with `parameters:`"
    )
    from_job: int | None = Field(None, ge=1, le=MAX_ROW_ID, description="save this job's spec as a template")
    description: str | None = Field(None, max_length=4096)
    group: str | None = Field(None, min_length=1, max_length=64)
    visibility: Literal["private", "group", "public"] | None = None


class UseIn(_In):
    # A parameter's name holds no NUL (refused, 422 naming 'values'), said in the schema: the
    # no-NUL pattern RequestBody gives strings covers the values, not the keys.
    values: dict[str, Value] = Field(
        default_factory=dict, max_length=64, json_schema_extra={"propertyNames": {"pattern": NO_NUL_PATTERN}}
    )
    version: int | None = Field(None, ge=1, le=1_000_000_000)
    models: list[Annotated[str, Field(pattern=MODEL_REF)]] = Field(
        default_factory=list,
        max_length=8,
        description="model versions (`name`, `name@3`, `name@production`), read-only at /models/<name>",
    )


class ShareIn(_In):
    visibility: Literal["private", "group", "public"]
    group: str | None = Field(None, min_length=1, max_length=64)


@router.get("/templates")
def list_templates(db: DB, principal: CurrentUser) -> Any:
    """The templates the caller may use: their own, their groups' (shared), public ones."""
    return fast_json(svc.list_templates(db, principal))


@router.post("/templates", status_code=status.HTTP_201_CREATED)
def publish(body: PublishIn, db: DB, principal: CurrentUser) -> Any:
    """A new template, or a new version of yours; 422 naming the parameter or field that is wrong."""
    view = svc.publish(
        db,
        principal,
        body.name,
        body.spec,
        description=body.description,
        group=body.group,
        visibility=body.visibility,
        from_job=body.from_job,
    )
    return fast_json(view, status.HTTP_201_CREATED)


@router.get("/templates/{name}")
def show(
    name: TemplateName,
    db: DB,
    principal: CurrentUser,
    version: Annotated[int | None, Query(ge=1, le=1_000_000_000)] = None,
) -> Any:
    """A template the caller may use: its parameters (type, default, range) and spec, the latest version
    or `version`."""
    row = svc.readable(db, name, principal)
    return fast_json(svc.template_view(db, row, svc.version_of(db, row, version)))


def model_mounts(db: DB, principal: CurrentUser, refs: list[str]) -> list[MountV1]:
    mounts = []
    for ref in refs:
        model, version = mount_ref(db, principal, ref)
        mounts.append(
            MountV1(source=f"model/{model}@{version}", target=f"{SANDBOX_MODELS}/{model}", mode="ro")
        )
    return mounts


@router.post("/templates/{name}/use", status_code=status.HTTP_201_CREATED)
def use(name: TemplateName, body: UseIn, request: Request, db: DB, principal: CurrentUser) -> Any:
    """Render the template with `values` (defaults for the rest) and submit the job; 422 naming
    the parameter when a value has the wrong type or is out of range."""
    settings = request.app.state.settings
    job = svc.use(
        db,
        principal,
        name,
        body.values,
        settings,
        active_profile(settings),
        version=body.version,
        extra_mounts=model_mounts(db, principal, body.models),
    )
    return fast_json(job, status.HTTP_201_CREATED)


@router.post("/templates/{name}/share")
def share(name: TemplateName, body: ShareIn, db: DB, principal: CurrentUser) -> Any:
    """Who may use it (`private`, `group` with `group`, `public`): its owner, an admin of its group or an
    admin."""
    return fast_json(svc.share(db, principal, name, body.visibility, body.group))


@router.delete("/templates/{name}", status_code=status.HTTP_204_NO_CONTENT)
def delete(name: TemplateName, db: DB, principal: CurrentUser) -> Response:
    """Delete the template and every version (its owner, an admin of its group or an admin); jobs made
    from it stay."""
    svc.delete_template(db, principal, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
