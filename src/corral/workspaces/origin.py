"""Workspaces on their own origin (docs/security.md, "Workspaces on their own origin").

What JupyterLab answers is written by code running as the workspace's owner; served on the
portal's origin, its script could call the whole API with the owner's session cookie. So the
server listens a second time (CORRAL_WORKSPACE_PORT; a reverse proxy or a wildcard host may stand
in front of it, CORRAL_WORKSPACE_ORIGIN) and that listener serves the workspace proxy and nothing
else: no `/api/v1`, no portal, and not the portal's session cookie. The portal's `/ws/<id>/...`
decides as the proxy always did (owner only; 404 for others) and, for the owner, hands the
browser over: the workspace listener's HANDOFF_BEGIN_PATH puts a state secret in the browser's
cookie there and sends it back to the portal's TICKET_PATH, which issues a one-time ticket
(corral.services.workspace_passes) bound to that state's hash, which the workspace listener's
HANDOFF_PATH exchanges, in the browser holding the state only, for a cookie of its own
(HttpOnly, SameSite; over https `__Host-corral_ws_<id>`, Secure, path `/`, which only a secure
answer of this very host can set; over plain http WORKSPACE_COOKIE, path `/ws/<id>/`), then
sends the browser on to the lab. (Bound to the browser, as OAuth's `state`: all users' workspaces share
this origin, so a ticket of one user's opened in another's browser would run the first one's
JupyterLab next to the other's workspace cookies.) A bearer token works
on the workspace listener directly; on the portal it is redirected there (307).

Which listener a request came in on is told by its server port (the ASGI scope's `server`):
one uvicorn serves both sockets with one app. With CORRAL_WORKSPACE_PORT=0 nothing changes
(SHARED: JupyterLab on the portal's origin, as before).
"""

from __future__ import annotations

import html
import os
import secrets
import time
from enum import Enum
from typing import Any
from urllib.parse import quote, urlsplit

from fastapi import Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from corral.api.deps import portal_https, same_origin
from corral.config import PUBLIC_URL_ENV, Settings, url_host
from corral.services import workspace_passes
from corral.services.auth import sha256_hex
from corral.services.errors import Unauthenticated
from corral.services.workspace_passes import BadTarget, TicketRefused, handoff_target

WORKSPACE_COOKIE = "corral_workspace"  # the workspace origin's own over http; the portal never reads it
# Over https the workspace origin's cookies are `__Host-` ones (Secure, Path=/, no Domain): a
# plain-http answer for the host (on the network path), a sibling host (Domain=) or another port
# cannot set them, so nobody can plant a state or workspace cookie of theirs in a victim's browser.
HOST_PREFIX = "__Host-"
SECURE_WORKSPACE_COOKIE_PREFIX = HOST_PREFIX + "corral_ws_"  # + the workspace's id
HANDOFF_PATH = "/corral-handoff"  # on the workspace listener: ?ticket=... -> cookie -> the lab
HANDOFF_BEGIN_PATH = "/corral-handoff/begin"  # on the workspace listener: ?to=... -> state cookie
TICKET_PATH = "/corral-handoff/ticket"  # on the portal: ?to=...&state=<hash> -> a ticket
STATE_COOKIE_PREFIX = "corral_handoff_"  # the state cookies over http, path HANDOFF_PATH (https: __Host-)
STATE_COOKIES_KEPT = 4  # a browser's handoffs in flight at once: older state cookies are expired
STATE_TTL_S = 60.0  # the round trip to the portal and back, with room for a slow machine
NO_FRAMES = {"X-Frame-Options": "DENY", "Content-Security-Policy": "frame-ancestors 'none'"}
PORTAL_WORKSPACES = "/workspaces"  # the portal's page of the user's workspaces
ERROR_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Workspace: {status}</title></head>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>Workspace unavailable ({status})</h1>
<p>{message}</p>
<p><a href="{portal}">Your workspaces</a></p>
</body></html>
"""
ERROR_PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'",
}


class Listener(Enum):
    SHARED = "shared"  # no workspace listener: the portal's origin serves JupyterLab (old way)
    PORTAL = "portal"  # the portal and the API; `/ws/` only hands over to the workspace origin
    WORKSPACE = "workspace"  # the workspace proxy only


def settings_of(app: Any) -> Settings | None:
    """The app's settings; None for an app without them (a test's bare proxy router)."""
    return getattr(getattr(app, "state", None), "settings", None)


def listener(app: Any, scope: Any) -> Listener:
    """The listener `scope` came in on. An app without settings (a test's bare proxy router)
    serves as SHARED, as before."""
    settings = settings_of(app)
    port = settings.workspace_listen_port if settings is not None else 0
    if port == 0:
        return Listener.SHARED
    server = scope.get("server") or (None, None)
    return Listener.WORKSPACE if server[1] == port else Listener.PORTAL


def _host_and_scheme(request: Any) -> tuple[str, str]:
    url = request.url
    scheme = "https" if url.scheme in ("https", "wss") else "http"
    return url_host(url.hostname or "localhost"), scheme


def workspace_origin(request: Any, settings: Settings) -> str:
    """Where browsers reach the workspace listener: CORRAL_WORKSPACE_ORIGIN, else the host name
    this request was sent to, on the workspace port, in the same scheme."""
    if settings.workspace_origin is not None:
        return settings.workspace_origin
    host, scheme = _host_and_scheme(request)
    return f"{scheme}://{host}:{settings.workspace_listen_port}"


# review126 #1: without CORRAL_WORKSPACE_ORIGIN the listener is the portal's own host name on another
# port; over https (Corral's own TLS, a TLS proxy trusted for X-Forwarded-Proto, which the start-up
# check cannot see, or CORRAL_PUBLIC_URL https) a workspace's script there could set the portal's
# `__Host-corral_session` (browsers keep cookies apart by host, not port): no handoff, whatever the
# start-up check let through. A TLS proxy not trusted for X-Forwarded-Proto is caught by the header
# alone (_says_https). A bearer-token client carries no cookie: it is sent on (review127 #4).
NO_OWN_HOST_NAME = (
    "workspaces cannot be opened here: the portal is served over https and the workspace listener "
    "has no host name of its own, so a workspace's script could set the portal's session cookie; "
    "the administrator must set CORRAL_WORKSPACE_ORIGIN to a host name of its own, e.g. "
    "https://ws.example.org (docs/security.md, 'Workspaces on their own origin')"
)
NO_HTTPS_FOR_TOKENS = (
    "this request came over https but the workspace listener's address is plain http ({origin}): "
    "a token client is not sent there; the administrator must set CORRAL_WORKSPACE_ORIGIN to an "
    "https host name of its own (and trust the TLS proxy with CORRAL_FORWARDED_ALLOW_IPS)"
)


def derived_over_https(request: Any, settings: Settings) -> Response | None:
    """A 503 saying NO_OWN_HOST_NAME when the workspace origin would be derived from this https
    request (the portal's host name), else None: checked by every step of a handoff."""
    if settings.workspace_origin is not None:
        return None
    if not _came_over_https(request, settings):
        return None  # plain http: the demo and tests on loopback, or a warned-of test cluster
    return refused(request, 503, NO_OWN_HOST_NAME)


def _came_over_https(request: Request, settings: Settings) -> bool:
    return settings.ssl_certfile is not None or portal_https(request.scope) or _says_https(request.headers)


def _says_https(headers: Any) -> bool:
    """Whether a proxy's `X-Forwarded-Proto` or `Forwarded` says the browser came over https, even
    one not trusted for it (CORRAL_FORWARDED_ALLOW_IPS unset: the request looks plain, review127
    #5): only ever stricter (a client sending it itself gets the 503, no handoff it could misuse),
    while a TLS proxy so left untrusted would otherwise send the browser to plain http on the
    portal's host name, where a workspace's script could set the plain `corral_session`."""
    # every line of each header (a proxy chain may add a line instead of joining with commas)
    forwarded_proto = ",".join(headers.getlist("x-forwarded-proto"))
    if any(proto.strip().lower() == "https" for proto in forwarded_proto.split(",")):
        return True
    for element in ",".join(headers.getlist("forwarded")).split(","):
        for pair in element.split(";"):
            name, _, value = pair.partition("=")
            if name.strip().lower() == "proto" and value.strip().strip('"').lower() == "https":
                return True
    return False


def portal_url(request: Any, settings: Settings) -> str:
    """Where browsers reach the portal, seen from the workspace listener: CORRAL_PUBLIC_URL when
    the workspace origin is another host (CORRAL_WORKSPACE_ORIGIN), else this request's host name
    on the portal's port."""
    public = os.environ.get(PUBLIC_URL_ENV, "").rstrip("/")
    if settings.workspace_origin is not None and public:
        return public
    host, scheme = _host_and_scheme(request)
    return f"{scheme}://{host}:{settings.port}"


def allowed_origin(headers: Any, settings: Settings | None, where: Listener) -> bool:
    """A browser's `Origin` for a WebSocket or a cookie's state change: on the workspace listener
    the workspace origin (as configured, else the request's own host); elsewhere the portal's
    own host, as before."""
    origin = headers.get("origin")
    if origin is None:
        return False
    if where is Listener.WORKSPACE and settings is not None and settings.workspace_origin is not None:
        return origin.rstrip("/").lower() == settings.workspace_origin
    return same_origin(headers)


def request_target(scope: Any) -> str:
    """The path and query as the browser sent them (raw, still escaped)."""
    raw = scope.get("raw_path") or quote(scope["path"]).encode()
    query = scope.get("query_string", b"")
    return (raw + b"?" + query if query else raw).decode("latin-1")


def _workspace_target(scope: Any, ws_id: int) -> str:
    """The request's path and query, as sent, under `/ws/<ws_id>/`; the decoded path escaped
    again where the raw one spelled the id otherwise (`/ws/%31/`)."""
    target = request_target(scope)
    if target.startswith(f"/ws/{ws_id}/"):
        return target
    query = scope.get("query_string", b"").decode("latin-1")
    return quote(scope["path"]) + (f"?{query}" if query else "")


def _no_frames_no_cache(answer: Response) -> Response:
    """A handoff's answer: not cached, no referrer (a ticket is in a URL), never in a frame (a
    framed handoff would end on the workspace origin inside another page)."""
    answer.headers["Cache-Control"] = "no-store"
    answer.headers["Referrer-Policy"] = "no-referrer"
    answer.headers.update(NO_FRAMES)
    return answer


def _not_a_navigation(request: Request, ws_id: int, origin: str) -> Response | None:
    """A refusal unless `request` is a browser's top-level navigation by GET: a script's request
    (an old JupyterLab tab of the portal's origin polling its API) could not follow the handoff
    anyway, and a frame or an embed is no place to land on the workspace origin."""
    headers = request.headers
    navigates = headers.get("sec-fetch-mode", "navigate") == "navigate"
    if request.method == "GET" and navigates and headers.get("sec-fetch-dest", "document") == "document":
        return None
    return refused(request, 403, f"workspace {ws_id} is served at {origin}/ws/{ws_id}/, not on the portal")


def refused(request: Request, status: int, message: str) -> Response:
    """`message` as JSON (`{"detail": ...}`, as the API answers), or to a browser (text/html in
    Accept: a page opened from the portal, or a bookmark) as a small page saying the same, with
    a link to the portal's workspaces (on the workspace listener: at the portal's address)."""
    if "text/html" not in request.headers.get("accept", ""):
        return JSONResponse({"detail": message}, status_code=status)
    portal = PORTAL_WORKSPACES
    settings = settings_of(request.app)
    if settings is not None and listener(request.app, request.scope) is Listener.WORKSPACE:
        portal = portal_url(request, settings) + PORTAL_WORKSPACES
    page = ERROR_PAGE.format(status=status, message=html.escape(message), portal=html.escape(portal))
    return HTMLResponse(page, status_code=status, headers=ERROR_PAGE_HEADERS)


def bad_target(request: Request, step: str, problem: BadTarget) -> Response:
    """The 400 of a handoff's step (`step`: what it takes) whose destination handoff_target
    refused: every step reads it with that one function, so none sends the browser elsewhere."""
    return refused(request, 400, f"{step}: {problem}")


async def hand_over(request: Request, ws_id: int, session_secret: str | None) -> Response:
    """The portal's answer to `/ws/<id>/...` that the owner may open: to the workspace origin.
    A browser (the portal's session cookie) goes there by the handoff (HANDOFF_BEGIN_PATH, which
    sends it back to the portal's TICKET_PATH for a ticket bound to it); a bearer-token client is
    sent to the same path there (307: its method and body kept)."""
    settings = settings_of(request.app)
    assert settings is not None
    target = _workspace_target(request.scope, ws_id)
    origin = workspace_origin(request, settings)
    if session_secret is None:  # a bearer token: no cookie a workspace's script could set or read
        if origin.startswith("http://") and _came_over_https(request, settings):
            # not from https down to plain http: the path, query and body would cross in clear
            # (review128 #1: a TLS proxy left untrusted makes the derived origin http)
            return refused(request, 503, NO_HTTPS_FOR_TOKENS.format(origin=origin))
        return RedirectResponse(origin + target, status_code=307)
    over_https = derived_over_https(request, settings)
    if over_https is not None:
        return over_https
    not_navigation = _not_a_navigation(request, ws_id, origin)
    if not_navigation is not None:
        return not_navigation
    if len(target) > workspace_passes.MAX_PATH_CHARS:
        return refused(
            request,
            414,
            f"the address is longer than the {workspace_passes.MAX_PATH_CHARS} characters a workspace "
            f"link may have; open {origin}/ws/{ws_id}/lab",
        )
    try:
        handoff_target(target)
    except BadTarget as problem:
        return bad_target(request, f"the portal hands over addresses under /ws/{ws_id}/ only", problem)
    begin = f"{origin}{HANDOFF_BEGIN_PATH}?to={quote(target, safe='')}"
    return _no_frames_no_cache(RedirectResponse(begin, status_code=303))


def state_cookie(state_hash: str, secure: bool) -> tuple[str, str]:
    """The name and path of the cookie holding the state secret whose sha256 is `state_hash`: one
    per handoff, so that two tabs handed over at once do not overwrite each other's; over https a
    `__Host-` one (path `/`, as that prefix requires)."""
    if secure:
        return HOST_PREFIX + STATE_COOKIE_PREFIX + state_hash[:16], "/"
    return STATE_COOKIE_PREFIX + state_hash[:16], HANDOFF_PATH


def workspace_cookie(ws_id: int | str, secure: bool) -> tuple[str, str]:
    """The name and path of this origin's cookie for workspace `ws_id`: over https a `__Host-`
    one per workspace (path `/`, as that prefix requires), else WORKSPACE_COOKIE on `/ws/<id>/`."""
    if secure:
        return f"{SECURE_WORKSPACE_COOKIE_PREFIX}{ws_id}", "/"
    return WORKSPACE_COOKIE, f"/ws/{ws_id}/"


def secure_cookies(request: Any) -> bool:
    """Whether this origin's cookies are Secure (and `__Host-`): when browsers reach it over https,
    as configured (CORRAL_WORKSPACE_ORIGIN; a TLS proxy not in CORRAL_FORWARDED_ALLOW_IPS makes the
    request look plain) or as this request came."""
    settings = settings_of(request.app)
    configured = settings.workspace_origin if settings is not None else None
    return (configured or _host_and_scheme(request)[1]).startswith("https")


async def begin_handoff(request: Request) -> Response:
    """HANDOFF_BEGIN_PATH on the workspace listener: a fresh state secret in this browser's cookie
    of this origin (HttpOnly, short-lived, sent to the handoff's paths only), and the browser
    sent back to the portal's TICKET_PATH with its hash, for a ticket only this browser can redeem."""
    settings = settings_of(request.app)
    assert settings is not None
    over_https = derived_over_https(request, settings)
    if over_https is not None:
        return over_https
    try:
        ws_id, target = handoff_target(request.query_params.get("to", ""))
    except BadTarget as problem:
        return bad_target(request, f"{HANDOFF_BEGIN_PATH} takes ?to=/ws/<id>/... from the portal", problem)
    not_navigation = _not_a_navigation(request, ws_id, workspace_origin(request, settings))
    if not_navigation is not None:
        return not_navigation
    state = secrets.token_urlsafe(32)
    state_hash = sha256_hex(state)
    query = f"to={quote(target, safe='')}&state={state_hash}"
    answer = RedirectResponse(f"{portal_url(request, settings)}{TICKET_PATH}?{query}", status_code=303)
    secure = secure_cookies(request)
    name, path = state_cookie(state_hash, secure)
    answer.set_cookie(
        name, state, max_age=int(STATE_TTL_S), httponly=True, samesite="lax", secure=secure, path=path
    )
    for older in _older_states(request.cookies, secure):
        answer.delete_cookie(older, path=path, httponly=True, samesite="lax", secure=secure)
    return _no_frames_no_cache(answer)


def _older_states(cookies: Any, secure: bool) -> list[str]:
    """The state cookies the browser sent beyond the newest STATE_COOKIES_KEPT - 1 (with the one
    being set, STATE_COOKIES_KEPT): else a page looping the begin in a popup piles them up, 60 s
    each, until they push the workspace cookies out of the browser's jar or the Cookie header
    past a proxy's limit. Browsers send cookies of one path oldest first (RFC 6265 5.4)."""
    prefix = HOST_PREFIX + STATE_COOKIE_PREFIX if secure else STATE_COOKIE_PREFIX
    held = [name for name in cookies if name.startswith(prefix)]
    return held[: max(0, len(held) - (STATE_COOKIES_KEPT - 1))]


async def send_ticket(request: Request, ws_id: int, target: str, session_secret: str) -> Response:
    """The portal's TICKET_PATH, its owner decided on (corral.workspaces.proxy): a ticket for
    `target` bound to the state hash the workspace origin sent, and the browser sent there with it."""
    settings = settings_of(request.app)
    assert settings is not None
    over_https = derived_over_https(request, settings)
    if over_https is not None:
        return over_https
    origin = workspace_origin(request, settings)
    not_navigation = _not_a_navigation(request, ws_id, origin)
    if not_navigation is not None:
        return not_navigation
    state_hash = request.query_params.get("state", "")
    if workspace_passes.STATE_HASH.fullmatch(state_hash) is None:
        return refused(
            request, 400, f"{TICKET_PATH} takes the state the workspace origin sent; open the workspace again"
        )
    factory: sessionmaker[Session] = request.app.state.session_factory

    def issue() -> str:
        with factory() as db:
            return workspace_passes.issue_ticket(db, session_secret, ws_id, target, state_hash)

    try:
        ticket = await run_in_threadpool(issue)
    except Unauthenticated:  # the session ended since the decision: log in again, then back here
        return RedirectResponse(f"/login?next={quote(urlsplit(target).path, safe='/')}", status_code=302)
    answer = RedirectResponse(f"{origin}{HANDOFF_PATH}?ticket={ticket}", status_code=303)
    return _no_frames_no_cache(answer)


async def take_over(request: Request) -> Response:
    """HANDOFF_PATH on the workspace listener: the ticket exchanged (once, and only in the browser
    holding the state cookie it was issued for, which is deleted) for this origin's cookie for
    its workspace, and the browser sent on to where the ticket was for."""
    if request.method != "GET":  # (a HEAD, a link preview, would spend the ticket)
        return refused(request, 405, f"{HANDOFF_PATH} takes GET with a ticket from the portal")
    factory: sessionmaker[Session] = request.app.state.session_factory
    ticket = request.query_params.get("ticket", "")
    cookies, secure = request.cookies, secure_cookies(request)
    state_names: list[str] = []

    def state_of(state_hash: str) -> str | None:
        name = state_cookie(state_hash, secure)[0]
        state_names.append(name)
        return cookies.get(name)

    def redeem() -> workspace_passes.Redeemed:
        with factory() as db:
            return workspace_passes.redeem_ticket(db, ticket, state_of)

    try:
        redeemed = await run_in_threadpool(redeem)
    except TicketRefused as exc:
        answer = refused(request, 403, exc.message)
        answer.headers["Cache-Control"] = "no-store"
    except BadTarget as problem:  # (spent: open the workspace from the portal again)
        answer = bad_target(request, f"{HANDOFF_PATH} sends the browser under /ws/<id>/ only", problem)
        answer.headers["Cache-Control"] = "no-store"
    else:
        answer = RedirectResponse(redeemed.path, status_code=303)
        name, path = workspace_cookie(redeemed.workspace_id, secure)
        answer.set_cookie(
            name,
            redeemed.cookie,
            max_age=max(1, int(redeemed.expires_at - time.time())),
            httponly=True,
            samesite="lax",
            secure=secure,
            path=path,
        )
        _no_frames_no_cache(answer)
    state_path = state_cookie("", secure)[1]
    for name in state_names:  # spent either way
        answer.delete_cookie(name, path=state_path, httponly=True, samesite="lax", secure=secure)
    return answer


def to_the_portal(request: Any, ws_id: str) -> Response:
    """A browser on the workspace origin without its cookie (a bookmark, an expired one): back to
    the portal's `/ws/<id>/...`, which logs it in if need be and hands it over again."""
    settings = settings_of(request.app)
    assert settings is not None
    return RedirectResponse(portal_url(request, settings) + request_target(request.scope), status_code=302)


def nothing_else(request: Any) -> Response:
    """Any other path on the workspace listener: not the API, not the portal."""
    del request
    return PlainTextResponse(
        "this address serves workspaces only (/ws/<id>/); the portal and its API are elsewhere",
        status_code=404,
        headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
    )
