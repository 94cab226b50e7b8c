"""Keeps the OpenAPI schema true to what the API answers, for every route of the app, so that
schemathesis (tests/api/test_fuzz.py, bench/fuzz_api.py) finds nothing undocumented.

Installed once by the app factory; a new router gets all of this without doing anything:

- **Error responses**: every operation documents the errors the app can give it, each with the
  JSON body `ErrorOut` (`{"detail": "what was wrong"}`, or a list of `{loc, msg, type}` for bad
  fields). Which ones is derived from the route itself:
  * every operation: 400, 408, 413 (corral.api.limits reads every body before any route runs);
  * operations that authenticate (depend on `get_principal`): 401 and 403, and the bearer scheme
    in `security` (403: admins only, a cookie request without its CSRF token, someone else's);
  * operations with parameters or a body: 404 (a named job, user, group ... does not exist) and
    422 (a value the models or the services refuse);
  * authenticated POST/PUT/PATCH/DELETE: 409 (a name taken, a job in the wrong state);
  * operations a rate rule of corral.api.limits matches: 429 with `Retry-After`.
  A route documents anything else itself (`responses={503: ...}`); what it declares wins.
- **405**: a request whose method the path does not support is answered 405 with an `Allow`
  header listing every method of every route on that path (Starlette names only the first
  route's), also where the portal's catch-all GET route would otherwise answer 404. A path that
  routes serve literally (`/datasets/import`) belongs to them alone: a templated route that also
  matches it (`/datasets/{name}`) neither adds to its `Allow` nor answers it (`LiteralPaths`).
  An `/api/` path no route serves is 404, not the catch-all's 405.
- **Path segments**: an `/api/` path segment with an encoded '/' or a dot segment is a 422 naming
  it (`PathSegments`), not another route's answer.
- **Links** (`LINKS`): which operation's response feeds which operation's parameters, so that a
  stateful fuzzer chains them (POST /jobs → GET /jobs/{job_id} ...). Routers add their own
  with `links=` in `responses` or by extending `LINKS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import unquote

from fastapi import FastAPI, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from corral.api import limits
from corral.api.deps import get_principal
from corral.config import Settings


class ErrorItem(BaseModel):
    loc: list[str | int] = Field(description="where: ['body', 'name'], ['query', 'limit'] ...")
    msg: str = Field(description="what is wrong with it")
    type: str


class ErrorOut(BaseModel):
    """Every 4xx (and 503) answer of the API."""

    detail: str | list[ErrorItem] = Field(description="what was wrong: a sentence, or one item per field")


ERROR_DESCRIPTIONS: dict[int, str] = {
    400: "the body is malformed, nested too deeply or holds too many values",
    401: "not authenticated, or the token or session is unknown, expired or revoked",
    403: "authenticated, but not allowed to do this (or a cookie request without its CSRF token)",
    404: "a job, user, group or other object the request names does not exist (or is not yours)",
    408: "the request body was not received in time",
    409: "conflicts with the current state: a name already taken, a job that has not ended ...",
    413: "the request body is larger than the configured limit",
    422: "a parameter or body field is invalid; `detail` names each",
    429: "too many requests (rate limit or login lockout); retry after `Retry-After` seconds",
    503: "a component the request needs is not available right now",
}
API_PATHS = "/api/"  # the REST API's (corral.api.app.API_PREFIX, /api/v1) and any later version's
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
SECURITY_SCHEME = "bearer"

# (source operation, status) → {link name: link}. Parameters come from the source's response
# body (`$response.body#/id`) or from its own path (`$request.path.name`).
Link = dict[str, Any]
LINKS: dict[tuple[str, str, str], dict[str, Link]] = {}


def _link(operation: str, parameters: dict[str, str], body: Any = None) -> Link:
    method, path = operation.split(" ", 1)
    link: Link = {"operationRef": _operation_ref(path, method), "parameters": parameters}
    if body is not None:
        link["requestBody"] = body
    return link


def _operation_ref(path: str, method: str) -> str:
    return "#/paths/" + path.replace("~", "~0").replace("/", "~1") + "/" + method.lower()


LinkTarget = tuple[str, dict[str, str]] | tuple[str, dict[str, str], Any]


def add_links(source: str, status: str, targets: Mapping[str, LinkTarget]) -> None:
    """Declare that `source`'s `status` answer feeds each target operation's parameters (and, as a
    third item, fields of its body): `targets` = {link name: ("GET /api/v1/jobs/{job_id}",
    {"job_id": "$response.body#/id"})}."""
    method, path = source.split(" ", 1)
    entry = LINKS.setdefault((method.lower(), path, status), {})
    for name, (operation, parameters, *body) in targets.items():
        entry[name] = _link(operation, parameters, *body)


API = "/api/v1"


def _job_links() -> None:
    job = {"job_id": "$response.body#/id"}
    add_links(
        f"POST {API}/jobs",
        "201",
        {
            "GetJob": (f"GET {API}/jobs/{{job_id}}", job),
            "GetJobEvents": (f"GET {API}/jobs/{{job_id}}/events", job),
            "GetJobLogs": (f"GET {API}/jobs/{{job_id}}/logs", job),
            "CancelJob": (f"POST {API}/jobs/{{job_id}}/cancel", job),
            "HoldJob": (f"POST {API}/jobs/{{job_id}}/hold", job),
            "ReleaseJob": (f"POST {API}/jobs/{{job_id}}/release", job),
            "DeleteJob": (f"DELETE {API}/jobs/{{job_id}}", job),
        },
    )
    add_links(
        f"POST {API}/jobs/{{job_id}}/cancel",
        "200",
        {"DeleteCancelledJob": (f"DELETE {API}/jobs/{{job_id}}", job)},
    )
    # A hold's answer is {changed, message, job}: the job's id is under `job`.
    held = {"job_id": "$response.body#/job/id"}
    add_links(
        f"POST {API}/jobs/{{job_id}}/hold",
        "200",
        {
            "ReleaseHeldJob": (f"POST {API}/jobs/{{job_id}}/release", held),
            "CancelHeldJob": (f"POST {API}/jobs/{{job_id}}/cancel", held),
        },
    )
    add_links(
        f"POST {API}/jobs/{{job_id}}/release",
        "200",
        {"HoldReleasedJob": (f"POST {API}/jobs/{{job_id}}/hold", held)},
    )


def _account_links() -> None:
    """Users, groups, tokens, SSH keys, sessions and lockouts."""
    user = {"name": "$response.body#/name"}
    add_links(
        f"POST {API}/users",
        "201",
        {
            "SetUserDefaultGroup": (f"PUT {API}/users/{{name}}/default-group", user),
            "SetUserPassword": (f"PUT {API}/users/{{name}}/password", user),
        },
    )
    group = {"name": "$response.body#/name"}
    add_links(
        f"POST {API}/groups",
        "201",
        {
            "GetGroup": (f"GET {API}/groups/{{name}}", group),
            "SetGroupQuota": (f"PUT {API}/groups/{{name}}/quota", group),
            "AddGroupMember": (f"POST {API}/groups/{{name}}/members", group),
        },
    )
    # A quota row the answer lists (the group's first), removed again; a group without one
    # leaves the link's gpu_model to the fuzzer (mostly a 404 naming the model).
    first_quota = {"gpu_model": "$response.body#/quotas/0/gpu_model"}
    for source, status, group_param in (
        (f"POST {API}/groups", "201", group),
        (f"PUT {API}/groups/{{name}}/quota", "200", {"name": "$request.path.name"}),
    ):
        add_links(
            source,
            status,
            {"RemoveGroupQuota": (f"DELETE {API}/groups/{{name}}/quota", {**group_param, **first_quota})},
        )
    for answer in ("201", "200"):  # added, or already a member
        add_links(
            f"POST {API}/groups/{{name}}/members",
            answer,
            {"GetGroupOfMember": (f"GET {API}/groups/{{name}}", {"name": "$request.path.name"})},
        )
    add_links(
        f"POST {API}/tokens",
        "201",
        {"RevokeToken": (f"DELETE {API}/tokens/{{token_id}}", {"token_id": "$response.body#/id"})},
    )
    add_links(
        f"POST {API}/ssh-keys",
        "201",
        {"DeleteSshKey": (f"DELETE {API}/ssh-keys/{{key_id}}", {"key_id": "$response.body#/id"})},
    )
    add_links(
        f"GET {API}/sessions",
        "200",
        {"RevokeSession": (f"DELETE {API}/sessions/{{session_id}}", {"session_id": "$response.body#/0/id"})},
    )
    first_id = {"lockout_id": "$response.body#/0/id"}
    add_links(
        f"GET {API}/auth/lockouts",
        "200",
        {"ClearLockout": (f"DELETE {API}/auth/lockouts/{{lockout_id}}", first_id)},
    )


def _listing_links() -> None:
    """From a list to one of the objects listed."""
    add_links(
        f"GET {API}/jobs",
        "200",
        {"GetListedJob": (f"GET {API}/jobs/{{job_id}}", {"job_id": "$response.body#/items/0/id"})},
    )
    add_links(
        f"GET {API}/groups",
        "200",
        {"GetListedGroup": (f"GET {API}/groups/{{name}}", {"name": "$response.body#/0/name"})},
    )
    add_links(
        f"GET {API}/ssh-keys",
        "200",
        {"DeleteListedSshKey": (f"DELETE {API}/ssh-keys/{{key_id}}", {"key_id": "$response.body#/0/id"})},
    )
    add_links(
        f"GET {API}/nodes",
        "200",
        {"ActOnListedNode": (f"POST {API}/nodes/{{name}}/{{action}}", {"name": "$response.body#/0/name"})},
    )


def _catalogue_links() -> None:
    """Workspaces, environments and templates."""
    named = {"name": "$response.body#/name"}
    add_links(
        f"POST {API}/workspaces",
        "201",
        {
            "GetWorkspace": (f"GET {API}/workspaces/{{name}}", named),
            "StopWorkspace": (f"POST {API}/workspaces/{{name}}/stop", named),
            "DeleteWorkspace": (f"DELETE {API}/workspaces/{{name}}", named),
        },
    )
    add_links(
        f"POST {API}/workspaces/{{name}}/stop",
        "200",
        {"StartWorkspace": (f"POST {API}/workspaces/{{name}}/start", named)},
    )
    add_links(
        f"POST {API}/environments",
        "201",
        {
            "GetEnvironment": (f"GET {API}/environments/{{name}}", named),
            "GetEnvironmentVersion": (
                f"GET {API}/environments/{{name}}/versions/{{version}}",
                {**named, "version": "$response.body#/version"},
            ),
            "DeleteEnvironment": (f"DELETE {API}/environments/{{name}}", named),
        },
    )
    add_links(
        f"POST {API}/templates",
        "201",
        {
            "GetTemplate": (f"GET {API}/templates/{{name}}", named),
            # the version just published: another number is a 404 on a template that exists
            "UseTemplate": (
                f"POST {API}/templates/{{name}}/use",
                named,
                {"version": "$response.body#/version"},
            ),
            "DeleteTemplate": (f"DELETE {API}/templates/{{name}}", named),
        },
    )


def _put_named_links() -> None:
    """Secrets, on-call schedules and escalation policies."""
    in_path = {"name": "$request.path.name"}
    listed = {"name": "$response.body#/0/name"}
    # Secrets, schedules and policies are made by PUT to their name: 201 when new, 200 when
    # replaced, and the links hold after either. A listed one can be replaced, and a deleted one
    # set again under its name (how a stateful fuzzer, which starts only from POSTs and lists,
    # reaches the PUTs).
    for kind, path, after_put in (
        ("Secret", f"{API}/secrets/{{name}}", {"DeleteSecret": ("DELETE", "")}),
        (
            "Schedule",
            f"{API}/oncall/schedules/{{name}}",
            {
                "GetSchedule": ("GET", ""),
                "AddScheduleOverride": ("POST", "/overrides"),
                "DeleteSchedule": ("DELETE", ""),
            },
        ),
        (
            "Policy",
            f"{API}/oncall/policies/{{name}}",
            {"GetPolicy": ("GET", ""), "DeletePolicy": ("DELETE", "")},
        ),
    ):
        targets = {name: (f"{method} {path}{tail}", in_path) for name, (method, tail) in after_put.items()}
        add_links(f"PUT {path}", "201", targets)
        add_links(f"PUT {path}", "200", {f"{name}AfterReplace": target for name, target in targets.items()})
        add_links(
            f"GET {path.removesuffix('/{name}')}", "200", {f"ReplaceListed{kind}": (f"PUT {path}", listed)}
        )
        add_links(f"DELETE {path}", "204", {f"Restore{kind}": (f"PUT {path}", in_path)})


def _oncall_links() -> None:
    """Overrides and pages."""
    in_path = {"name": "$request.path.name"}
    add_links(
        f"POST {API}/oncall/schedules/{{name}}/overrides",
        "201",
        {
            "DeleteScheduleOverride": (
                f"DELETE {API}/oncall/schedules/{{name}}/overrides/{{override_id}}",
                {**in_path, "override_id": "$response.body#/id"},
            )
        },
    )
    page = {"page_id": "$response.body#/id"}
    add_links(
        f"POST {API}/oncall/pages",
        "201",
        {
            "GetPage": (f"GET {API}/oncall/pages/{{page_id}}", page),
            "AckPage": (f"POST {API}/oncall/pages/{{page_id}}/ack", page),
            "CancelPage": (f"POST {API}/oncall/pages/{{page_id}}/cancel", page),
        },
    )


_job_links()
_account_links()
_listing_links()
_catalogue_links()
_put_named_links()
_oncall_links()


# --- error responses ----------------------------------------------------------------------------


def _calls(dependant: Any) -> Iterable[Callable[..., Any]]:
    for dep in dependant.dependencies:
        if dep.call is not None:
            yield dep.call
        yield from _calls(dep)


def authenticates(route: RouteContext) -> bool:
    return get_principal in set(_calls(route.dependant))


def _takes_input(route: RouteContext) -> bool:
    d = route.dependant
    return bool(d.path_params or d.query_params or d.body_params) or "requestBody" in (
        route.openapi_extra or {}
    )


def _rate_limited(route: RouteContext, method: str, rules: list[limits.RateRule]) -> bool:
    """Would a rate rule match a request to this route (path parameters filled in, a large
    `limit` asked for where the route takes one)?"""
    path = route.path_format or ""
    for param in route.dependant.path_params:
        path = path.replace("{" + param.name + "}", "1")
    query = (
        {"limit": [str(limits.BIG_LIST_LIMIT + 1)]}
        if any(p.alias == "limit" for p in route.dependant.query_params)
        else {}
    )
    return any(rule.matches(method, path, query) for rule in rules)


def error_statuses(route: RouteContext, method: str, rules: list[limits.RateRule]) -> list[int]:
    """The error statuses the app can answer `method` on `route` with (see the module's doc)."""
    statuses = {400, 408, 413}
    if authenticates(route):
        statuses |= {401, 403}
        if method in UNSAFE_METHODS:
            statuses.add(409)
    if _takes_input(route):
        statuses |= {404, 422}
    if _rate_limited(route, method, rules):
        statuses.add(429)
    return sorted(statuses)


def _error_response(status: int, description: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "description": description or ERROR_DESCRIPTIONS.get(status, "error"),
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorOut"}}},
    }
    if status == 429:
        out["headers"] = {
            "Retry-After": {
                "description": "seconds to wait",
                "schema": {"type": "string", "pattern": "^[0-9]+$"},
            }
        }
    return out


def _document_operation(
    op: dict[str, Any], route: RouteContext, method: str, rules: list[limits.RateRule]
) -> None:
    responses: dict[str, Any] = op.setdefault("responses", {})
    for status in error_statuses(route, method, rules):
        declared = responses.get(str(status))
        if status == 422 or declared is None:  # FastAPI's 422 model is not what the app answers
            responses[str(status)] = _error_response(status, (declared or {}).get("description"))
    for code, response in responses.items():
        if code.startswith(("4", "5")) and "content" not in response:
            response["content"] = _error_response(int(code))["content"]
    if authenticates(route):
        op.setdefault("security", [{SECURITY_SCHEME: []}])
    for code, response in responses.items():
        links = LINKS.get((method.lower(), route.path_format or "", code))
        if links:
            response.setdefault("links", {}).update(links)


def build_openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    schema = get_openapi(
        title=app.title,
        version=app.version,
        description=app.description,
        routes=app.routes,
    )
    rules = limits.rate_rules(settings)
    routes = {
        (route.path_format, method.lower()): route
        for route in iter_route_contexts(app.routes)
        if isinstance(route.original_route, APIRoute) and route.include_in_schema
        for method in route.methods or ()
    }
    for path, operations in schema.get("paths", {}).items():
        for method, op in operations.items():
            route = routes.get((path, method))
            if route is not None:
                _document_operation(op, route, method.upper(), rules)
    components = schema.setdefault("components", {})
    schemas = components.setdefault("schemas", {})
    _hoist_body_definitions(schema, schemas)
    for name in ("HTTPValidationError", "ValidationError"):  # replaced by ErrorOut everywhere
        schemas.pop(name, None)
    error_schema = ErrorOut.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas.update(error_schema.pop("$defs", {}))
    schemas["ErrorOut"] = error_schema
    components.setdefault("securitySchemes", {})[SECURITY_SCHEME] = {
        "type": "http",
        "scheme": "bearer",
        "description": "an API token (`corral token create`); the portal uses its session cookie",
    }
    return schema


def _hoist_body_definitions(schema: dict[str, Any], schemas: dict[str, Any]) -> None:
    """A body schema given whole in `openapi_extra` (a model's `model_json_schema(ref_template=
    "#/components/schemas/{model}")`) keeps its sub-models in `$defs`: move them to components."""
    for operations in schema.get("paths", {}).values():
        for op in operations.values():
            for media in op.get("requestBody", {}).get("content", {}).values():
                body = media.get("schema", {})
                if "$defs" in body:  # copied, not popped: the route's own dict is shared by apps
                    schemas.update(body["$defs"])
                    media["schema"] = {k: v for k, v in body.items() if k != "$defs"}


# --- 405 ----------------------------------------------------------------------------------------


def allowed_methods(app: Any, path: str) -> set[str]:
    """Every method some route serves on `path`. Catch-all routes (`{x:path}`: the portal's
    unknown-page route, static assets) do not count: they match any path. A path that routes
    serve literally (`/datasets/import`) is theirs alone: a templated route that would also
    match it (`/datasets/{name}`) does not add its methods (see `LiteralPaths`)."""
    literal = literal_paths(app).get(path)
    if literal is not None:
        return set(literal)
    methods: set[str] = set()
    for route in iter_route_contexts(app.router.routes):
        template, route_methods = route.path, route.methods
        if not route_methods or not template or ":path}" in template:
            continue
        regex, _format, _convertors = compile_path(template)
        if regex.match(path):
            methods |= set(route_methods)
    return methods


def literal_paths(app: Any) -> dict[str, frozenset[str]]:
    """{path: methods} of the routes without parameters (computed once per app, and once per
    process for apps whose routes come from the same routers: see `_routes_key`)."""
    cached: dict[str, frozenset[str]] | None = getattr(app.state, "literal_paths", None)
    if cached is None:
        key = _routes_key(app.router.routes)
        shared = _LITERAL_PATHS_BY_ROUTES.get(key) if key is not None else None
        if shared is None:
            found: dict[str, set[str]] = {}
            for route in iter_route_contexts(app.router.routes):
                if route.methods and route.path and "{" not in route.path:
                    found.setdefault(route.path, set()).update(route.methods)
            cached = {path: frozenset(methods) for path, methods in found.items()}
            if key is not None:
                if len(_LITERAL_PATHS_BY_ROUTES) >= _LITERAL_PATHS_KEPT:  # the oldest goes
                    del _LITERAL_PATHS_BY_ROUTES[next(iter(_LITERAL_PATHS_BY_ROUTES))]
                _LITERAL_PATHS_BY_ROUTES[key] = (cached, _routers_of(app.router.routes))
        else:
            cached = shared[0]
        app.state.literal_paths = cached
    return cached


# Walking every route's effective context costs ~0.1-0.25 s of CPU per app, and every app built
# by create_app includes the same module-level routers (a test run builds ~1,000 apps). Keyed by
# what decides the literal paths; the routers are kept alive with the entry so that their ids
# cannot be reused by other objects.
_LITERAL_PATHS_KEPT = 16  # route sets per process: one in a server, a few in a test run
_LITERAL_PATHS_BY_ROUTES: dict[tuple[Any, ...], tuple[dict[str, frozenset[str]], list[Any]]] = {}


def _routes_key(routes: Sequence[Any]) -> tuple[Any, ...] | None:
    """What a list of top-level routes' literal paths depend on: an included router's identity,
    prefix, route count and FastAPI's count of its changes (nested routers' included; FastAPI 0.163
    includes routers lazily, as `_IncludedRouter`), a plain
    route's class, path and methods. None (no sharing) for any route of another shape."""
    parts: list[Any] = []
    for route in routes:
        original = getattr(route, "original_router", None)
        context = getattr(route, "include_context", None)
        if original is not None and context is not None:
            # FastAPI counts a router's changes, nested routers' included (private: 0 without it)
            version = getattr(original, "_get_routes_version", lambda: 0)()
            parts.append(("router", id(original), context.prefix, len(original.routes), version))
        elif isinstance(getattr(route, "path", None), str):
            methods = getattr(route, "methods", None)
            parts.append((type(route).__qualname__, route.path, frozenset(methods or ())))
        else:
            return None
    return tuple(parts)


def _routers_of(routes: Sequence[Any]) -> list[Any]:
    return [route.original_router for route in routes if hasattr(route, "original_router")]


class LiteralPaths:
    """ASGI middleware: a request for a literal route's path with a method no literal route
    there serves is answered 405, instead of being handed to a templated route that also matches
    (`GET /datasets/import` is not the dataset named "import": that name is reserved). So the
    answer agrees with the schema, which lists only the literal routes' methods on that path."""

    def __init__(self, app: ASGIApp, owner: FastAPI) -> None:
        self.app, self.owner = app, owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            allowed = literal_paths(self.owner).get(scope["path"])
            if allowed is not None and scope["method"] not in allowed:
                response = method_not_allowed(scope["method"], scope["path"], set(allowed))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def method_not_allowed(method: str, path: str, allowed: set[str]) -> JSONResponse:
    allow = ", ".join(sorted(allowed))
    return JSONResponse(
        {"detail": f"{method} is not allowed on {path}; allowed: {allow}"},
        status_code=405,
        headers={"Allow": allow},
    )


def bad_segment(raw_path: str) -> tuple[str, str, str] | None:
    """(segment as sent, as decoded, the segment before it) of the first segment of a raw
    (percent-encoded) path that no name can be: one holding an encoded '/', or '.' or '..'."""
    parts = raw_path.split("/")
    for before, part in zip(["", *parts], parts, strict=False):
        decoded = unquote(part)
        if decoded in (".", "..") or "/" in decoded:
            return part, decoded, before
    return None


def path_routes(app: Any) -> list[Any]:
    """The compiled patterns of the routes with a `{x:path}` parameter (computed once per app)."""
    cached: list[Any] | None = getattr(app.state, "path_routes", None)
    if cached is None:
        cached = [
            compile_path(route.path)[0]
            for route in iter_route_contexts(app.router.routes)
            if route.path and ":path}" in route.path and route.path.startswith(API_PATHS)
        ]
        app.state.path_routes = cached
    return cached


class PathSegments:
    """ASGI middleware: an API path with a segment no name can be, an encoded '/' (`%2F`) or a
    dot segment, is a 422 naming it. Starlette routes the decoded path, so the model name "../x"
    (sent by the SDK as `..%2Fx`) became extra segments: `DELETE /models/..%2Fx` matched no API
    route and the portal's catch-all GET route answered a bare 405, and `a%2Fversions%2F1` would
    have reached the route of another object. A route whose last parameter is a path (a
    dataset's file) takes such a path as given; its service checks it."""

    def __init__(self, app: ASGIApp, owner: FastAPI) -> None:
        self.app, self.owner = app, owner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].startswith(API_PATHS):
            raw = scope.get("raw_path") or scope["path"].encode()
            # Only an encoded character ('%2F') or a dot segment can be refused: most paths skip it.
            found = bad_segment(raw.decode("latin-1")) if b"%" in raw or b"/." in raw else None
            if found is not None and not any(r.match(scope["path"]) for r in path_routes(self.owner)):
                part, decoded, before = found
                where = f" after '{before}/'" if before else ""
                msg = (
                    f"the path segment {part!r}{where} is {decoded!r} once decoded: a name may not "
                    "contain '/' nor be '.' or '..'"
                )
                detail = [{"loc": ["path"], "msg": msg, "type": "value_error"}]
                await JSONResponse({"detail": detail}, status_code=422)(scope, receive, send)
                return
        await self.app(scope, receive, send)


def install(app: FastAPI, settings: Settings) -> None:
    """Document every route's errors and links, and answer wrong methods with 405 + Allow."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(LiteralPaths, owner=app)
    app.add_middleware(PathSegments, owner=app)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code in (404, 405):
            allowed = allowed_methods(request.app, request.url.path)
            if allowed and request.method not in allowed:
                return method_not_allowed(request.method, request.url.path, allowed)
            if not allowed and request.url.path.startswith(API_PATHS) and exc.status_code == 405:
                # No API route serves this path: the 405 ("Allow: GET") was the portal's.
                return JSONResponse({"detail": f"no API route serves {request.url.path}"}, status_code=404)
        return await http_exception_handler(request, exc)
