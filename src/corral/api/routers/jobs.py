"""Jobs: submit (JSON or YAML), list, show, cancel, hold, release, label, events, notifications,
logs. Logic is in corral.services.jobs (holds: corral.services.holds; labels:
corral.services.job_labels; notifications: corral.services.job_notify)."""

from __future__ import annotations

import functools
import json
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import AfterValidator, ValidationError, WithJsonSchema

from corral import spec as job_spec
from corral.api.deps import DB, MAX_ROW_ID, CurrentUser, NameInPath, Offset, RowId, UserFilter, fast_json
from corral.api.pattern_words import worded
from corral.api.schemas import (
    LABEL_WORDS,
    CancelByLabelsIn,
    CancelByLabelsOut,
    CancelIn,
    EventOut,
    HoldByLabelsIn,
    HoldByLabelsOut,
    HoldOutcomeOut,
    JobListOut,
    JobMetricsOut,
    JobNotificationOut,
    JobOut,
    LabelsPatchIn,
    LogsOut,
    ManyMetricsOut,
    NotifyDefaultIn,
    NotifyDefaultOut,
    no_nul_in_properties,
    nul_at,
)
from corral.diagnosis.exitspec import ExitSpecCache, exit_spec_cache
from corral.diagnosis.record import platform_loss_cap
from corral.diagnosis.settings import DiagnosisSettings
from corral.engine.base import EngineUnavailable
from corral.environments.service import NAME_RE, check_job_environment
from corral.services import cleanup, holds, job_labels, job_metrics, job_notify, job_sets, storage
from corral.services import jobs as svc
from corral.services.job_logs import read_logs
from corral.services.job_metrics import read_metrics
from corral.services.lifecycle import JobState
from corral.services.policy import active_profile
from corral.services.views import event_view, job_view
from corral.spec import JobSpecV1, SpecError, load_spec_text

router = APIRouter(tags=["jobs"])

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")
NEEDS_ENGINE: dict[int | str, dict[str, Any]] = {
    503: {"description": "the execution engine is not available"}
}
SortBy = Literal["created_at", "submitted_at", "updated_at", "id", "priority", "state", "name"]
# A comma-separated list of job states (blanks around the commas allowed, empty items skipped).
_STATE = "(" + "|".join(s.value for s in JobState) + ")?"
STATE_LIST = rf"^\s*{_STATE}\s*(,\s*{_STATE}\s*)*$"


def _known_states(value: str) -> str:
    """The list as given, when every item is a job state; else a sentence naming the first
    unknown one and the states there are (the pattern's own message showed the regex)."""
    states = [s.value for s in JobState]
    unknown = next(
        (item for item in (s.strip() for s in value.split(",")) if item and item not in states), None
    )
    if unknown is not None:
        raise ValueError(f"unknown job state {unknown!r}: states are {', '.join(states)}")
    return value


# The pattern stays in the schema (clients and tests/api/test_fuzz.py read it); the validator
# checks the same and says what is wrong in words.
StateList = Annotated[
    str, AfterValidator(_known_states), WithJsonSchema({"type": "string", "pattern": STATE_LIST})
]
LabelSelector = Annotated[str, Query(max_length=200, pattern=worded(job_spec.LABEL_SELECTOR, LABEL_WORDS))]
# Any count in one value: more than MAX_IDS (1000), in one value or over repeated ones, is
# refused by the service in words that say so (a bound here said "not a list of job ids").
ID_LIST = r"^\s*[0-9]{1,10}\s*(,\s*[0-9]{1,10}\s*)*$"
ID_WORDS = "is not a list of job ids: whole numbers, comma-separated"
StatesParam = Annotated[list[StateList] | None, Query(description="job states; repeat or comma-separate")]
TailParam = Annotated[
    int, Query(ge=1, le=job_metrics.MAX_POINTS, description="points per job, the latest of them")
]
LabelsParam = Annotated[
    list[LabelSelector] | None,
    Query(
        max_length=job_spec.MAX_LABELS,
        description="NAME=VALUE (or NAME: any value) every job carries; repeat: all of them",
    ),
]
IdsParam = Annotated[
    list[Annotated[str, Query(max_length=12_000, pattern=worded(ID_LIST, ID_WORDS))]] | None,
    Query(alias="id", description=f"only these jobs; repeat or comma-separate, at most {svc.MAX_IDS}"),
]

# "90s", "1h30m": numbers with units, at least one of them not zero (the sum must be > 0).
_NUMBER = r"[0-9]+(?:\.[0-9]+)?[dhmsDHMS]"
_NONZERO = r"(?:[0-9]*[1-9][0-9]*(?:\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)[dhmsDHMS]"
_DURATION_PATTERN = rf"^\s*(?:{_NUMBER})*{_NONZERO}(?:{_NUMBER})*\s*$"
# A size with a unit, at least 1 MiB (the parser refuses less: "644K", "0M"): 1024 K or more,
# 1 M or more, 0.001 G or more, 0.000001 T or more; the parser reads a few more forms (bytes,
# "0.0009999G"), which the schema leaves out. The upper bound (64 TiB) a pattern cannot say.
_FRACTION = r"(?:\.[0-9]+)?"
_K_AT_LEAST_1024 = (
    rf"0*(?:[1-9][0-9]{{4,}}|[2-9][0-9]{{3}}|1[1-9][0-9]{{2}}|10[3-9][0-9]|102[4-9]){_FRACTION}"
)
_AT_LEAST_1 = rf"0*[1-9][0-9]*{_FRACTION}"
_G_AT_LEAST_MILLI = rf"(?:{_AT_LEAST_1}|0+\.(?:[1-9]|0[1-9]|00[1-9])[0-9]*)"
_T_AT_LEAST_MICRO = rf"(?:{_AT_LEAST_1}|0+\.0{{0,5}}[1-9][0-9]*)"
# "default", NAME or NAME@VERSION: the shape corral.environments.service.parse_ref reads.
ENVIRONMENT_REF_PATTERN = NAME_RE.pattern.removesuffix("$") + r"(?:@[0-9]{1,9})?$"
MEMORY_PATTERN = (
    rf"^\s*(?:{_K_AT_LEAST_1024}\s*[Kk]|{_AT_LEAST_1}\s*[Mm]|{_G_AT_LEAST_MILLI}\s*[Gg]"
    rf"|{_T_AT_LEAST_MICRO}\s*[Tt])(?:[Ii]?[Bb]?)\s*$"
)


def spec_body_schema() -> dict[str, Any]:
    """The JSON body's schema: the spec model's own, plus what its validators check that a
    model's schema does not say (task and env names, sizes and durations as text). YAML
    (Content-Type: application/yaml) is read too but left out: any text is a "valid" YAML
    string, and most are no spec. docs/security.md lists what the schema still cannot say."""
    schema = JobSpecV1.model_json_schema(ref_template="#/components/schemas/{model}")
    defs, props = schema["$defs"], schema["properties"]
    env = {
        "type": "object",
        "maxProperties": job_spec.MAX_ENV_VARS,
        "propertyNames": {
            "pattern": job_spec.ENV_NAME_RE.pattern,
            "not": {"enum": sorted(job_spec.SHELL_OWNED_ENV)},  # a shell's own: refused by name
        },
        "additionalProperties": {"type": "string"},  # no NUL: said below, as for every string
    }
    props["env"] = {**props["env"], **env}
    defs["TaskV1"]["properties"]["env"] = {**defs["TaskV1"]["properties"]["env"], **env}
    # Blanks around the command are stripped (`str_strip_whitespace`): a blank one is empty. No
    # NUL either, not even as the one non-blank character (\S alone matches a NUL).
    defs["TaskV1"]["properties"]["command"]["pattern"] = r"^[^\x00]*[^\s\x00][^\x00]*$"
    props["tasks"]["propertyNames"] = {"pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"}
    props["environment"] = {**props["environment"], "pattern": ENVIRONMENT_REF_PATTERN}
    props["labels"] = {  # text values, and numbers (read as their text: `trial: 7`)
        "type": "object",
        "default": {},
        "maxProperties": job_spec.MAX_LABELS,
        "propertyNames": {"pattern": job_spec.LABEL_KEY_RE.pattern},
        "additionalProperties": {
            "anyOf": [{"type": "string", "pattern": job_spec.LABEL_VALUE_RE.pattern}, {"type": "number"}]
        },
    }
    # "workspace" jobs are made by POST /workspaces (and .../start); this route refuses them
    props["kind"] = {"type": "null", "default": None}
    duration = {"type": "string", "pattern": _DURATION_PATTERN}
    for name in ("max_runtime", "stop_grace"):
        props[name] = {"anyOf": [duration, {"type": "null"}], "default": None}
    idle = defs["IdleGpuV1"]["properties"]
    idle["for"] = duration
    idle["grace"] = {"anyOf": [duration, {"type": "null"}], "default": None}
    resources = defs["ResourcesV1"]["properties"]
    resources["memory"] = {
        "anyOf": [
            {"type": "integer", "minimum": 1, "maximum": 64 * 1024 * 1024},
            {"type": "string", "pattern": MEMORY_PATTERN},
        ],
        "default": 1024,
        "description": "MiB, or a size such as '512MiB' or '64GiB'",
    }
    one_of = ("dataset", "group_storage")  # a mount names exactly one of them
    defs["MountV1"]["oneOf"] = [
        {"required": [name], "properties": {name: {"type": "string"}, other: {"type": "null"}}}
        for name, other in (one_of, one_of[::-1])
    ]
    model = r"[A-Za-z0-9][A-Za-z0-9._-]*"
    resources["gpu_model"] = {
        "anyOf": [
            {"type": "string", "maxLength": 256, "pattern": rf"^\s*{model}(?:\s*\|\s*{model})*\s*$"},
            {"type": "null"},
        ],
        "default": None,
    }
    # A spec that fits any node (no GPU, a tenth of a CPU): clients read it as a start, and a
    # stateful fuzzer gets jobs to follow the links from (GET, cancel, delete ...).
    schema["examples"] = [
        {
            "name": "example-job",
            "max_runtime": "5m",
            "tasks": {"main": {"command": "sleep 30", "resources": {"cpus": 0.1, "memory": 64}}},
        }
    ]
    # No string holds a NUL (read_spec refuses one anywhere, 422 naming its path): said for every
    # string without a pattern of its own, as RequestBody's models say it
    for model in (schema, *defs.values()):
        no_nul_in_properties(model)
    return schema


_SPEC_SCHEMA = spec_body_schema()


def budget(request: Request) -> int:
    """The platform-loss requeue budget this server applies, shown with each job's losses."""
    return int(request.app.state.settings.lost_requeue_budget)


@functools.cache
def _exit_spec() -> ExitSpecCache:
    """The exit-spec the server's loops use: the same cache of the same admin file."""
    return exit_spec_cache(DiagnosisSettings().exit_spec_file)


def detail(request: Request, job: Any, events: Any) -> dict[str, Any]:
    """A job's detail view with `platform_loss_cap`: the budget, or the lower cap of its latest
    failure's exit-spec rule, as the retry rules apply them (`corral show` prints it)."""
    view: dict[str, Any] = dict(job_view(job, events, lost_budget=budget(request)))
    ended = [a for a in view["attempts"] if a.get("ended_at") is not None]
    latest = max(ended, key=lambda a: a["number"], default=None)
    view["platform_loss_cap"] = platform_loss_cap(_exit_spec().get(), latest, budget(request))
    return view


def _body_error(msg: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("body",), "msg": msg, "type": "value_error"}])


async def read_spec(request: Request) -> JobSpecV1:
    """The spec from a JSON body, or from YAML text with Content-Type: application/yaml."""
    raw = await request.body()
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _body_error("the body is not UTF-8 text")
    if content_type in YAML_TYPES:
        try:
            data: Any = load_spec_text(text)
        except SpecError as exc:
            raise _body_error(str(exc))
    else:
        try:
            data = json.loads(text) if text.strip() else None
        except json.JSONDecodeError as exc:
            raise _body_error(
                f"the body is not valid JSON ({exc.msg} at line {exc.lineno}); "
                "send YAML with Content-Type: application/yaml"
            )
        if not isinstance(data, dict):
            raise _body_error("the spec must be a JSON object with fields such as 'name' and 'tasks'")
    try:
        spec = JobSpecV1.model_validate(data)
    except ValidationError as exc:
        errors = [{**err, "loc": ("body", *err["loc"])} for err in exc.errors()]
        raise RequestValidationError(errors)
    # The spec is no RequestBody (corral.spec is below the API): its NUL check, naming the field
    # (a group named with one was a 404 on SQLite and the DataError backstop's 422 on PostgreSQL).
    where = nul_at(data)
    if where is not None:
        msg = f"{where[-1]!r} holds a NUL character (\\x00), which no command line or stored text can"
        raise RequestValidationError([{"loc": ("body", *where), "msg": msg, "type": "value_error"}])
    return spec


@router.post(
    "/jobs",
    status_code=status.HTTP_201_CREATED,
    response_model=JobOut,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": _SPEC_SCHEMA},
            },
        }
    },
)
def submit(
    request: Request,
    principal: CurrentUser,
    spec: Annotated[JobSpecV1, Depends(read_spec)],
    db: DB,
    hold: Annotated[
        bool, Query(description="queue it held: never scheduled until POST /jobs/{id}/release")
    ] = False,
) -> Any:
    # `principal` before `spec`: dependencies resolve in this order, and a request without
    # credentials must get its 401 before anything is said about its body.
    """Validate, check the job can ever fit, and queue it under its group (default: yours)."""
    profile = active_profile(request.app.state.settings)
    spec = storage.check_job_storage(db, principal, spec, request.app.state.settings)
    spec = check_job_environment(db, principal, spec)  # pinned: `environment: digits@2`
    spec = job_notify.with_default(db, principal.user_id, spec)  # no `notify`: the submitter's default
    return fast_json(svc.submit_job(db, principal, spec, profile, hold=hold), status.HTTP_201_CREATED)


@router.get("/jobs", response_model=JobListOut)
def list_jobs(
    db: DB,
    principal: CurrentUser,
    request: Request,
    state: StatesParam = None,
    user: UserFilter = None,
    group: UserFilter = None,
    label: LabelsParam = None,
    ids: IdsParam = None,
    sort: SortBy = "created_at",
    order: Literal["asc", "desc"] = "desc",
    limit: Annotated[int, Query(ge=1, le=svc.MAX_PAGE)] = 50,
    offset: Offset = 0,
) -> Any:
    states = tuple(s.strip() for value in state or [] for s in value.split(",") if s.strip())
    flt = svc.JobFilter(
        state=states,
        user=user,
        group=group,
        labels=job_sets.label_selectors(label or [], ("query", "label")),
        ids=job_sets.job_ids(ids),
        sort=sort,
        order=order,
        limit=limit,
        offset=offset,
    )
    items, total = svc.list_jobs(db, principal, flt)
    return fast_json(
        {
            "items": [job_view(j, lost_budget=budget(request)) for j in items],
            "total": total,
            "limit": limit,
            "offset": offset,
        }
    )


@router.post("/jobs/cancel", response_model=CancelByLabelsOut)
def cancel_by_labels(body: CancelByLabelsIn, db: DB, principal: CurrentUser) -> Any:
    """Cancel every live job of yours (or of `user`, or `all_users`: admins, group admins) that
    carries all the labels (an experiment's trials): each as POST /jobs/{id}/cancel does it, in a
    transaction of its own; what happened to each."""
    labels = job_sets.label_selectors(body.labels, ("body", "labels"))
    scope = job_sets.scope_condition(db, principal, body.user, body.all_users)
    return fast_json(job_sets.cancel_by_labels(db, principal, labels, scope=scope, reason=body.reason))


@router.post("/jobs/hold", response_model=HoldByLabelsOut)
def hold_by_labels(body: HoldByLabelsIn, db: DB, principal: CurrentUser) -> Any:
    """Hold every queued job of yours (or of `user`, or `all_users`: admins, group admins) that
    carries all the labels: each as POST /jobs/{id}/hold does it, in a transaction of its own;
    what happened to each."""
    labels = job_sets.label_selectors(body.labels, ("body", "labels"))
    scope = job_sets.scope_condition(db, principal, body.user, body.all_users)
    return fast_json(job_sets.hold_by_labels(db, principal, labels, scope=scope))


@router.post("/jobs/release", response_model=HoldByLabelsOut)
def release_by_labels(body: HoldByLabelsIn, db: DB, principal: CurrentUser) -> Any:
    """Release every queued job of yours (or of `user`, or `all_users`) that carries all the
    labels: each as POST /jobs/{id}/release does it (an admin's hold only an admin releases), in a
    transaction of its own; what happened to each (`unchanged`: it was not held)."""
    labels = job_sets.label_selectors(body.labels, ("body", "labels"))
    scope = job_sets.scope_condition(db, principal, body.user, body.all_users)
    return fast_json(job_sets.release_by_labels(db, principal, labels, scope=scope))


@router.get("/jobs/metrics", response_model=ManyMetricsOut)
def many_metrics(
    db: DB,
    principal: CurrentUser,
    request: Request,
    label: LabelsParam = None,
    ids: IdsParam = None,
    state: StatesParam = None,
    user: UserFilter = None,
    tail: TailParam = job_metrics.MANY_DEFAULT_TAIL,
    limit: Annotated[int, Query(ge=1, le=job_metrics.MANY_MAX_JOBS)] = 100,
    offset: Offset = 0,
) -> Any:
    """The metrics of many jobs at once (an experiment's trials, by label or id; `user`: only
    theirs), by id: each job's latest `tail` points as GET /jobs/{id}/metrics gives them, with
    its state and labels; tail x limit at most 100,000 points."""
    flt = svc.JobFilter(
        state=tuple(s.strip() for value in state or [] for s in value.split(",") if s.strip()),
        user=user,
        labels=job_sets.label_selectors(label or [], ("query", "label")),
        ids=job_sets.job_ids(ids),
        limit=limit,
        offset=offset,
    )
    return fast_json(job_metrics.read_many(db, principal, request.app.state.settings, flt, tail))


@router.get("/jobs/{job_id}", response_model=JobOut)
def show(job_id: RowId, db: DB, principal: CurrentUser, request: Request) -> Any:
    job = svc.get_job(db, principal, job_id)
    return fast_json(detail(request, job, svc.job_events(db, job.id)))


@router.post("/jobs/{job_id}/cancel", response_model=JobOut)
def cancel(
    job_id: RowId, db: DB, principal: CurrentUser, request: Request, body: CancelIn | None = None
) -> Any:
    """Queued jobs end at once; active jobs get cancel_requested and the control loops stop them.
    An optional body's `reason` follows who cancelled it in the job's reason and event."""
    job = svc.cancel_job(db, principal, job_id, reason=None if body is None else body.reason)
    return job_view(job, svc.job_events(db, job.id), lost_budget=budget(request))


@router.patch("/jobs/{job_id}/labels", response_model=JobOut)
def edit_labels(job_id: RowId, body: LabelsPatchIn, db: DB, principal: CurrentUser, request: Request) -> Any:
    """Edit a job's labels, in any state (owner, group admin, admin): a JSON merge patch,
    `{"labels": {"trial": "8", "stale": null}}` sets trial and removes stale; labels not named
    stay. The rules of submit; at most 16 labels in the end (422). The job as it is now."""
    job = job_labels.edit_labels(db, principal, job_id, body.labels)
    return job_view(job, svc.job_events(db, job.id), lost_budget=budget(request))


@router.post("/jobs/{job_id}/hold", response_model=HoldOutcomeOut)
def hold(job_id: RowId, db: DB, principal: CurrentUser) -> Any:
    """Hold a queued job back from the scheduler (owner, group admin, admin); 409 once it left
    the queue. Holding a held job changes nothing (`changed` false)."""
    return fast_json(holds.hold_job(db, principal, job_id))


@router.post("/jobs/{job_id}/release", response_model=HoldOutcomeOut)
def release(job_id: RowId, db: DB, principal: CurrentUser) -> Any:
    """Release a held job: schedulable again at once. An admin's hold only an admin releases (403).
    Releasing a job that is not held changes nothing (`changed` false)."""
    return fast_json(holds.release_job(db, principal, job_id))


@router.delete("/jobs/{job_id}", status_code=status.HTTP_204_NO_CONTENT, responses=NEEDS_ENGINE)
def delete(job_id: RowId, request: Request, db: DB, principal: CurrentUser) -> Response:
    """A finished job and its logs, by its owner or an admin (409 while it has not ended)."""
    cleanup.delete_job(
        db, principal, job_id, request.app.state.engine, request.app.state.settings.storage_path
    )
    return Response(status_code=status.HTTP_204_NO_CONTENT)


EARLIER_EVENTS_HEADER = "X-Corral-Earlier-Events"


@router.get(
    "/jobs/{job_id}/events",
    response_model=list[EventOut],
    responses={
        200: {
            "headers": {
                EARLIER_EVENTS_HEADER: {
                    "description": "how many of the job's events come before the first of these",
                    "schema": {"type": "integer", "minimum": 0},
                }
            }
        }
    },
)
def events(
    job_id: RowId,
    db: DB,
    principal: CurrentUser,
    response: Response,
    skip: Offset = 0,
    limit: Annotated[int, Query(ge=1, le=svc.EVENTS_SHOWN)] = svc.EVENTS_SHOWN,
    before: Annotated[int | None, Query(ge=1, le=MAX_ROW_ID)] = None,
) -> Any:
    """A job's newest `limit` events after its newest `skip`, of those older than the event with
    id `before` if given, oldest first: page back with `before` the first event's id (a page that
    stays put while the job adds events; `skip` counts from the newest, so it shifts). The
    X-Corral-Earlier-Events header: how many of its events come before the first of them."""
    job = svc.get_job(db, principal, job_id)
    history = svc.job_events(db, job.id, limit=limit, skip=skip, before=before)
    response.headers[EARLIER_EVENTS_HEADER] = str(history.earlier)
    return [event_view(e) for e in history.events]


@router.get("/jobs/{job_id}/metrics", response_model=JobMetricsOut)
def metrics(job_id: RowId, request: Request, db: DB, principal: CurrentUser) -> Any:
    """The metrics the job reported: the lines it appended to $CORRAL_OUTPUTS/metrics.jsonl
    ({"step": 3, "loss": 0.41}), read while it runs and after it ended; none yet: no points."""
    job = svc.get_job(db, principal, job_id)
    return fast_json(read_metrics(request.app.state.settings, job))


@router.get("/jobs/{job_id}/notifications", response_model=list[JobNotificationOut])
def notifications(job_id: RowId, db: DB, principal: CurrentUser) -> Any:
    """What the job's `notify` sent its owner, and how each delivery stands (services/job_notify.py)."""
    return job_notify.notifications_of(db, principal, svc.get_job(db, principal, job_id))


@router.get("/users/{name}/job-notify", response_model=NotifyDefaultOut)
def get_notify_default(name: NameInPath, db: DB, principal: CurrentUser) -> Any:
    """The `notify` a user's jobs get when their spec has none (themselves and admins)."""
    return job_notify.default_view(db, principal, name)


@router.put("/users/{name}/job-notify", response_model=NotifyDefaultOut)
def set_notify_default(name: NameInPath, body: NotifyDefaultIn, db: DB, principal: CurrentUser) -> Any:
    """Set it (`{"notify": {"on": ["failed"]}}`) or clear it (`{"notify": null}`): for jobs
    submitted from now on."""
    return job_notify.set_default(db, principal, name, body.notify)


@router.get("/jobs/{job_id}/logs", response_model=LogsOut, responses=NEEDS_ENGINE)
def logs(
    job_id: RowId,
    request: Request,
    db: DB,
    principal: CurrentUser,
    attempt: Annotated[int | None, Query(ge=1, le=MAX_ROW_ID)] = None,
    rank: Annotated[int, Query(ge=0, le=MAX_ROW_ID)] = 0,
    offset: Annotated[int, Query(ge=0, le=2**40)] = 0,  # 1 TiB: a seek past 2**62 was a 500
    limit: Annotated[int, Query(ge=1, le=8 << 20)] = 1 << 20,
) -> Any:
    """While the job waits (no attempt yet, or queued again), `waiting` says why and when."""
    job = svc.get_job(db, principal, job_id)
    engine = request.app.state.engine
    try:
        return read_logs(engine, job, attempt=attempt, rank=rank, offset=offset, limit=limit)
    except EngineUnavailable as exc:
        raise svc.EngineMissing(f"logs are unavailable right now: {exc}")
