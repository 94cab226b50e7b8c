"""On-call schedules, escalation policies, pages, people's contact methods, and the acknowledge
link (docs/operations.md, "On-call", "Escalation", "Notifications"). Thin over
corral.services.oncall and corral.services.paging."""

from __future__ import annotations

import html
import time
from datetime import date
from typing import Annotated, Any, Literal
from zoneinfo import available_timezones

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue

from corral.api.deps import DB, NO_NUL_TEXT, CurrentUser, NameInPath, RowId, fast_json
from corral.api.pattern_words import worded
from corral.api.schemas import BooleansApart
from corral.services import oncall as svc
from corral.services import oncall_feed, paging, webhook_guard
from corral.services.accounts import NAME_RE

router = APIRouter(tags=["oncall"])
HHMM = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"
UserName = Annotated[str, Field(min_length=1, max_length=64)]
NewName = Annotated[
    str, Path(pattern=NAME_RE.pattern, description="lower-case letters, digits, '.', '_', '-'")
]
ZONES = sorted(z for z in available_timezones() if "/" in z or z == "UTC")
ZONE_ENUM: list[JsonValue] = list(ZONES)
EMAIL_PATTERN = svc.EMAIL_RE.pattern
FeedToken = Annotated[
    str, Path(min_length=34, max_length=100, pattern=r"^[a-z0-9][a-z0-9._-]{0,63}\.[0-9a-f]{32}$")
]
Token = Annotated[str, Path(min_length=10, max_length=400, pattern=r"^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")]


class _In(BooleansApart):  # `"repeat": false` is no count, as the schema says
    model_config = ConfigDict(extra="forbid")


class LayerIn(_In):
    name: str | None = Field(None, min_length=1, max_length=64)
    rotation: Literal["daily", "weekly"]
    start_date: date = Field(description="the first member's first shift (local)")
    handoff: str = Field("09:00", pattern=HHMM, description="local wall-clock time of every handoff")
    members: list[UserName] = Field(min_length=1, max_length=100, description="user names, in rotation order")
    restrict_from: str | None = Field(None, pattern=HHMM, description="cover only from this local time ...")
    restrict_to: str | None = Field(None, pattern=HHMM, description="... to this one (may wrap midnight)")


class ScheduleIn(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "time_zone": "UTC",
                    "fallback_user": "admin",
                    "layers": [{"rotation": "weekly", "start_date": "2026-01-05", "members": ["admin"]}],
                }
            ]
        },
    )

    time_zone: str = Field(
        "UTC",
        min_length=1,
        max_length=64,
        description="IANA name, e.g. Europe/Berlin",
        json_schema_extra={"enum": ZONE_ENUM},
    )
    description: str = Field("", max_length=2000)
    fallback_user: UserName | None = Field(None, description="paged while nobody is on call (a gap)")
    layers: list[LayerIn] = Field(default_factory=list, max_length=20, description="later layers win")


class ShiftOut(BaseModel):
    user: str | None
    source: str
    start: float
    end: float


class OnCallNow(BaseModel):
    user: str | None
    source: str
    until: float | None


class OverrideOut(BaseModel):
    id: int
    user: str
    start: float
    end: float


class ScheduleOut(BaseModel):
    name: str
    time_zone: str
    description: str
    fallback_user: str | None
    layers: list[dict[str, Any]]
    on_call: OnCallNow
    shifts: list[ShiftOut]
    overrides: list[OverrideOut]
    warnings: list[str] = Field(description="gaps in the next 14 days, and who is paged in them")
    ical_feed: str | None = Field(
        None,
        description="calendar subscription path (no login; GET /schedules/{name}): shown to admins "
        "and the schedule's own people only, else null",
    )


class FeedOut(BaseModel):
    ical_feed: str = Field(description="the new calendar subscription path; the old one is refused")


class WhoOut(BaseModel):
    schedule: str
    user: str | None
    source: str
    until: float | None = Field(description="when this shift ends; null: not within the next 14 days")
    next: ShiftOut | None


class OverrideIn(_In):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"user": "admin", "start": 1893456000, "end": 1893459600}]},
    )

    user: UserName
    start: float = Field(ge=0, le=4e9, description="unix seconds")
    end: float = Field(ge=0, le=4e9, description="unix seconds")


class StepIn(_In):
    """Exactly one of `schedule` or `user`, as the schema says too."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"oneOf": [{"required": ["schedule"]}, {"required": ["user"]}]},
    )

    schedule: str | None = Field(None, min_length=1, max_length=64, description="notify who is on call here")
    user: UserName | None = Field(None, description="or notify this user")
    wait_minutes: float = Field(0, ge=0, le=10080, description="then wait this long before the next step")


class PolicyIn(_In):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"steps": [{"user": "admin", "wait_minutes": 10}]}]}
    )

    description: str = Field("", max_length=2000)
    steps: list[StepIn] = Field(min_length=1, max_length=svc.MAX_STEPS)
    repeat: int = Field(0, ge=0, le=svc.MAX_REPEAT, description="run all steps again this many more times")


class PolicyOut(BaseModel):
    name: str
    description: str
    repeat: int
    steps: list[dict[str, Any]]


class PageIn(_In):
    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"policy": "example-policy", "subject": "disk full"}]}
    )

    policy: str = Field(min_length=1, max_length=64)
    subject: str = Field(min_length=1, max_length=300)
    body: str = Field("", max_length=20000)
    key: str | None = Field(None, min_length=1, max_length=200, description="idempotency key")


class PageOut(BaseModel):
    id: int
    key: str
    policy: str
    subject: str
    body: str
    state: Literal["triggered", "acknowledged", "cancelled", "exhausted"]
    round: int
    next_step: int
    next_at: float | None
    created_at: float
    acked_at: float | None
    acked_by: str | None
    ended_at: float | None
    log: list[str]
    notifications: list[dict[str, Any]]


class ContactIn(_In):
    kind: Literal["email", "webhook", "slack"]
    address: str = Field(
        min_length=3,
        max_length=1024,
        # A URL holds no control character (httpx, which the paging loop POSTs with, refuses one).
        pattern=worded(
            rf"^(https?://[^\s/\x00-\x1f\x7f]+[^\s\x00-\x1f\x7f]*|{EMAIL_PATTERN[1:-1]})$",
            "is neither an email address nor an http(s):// URL",
        ),
        description="an email address (kind email) or an http(s):// URL (webhook, slack)",
    )


class EmailIn(_In):
    email: str | None = Field(
        None,
        max_length=254,
        pattern=worded(EMAIL_PATTERN, "is not an email address"),
        description="null removes it",
    )


class ContactsOut(BaseModel):
    user: str
    email: str | None
    methods: list[dict[str, Any]]


# --- schedules ----------------------------------------------------------------------------------


@router.get("/oncall/now", response_model=list[WhoOut])
def on_call_now(
    db: DB,
    _: CurrentUser,
    schedule: Annotated[str | None, Query(min_length=1, max_length=64, pattern=NO_NUL_TEXT)] = None,
) -> Any:
    """Who is on call now, per schedule (or for one), until when, and who is next."""
    return fast_json(svc.who_is_on_call(db, schedule, time.time()))


@router.get("/oncall/schedules", response_model=list[ScheduleOut])
def list_schedules(db: DB, _: CurrentUser) -> Any:
    return fast_json(svc.list_schedules(db, time.time()))


@router.get("/oncall/schedules/{name}", response_model=ScheduleOut)
def get_schedule(
    name: NameInPath,
    request: Request,
    db: DB,
    principal: CurrentUser,
    days: Annotated[float, Query(gt=0, le=90)] = 7.0,
) -> Any:
    """The definition, who is on call now, the shifts of the next `days`, gap warnings, and, for
    admins and the schedule's own people, the path of the calendar subscription URL (`ical_feed`,
    works without logging in; null for anyone else)."""
    row = svc.schedule_by_name(db, name)
    view = svc.schedule_view(db, row, time.time(), days)
    key = paging.link_key(request.app.state.settings)
    feed = oncall_feed.feed_path(key, row) if oncall_feed.may_see_feed(principal, row) else None
    return fast_json({**view, "ical_feed": feed})


@router.post("/oncall/schedules/{name}/feed/rotate", response_model=FeedOut)
def rotate_schedule_feed(name: NameInPath, request: Request, db: DB, principal: CurrentUser) -> Any:
    """A new calendar subscription URL for the schedule (admins); the old one is refused from now."""
    row = svc.schedule_by_name(db, name)
    oncall_feed.rotate_feed(db, principal, row)
    return {"ical_feed": oncall_feed.feed_path(paging.link_key(request.app.state.settings), row)}


@router.put(
    "/oncall/schedules/{name}",
    response_model=ScheduleOut,
    responses={201: {"model": ScheduleOut, "description": "created"}},
)
def put_schedule(name: NewName, body: ScheduleIn, db: DB, principal: CurrentUser) -> Any:
    """Create (201) or replace (200) a schedule (admins); its overrides are kept. The answer's
    `warnings` name every gap in the next 14 days."""
    view, created = svc.put_schedule(db, principal, name, body.model_dump(mode="json"))
    return fast_json(view, status_code=201 if created else 200)


@router.delete("/oncall/schedules/{name}", status_code=204)
def delete_schedule(name: NameInPath, db: DB, principal: CurrentUser) -> Response:
    svc.delete_schedule(db, principal, name)
    return Response(status_code=204)


@router.get(
    "/oncall/schedules/{name}/ical",
    response_class=Response,
    responses={
        200: {"content": {"text/calendar": {"schema": {"type": "string"}}}, "description": "iCalendar"}
    },
)
def schedule_ical(name: NameInPath, db: DB, _: CurrentUser) -> Response:
    """The schedule's shifts (a day back, four weeks ahead) as an iCalendar feed."""
    body = svc.ical_feed(db, name, time.time())
    return Response(body, media_type="text/calendar; charset=utf-8")


@router.get(
    "/oncall/feeds/{token}",
    response_class=Response,
    responses={
        200: {"content": {"text/calendar": {"schema": {"type": "string"}}}, "description": "iCalendar"},
        403: {
            "description": "the URL was altered, revoked (schedule deleted or feed rotated) or made "
            "with another server key"
        },
    },
)
def schedule_feed(token: FeedToken, request: Request, db: DB) -> Response:
    """A schedule's iCalendar feed without logging in, for calendar apps: the URL (from the
    schedule's `ical_feed`) carries its own signature, valid until the schedule is deleted or
    its feed rotated."""
    row = oncall_feed.schedule_of_feed(db, paging.link_key(request.app.state.settings), token)
    return Response(svc.ical_of(db, row, time.time()), media_type="text/calendar; charset=utf-8")


@router.post("/oncall/schedules/{name}/overrides", response_model=OverrideOut, status_code=201)
def add_override(name: NameInPath, body: OverrideIn, db: DB, principal: CurrentUser) -> Any:
    """Put `user` on call from `start` to `end` (admins; or a member taking the shift)."""
    view = svc.add_override(db, principal, name, body.user, body.start, body.end)
    return fast_json({k: view[k] for k in ("id", "user", "start", "end")}, status_code=201)


@router.delete("/oncall/schedules/{name}/overrides/{override_id}", status_code=204)
def remove_override(name: NameInPath, override_id: RowId, db: DB, principal: CurrentUser) -> Response:
    svc.remove_override(db, principal, name, override_id)
    return Response(status_code=204)


# --- escalation policies ------------------------------------------------------------------------


@router.get("/oncall/policies", response_model=list[PolicyOut])
def list_policies(db: DB, _: CurrentUser) -> Any:
    return fast_json(svc.list_policies(db))


@router.get("/oncall/policies/{name}", response_model=PolicyOut)
def get_policy(name: NameInPath, db: DB, _: CurrentUser) -> Any:
    return fast_json(svc.policy_view(db, svc.policy_by_name(db, name)))


@router.put(
    "/oncall/policies/{name}",
    response_model=PolicyOut,
    responses={201: {"model": PolicyOut, "description": "created"}},
)
def put_policy(name: NewName, body: PolicyIn, db: DB, principal: CurrentUser) -> Any:
    """Create (201) or replace (200) an escalation policy (admins). Pages under way keep the
    steps they started with."""
    view, created = svc.put_policy(db, principal, name, body.model_dump())
    return fast_json(view, status_code=201 if created else 200)


@router.delete("/oncall/policies/{name}", status_code=204)
def delete_policy(name: NameInPath, db: DB, principal: CurrentUser) -> Response:
    svc.delete_policy(db, principal, name)
    return Response(status_code=204)


# --- pages --------------------------------------------------------------------------------------


@router.get("/oncall/pages", response_model=list[PageOut])
def list_pages(
    db: DB,
    principal: CurrentUser,
    state: Literal["triggered", "acknowledged", "cancelled", "exhausted"] | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Any:
    """Newest first: every page for admins, the pages that notified you for others."""
    return fast_json(paging.list_pages(db, principal, state, limit))


@router.post(
    "/oncall/pages",
    response_model=PageOut,
    status_code=201,
    responses={200: {"model": PageOut, "description": "exists"}},
)
def open_page(body: PageIn, db: DB, principal: CurrentUser) -> Any:
    """Page through a policy by hand (admins), e.g. to test the set-up; 200 when `key` exists."""
    view, created = paging.open_page(
        db, principal, policy=body.policy, subject=body.subject, body=body.body, key=body.key, now=time.time()
    )
    return fast_json(view, status_code=201 if created else 200)


@router.get("/oncall/pages/{page_id}", response_model=PageOut)
def get_page(page_id: RowId, db: DB, principal: CurrentUser) -> Any:
    return fast_json(paging.get_page(db, principal, page_id))


@router.post("/oncall/pages/{page_id}/ack", response_model=PageOut)
def ack_page(page_id: RowId, db: DB, principal: CurrentUser) -> Any:
    """Acknowledge (admins and the people it notified): the escalation stops."""
    return fast_json(paging.ack_as(db, principal, page_id, time.time()))


@router.post("/oncall/pages/{page_id}/cancel", response_model=PageOut)
def cancel_page(page_id: RowId, db: DB, principal: CurrentUser) -> Any:
    return fast_json(paging.cancel_as(db, principal, page_id, time.time()))


# --- contact methods ----------------------------------------------------------------------------


@router.get("/users/{name}/contacts", response_model=ContactsOut)
def get_contacts(name: NameInPath, db: DB, principal: CurrentUser) -> Any:
    """Where pages reach a person (themselves and admins)."""
    return fast_json(svc.get_contacts(db, principal, name))


@router.put("/users/{name}/email", response_model=ContactsOut)
def set_email(name: NameInPath, body: EmailIn, db: DB, principal: CurrentUser) -> Any:
    return fast_json(svc.set_email(db, principal, name, body.email))


@router.post("/users/{name}/contacts", response_model=ContactsOut, status_code=201)
def add_contact(name: NameInPath, body: ContactIn, request: Request, db: DB, principal: CurrentUser) -> Any:
    """Add an email address, a webhook URL (generic JSON) or a Slack/Mattermost webhook URL. A
    webhook's host may not be a loopback, link-local or private address, unless the admin's
    CORRAL_WEBHOOK_ALLOW_NETWORKS holds it (422 saying so)."""
    allowed = webhook_guard.parse_networks(request.app.state.settings.webhook_allow_networks)
    view = svc.add_contact(db, principal, name, body.kind, body.address, allowed)
    return fast_json(view, status_code=201)


@router.delete("/users/{name}/contacts/{contact_id}", status_code=204)
def remove_contact(name: NameInPath, contact_id: RowId, db: DB, principal: CurrentUser) -> Response:
    svc.remove_contact(db, principal, name, contact_id)
    return Response(status_code=204)


# --- the acknowledge link (no login) -------------------------------------------------------------

LINK_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"description": "the link was altered or signed with another key, or its person is gone"},
    404: {"description": "the page no longer exists"},
    409: {"description": "the page was cancelled"},
    410: {"description": "the link expired"},
}
_PAGE_HTML = """<!doctype html><meta charset="utf-8"><title>Corral page</title>
<body style="font-family:sans-serif;max-width:40em;margin:2em auto">
<h1>{subject}</h1><p>Policy {policy}; state: <b>{state}</b>{acked}</p><pre>{body}</pre>{form}</body>"""


def _page_html(view: dict[str, Any], action: str | None) -> str:
    acked = f" by {html.escape(view['acked_by'])}" if view.get("acked_by") else ""
    form = ""
    if action:
        button = '<button type="submit">Acknowledge</button>'
        form = f'<form method="post" action="{html.escape(action)}">{button}</form>'
    fields = {k: html.escape(view[k]) for k in ("subject", "policy", "state", "body")}
    return _PAGE_HTML.format(**fields, acked=acked, form=form)


@router.get(
    "/ack/{token}",
    response_class=HTMLResponse,
    responses={200: {"content": {"text/html": {"schema": {"type": "string"}}}}, **LINK_ERRORS},
)
def ack_link_page(token: Token, request: Request, db: DB) -> HTMLResponse:
    """What the link shows: the page and an Acknowledge button (a POST). Opening the link does
    not acknowledge, since mail scanners and chat previews open links by themselves."""
    page, user = paging.page_for_link(db, paging.link_key(request.app.state.settings), token, time.time())
    view = paging.page_view(db, page, viewer_id=user.id, viewer_is_admin=False)  # a link is no admin login
    return HTMLResponse(_page_html(view, str(request.url.path) if page.state in paging.OPEN_STATES else None))


@router.post("/ack/{token}", response_model=PageOut, responses=LINK_ERRORS)
def ack_link(token: Token, request: Request, db: DB) -> Response:
    """Acknowledge as the person the link was sent to, without logging in. HTML for a browser's
    form post, JSON otherwise."""
    client = request.client.host if request.client else "unknown"
    key = paging.link_key(request.app.state.settings)
    view = paging.ack_with_link(db, key, token, time.time(), source=client)
    if "text/html" in request.headers.get("accept", ""):
        return HTMLResponse(_page_html(view, None))
    return JSONResponse(view)
