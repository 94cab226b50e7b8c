"""Interactive workspaces (corral.services.workspaces): create, list, show, start, stop, remove,
and the admins' idle timeouts per group. JupyterLab itself is served by the proxy at `/ws/<id>/`
(corral.workspaces.proxy), not under /api/v1."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request, Response, status
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator

from corral.api.deps import DB, Admin, CurrentUser, NameInPath, UserFilter, fast_json
from corral.api.pattern_words import worded
from corral.api.routers.jobs import _DURATION_PATTERN, ENVIRONMENT_REF_PATTERN, MEMORY_PATTERN
from corral.api.schemas import RequestBody
from corral.services import workspaces as svc
from corral.services.policy import active_profile
from corral.services.workspaces import WorkspaceRequest
from corral.spec import (
    MAX_CPUS_PER_INSTANCE,
    MAX_DURATION_S,
    MAX_GPUS_PER_INSTANCE,
    MemoryMiB,
    _check_gpu_model,
    parse_duration_s,
)

router = APIRouter(tags=["workspaces"])
# What the validators accept, said in the schema too (tests/api/test_fuzz.py), as for job specs.
DURATION = WithJsonSchema(
    {
        "anyOf": [
            {"type": "number", "minimum": 1, "maximum": MAX_DURATION_S},
            {"type": "string", "pattern": _DURATION_PATTERN},
            {"type": "null"},
        ],
        "default": None,
        "description": "seconds, or a duration such as '2h'",
    }
)
MEMORY = WithJsonSchema(
    {
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": 64 * 1024 * 1024},
            {"type": "string", "pattern": MEMORY_PATTERN},
        ],
        "default": 4096,
        "description": "MiB, or a size such as '512MiB' or '16GiB'",
    }
)
GPU_MODEL = r"^[A-Za-z0-9][A-Za-z0-9._-]*(\|[A-Za-z0-9][A-Za-z0-9._-]*)*$"
Duration = Annotated[float | str | None, DURATION]


MIN_IDLE_TIMEOUT_S = 1.0


def _duration(value: Any) -> float | None:
    """An idle timeout of at least a second: a tinier one (`5e-324`) was stored as "0s", which
    the job spec then refused, a 500 (bench/fuzz_api.py)."""
    seconds = None if value is None else parse_duration_s(value)
    if seconds is not None and seconds < MIN_IDLE_TIMEOUT_S:
        raise ValueError(f"an idle timeout must be at least {MIN_IDLE_TIMEOUT_S:g}s")
    return seconds


# The pattern's refusal in words ("... does not match pattern ^[A-Za-z0-9]..." said nothing).
NAME_WORDS = (
    "is not a workspace name: up to 63 letters, digits, '.', '_' or '-', starting with a letter or digit"
)


class WorkspaceIn(RequestBody):
    model_config = ConfigDict(
        extra="forbid",
        str_strip_whitespace=True,
        json_schema_extra={"examples": [{"name": "example-notebook", "cpus": 1, "memory": 512}]},
    )

    name: str | None = Field(
        None, min_length=1, max_length=63, pattern=worded(svc.NAME_RE.pattern, NAME_WORDS)
    )
    gpus: int = Field(0, ge=0, le=MAX_GPUS_PER_INSTANCE)
    gpu_model: str | None = Field(None, max_length=256, pattern=GPU_MODEL)
    cpus: float = Field(1.0, gt=0, le=MAX_CPUS_PER_INSTANCE)
    memory: Annotated[MemoryMiB, MEMORY] = Field(4096, ge=1, le=64 * 1024 * 1024)
    environment: str = Field(
        "default", min_length=1, max_length=256, json_schema_extra={"pattern": ENVIRONMENT_REF_PATTERN}
    )
    idle_timeout: Duration = Field(None, description="e.g. '2h'; default: the group's")
    # `\S`: the name is taken stripped (str_strip_whitespace), so a value of only blanks ('\v')
    # was schema-valid and then refused as empty (schemathesis, stateful phase)
    group: str | None = Field(None, min_length=1, max_length=64, pattern=r"\S")
    start: bool = True

    @field_validator("gpu_model")
    @classmethod
    def _gpu_model(cls, value: str | None) -> str | None:
        return _check_gpu_model(value)

    @field_validator("idle_timeout")
    @classmethod
    def _idle_timeout(cls, value: float | str | None) -> float | None:
        return _duration(value)


class WaitingOut(BaseModel):
    state: str
    message: str
    reasons: list[dict[str, str]]
    queue_position: int | None
    estimated_start: float | None
    unschedulable: bool


class WorkspaceOut(BaseModel):
    id: int
    name: str
    user: str
    group: str
    state: str = Field(description="stopped | pending | starting | running | stopping")
    job_id: int | None
    job_state: str | None
    gpus: int
    gpu_model: str | None
    cpus: float
    memory_mib: int
    environment: str
    idle_timeout_s: float
    url: str = Field(
        description="JupyterLab, relative to the portal: the portal hands a browser over to the "
        "workspaces' own origin (CORRAL_WORKSPACE_PORT), where the proxy serves it"
    )
    ssh_user: str = Field(description="`ssh -p <ssh_port> <ssh_user>@<server>` through the SSH gateway")
    ssh_port: int
    waiting: WaitingOut | None
    failure: str | None = Field(
        description="why its current job failed (that job's reason, as `corral show` gives it); "
        "null unless that job failed"
    )
    reclaimed_gpu_hours: float
    idle_stopped_at: float | None = Field(
        description="when the idle policy stopped its current job (its idle timeout passed unused); "
        "null after a start, and for a stop by hand"
    )
    created_at: float
    updated_at: float


class PolicyIn(RequestBody):
    model_config = ConfigDict(extra="forbid")

    default_idle_timeout: Duration = Field(
        None, description="e.g. '2h'; null: the server's; left out: the group's stays as it is"
    )
    max_idle_timeout: Duration = Field(
        None, description="e.g. '1d'; null: the server's; left out: the group's stays as it is"
    )

    @field_validator("default_idle_timeout", "max_idle_timeout")
    @classmethod
    def _timeouts(cls, value: float | str | None) -> float | None:
        return _duration(value)


class PolicyOut(BaseModel):
    group: str
    default_idle_timeout_s: float
    max_idle_timeout_s: float
    default_idle_timeout_source: Literal["group", "server"] = Field(
        description="group: set for this group; server: CORRAL_WORKSPACE_IDLE_TIMEOUT_S"
    )
    max_idle_timeout_source: Literal["group", "server"] = Field(
        description="group: set for this group; server: CORRAL_WORKSPACE_MAX_IDLE_TIMEOUT_S"
    )


AllUsers = Annotated[bool, Query(description="every user's (admins)")]


@router.get("/workspaces", response_model=list[WorkspaceOut])
def list_workspaces(
    request: Request, db: DB, principal: CurrentUser, user: UserFilter = None, all: AllUsers = False
) -> Any:
    """Your workspaces (admins: `user=` or `all=true`)."""
    settings = request.app.state.settings
    return fast_json(svc.list_workspaces(db, principal, settings, user=user, all_users=all))


@router.post("/workspaces", response_model=WorkspaceOut, status_code=status.HTTP_201_CREATED)
def create_workspace(request: Request, db: DB, principal: CurrentUser, body: WorkspaceIn) -> Any:
    """Create a workspace and (unless `start` is false) start it: a job of kind `workspace`, queued
    like any job. 409: the name is taken; 422: it could never fit, or a bad field."""
    settings = request.app.state.settings
    req = WorkspaceRequest(
        name=body.name,
        gpus=body.gpus,
        gpu_model=body.gpu_model,
        cpus=body.cpus,
        memory_mib=body.memory,
        environment=body.environment,
        idle_timeout_s=body.idle_timeout if isinstance(body.idle_timeout, float) else None,
        group=body.group,
        start=body.start,
    )
    view = svc.create_workspace(db, principal, settings, active_profile(settings), req)
    return fast_json(view, status.HTTP_201_CREATED)


@router.get("/workspaces/policies", response_model=list[PolicyOut])
def list_policies(request: Request, db: DB, principal: CurrentUser) -> Any:
    """Each group's default and maximum idle timeout for workspaces: an admin's every group, others
    their own groups only."""
    return fast_json(svc.list_policies(db, request.app.state.settings, principal))


@router.put("/workspaces/policies/{group}", response_model=PolicyOut)
def set_policy(request: Request, group: NameInPath, body: PolicyIn, db: DB, principal: Admin) -> Any:
    """Admin: a group's default and maximum idle timeout (null: the server's). A field left out
    keeps the group's value: `{"default_idle_timeout": "2h"}` keeps its maximum. The answer says
    whose each value is (`*_source`: the group's own or the server's)."""
    given = body.model_fields_set
    default = body.default_idle_timeout if isinstance(body.default_idle_timeout, float) else None
    maximum = body.max_idle_timeout if isinstance(body.max_idle_timeout, float) else None
    settings = request.app.state.settings
    return fast_json(
        svc.set_policy(
            db,
            principal,
            settings,
            group,
            default if "default_idle_timeout" in given else svc.KEEP,
            maximum if "max_idle_timeout" in given else svc.KEEP,
        )
    )


@router.get("/workspaces/{name}", response_model=WorkspaceOut)
def show_workspace(
    request: Request, name: NameInPath, db: DB, principal: CurrentUser, user: UserFilter = None
) -> Any:
    return fast_json(svc.get_workspace(db, principal, request.app.state.settings, name, user))


@router.post("/workspaces/{name}/start", response_model=WorkspaceOut)
def start_workspace(
    request: Request, name: NameInPath, db: DB, principal: CurrentUser, user: UserFilter = None
) -> Any:
    """Start a stopped workspace: a new job. 409 while it is running or pending."""
    settings = request.app.state.settings
    return fast_json(svc.start_workspace(db, principal, settings, active_profile(settings), name, user))


@router.post("/workspaces/{name}/stop", response_model=WorkspaceOut)
def stop_workspace(
    request: Request, name: NameInPath, db: DB, principal: CurrentUser, user: UserFilter = None
) -> Any:
    """Stop it: its job is cancelled (files stay). 409 when it is already stopped."""
    return fast_json(svc.stop_workspace(db, principal, request.app.state.settings, name, user))


@router.delete("/workspaces/{name}", status_code=status.HTTP_204_NO_CONTENT)
def remove_workspace(name: NameInPath, db: DB, principal: CurrentUser, user: UserFilter = None) -> Response:
    """Stop it if it runs and remove it; the files in your home stay."""
    svc.remove_workspace(db, principal, name, user)
    return Response(status_code=204)
