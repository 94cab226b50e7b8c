"""The reverse proxy in front of each workspace's JupyterLab: `/ws/<id>/...`, HTTP and WebSockets
(kernels, terminals, events), on the Corral server itself.

Served on the workspaces' own origin, a listener apart from the portal's (corral.workspaces.origin:
there the credential is that origin's own cookie, or a bearer token; the portal's `/ws/<id>/` makes
the same decision and hands its owner over); with CORRAL_WORKSPACE_PORT=0, on the portal's origin
with its session cookie, as before. Every request is checked: the workspace's owner gets in;
anyone else is refused (a notebook runs code as its owner: entering someone's workspace would be
acting as them; admins stop or remove it instead): another user gets the very 404 of a missing
workspace (ids are not probeable), an administrator a 403 saying whose it is; no credential: a
redirect to the portal's login (from the workspace listener: to the portal's `/ws/<id>/...`,
which hands over again, or a 401 to a request not asking for HTML; a WebSocket: 403).
The id is a plain positive decimal integer (`/ws/7/`); anything else (`abc`, `+7`, `7.0`) is
answered as a missing workspace. A browser (text/html in Accept) gets a refusal as a small page
with a link to the portal's workspaces; an API client, as JSON (`{"detail": ...}`).
Cookie-authenticated requests that change state, and every WebSocket, must come from the
workspace origin (`Origin` equal to CORRAL_WORKSPACE_ORIGIN, else to the request's host): the
cookie is SameSite=Lax, and this check keeps other sites (the portal's pages too) from driving
a kernel with it.

Upstream, JupyterLab listens only on a Unix socket in the attempt's work dir (local engine), or
on its Slurm node's address and a port the job reports, spoken to only over TLS pinned to the
certificate the job reports with it (corral.workspaces.endpoint, corral.workspaces.labtls:
whatever else holds that port gets no request and a 502 names why), and trusts
one header, the per-start credential the proxy adds
(corral.workspaces.jupyter_auth); Corral's cookie and token are not passed on. The decision for
a (credential, workspace) pair is cached for AUTH_CACHE_S, so a stopped workspace (or a session
revoked through another server) is refused within that time; a request costs no database query
in between. A revoke or deactivation committed in this process clears the cache at once, and a
WebSocket already open ends within seconds of its credential losing access (the server's
OpenSessions).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import websockets
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from corral.api.deps import (
    MAX_ROW_ID,
    SECURE_SESSION_COOKIE,
    SESSION_COOKIE,
    bearer_token,
    portal_https,
    session_cookie_name,
    session_secret,
)
from corral.services.auth import (
    Principal,
    authenticate_session,
    authenticate_token,
    on_credentials_changed,
    sha256_hex,
)
from corral.services.errors import ServiceError
from corral.services.open_sessions import Holder, held_open
from corral.services.workspace_passes import authenticate_pass
from corral.services.workspaces import ProxyTarget, proxy_target
from corral.workspaces.endpoint import EndpointUnusable, Upstream, jupyter_upstream, open_unix_socket
from corral.workspaces.jupyter_auth import HEADER
from corral.workspaces.labtls import pinned_context
from corral.workspaces.origin import (
    HANDOFF_BEGIN_PATH,
    HANDOFF_PATH,
    HOST_PREFIX,
    STATE_COOKIE_PREFIX,
    TICKET_PATH,
    WORKSPACE_COOKIE,
    BadTarget,
    Listener,
    allowed_origin,
    bad_target,
    begin_handoff,
    hand_over,
    handoff_target,
    listener,
    nothing_else,
    refused,
    secure_cookies,
    send_ticket,
    settings_of,
    take_over,
    to_the_portal,
    workspace_cookie,
)
from corral.workspaces.upstream import (
    HttpPool,
    UpstreamError,
    UpstreamImpostor,
    UpstreamResponse,
    UpstreamTimeout,
    close_quietly,
)

log = logging.getLogger("corral.workspaces.proxy")
router = APIRouter(include_in_schema=False)

AUTH_CACHE_S = 2.0
NOT_RUNNING_CACHE_S = 0.2
SMALL_BODY_BYTES = 1 << 20  # answers up to this size are read whole, then sent (no streaming)
# A workspace id as its URLs give it; anything else (`abc`, `+1`, `1.0`) names no workspace.
PLAIN_ID = re.compile(r"[1-9][0-9]{0,18}")
HTTP_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Not forwarded either way: hop-by-hop headers, and Corral's own credentials.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer"}
    | {"transfer-encoding", "upgrade", "host", "authorization", "content-length", "expect"}
)
# Of the upstream's answer: hop-by-hop ones; Content-Length stays (the bytes pass as they came,
# still compressed if they were; a chunked body is framed again by the server). And JupyterLab's
# `Server` (the serving uvicorn adds its own: two would arrive).
RESPONSE_DROPPED = frozenset(h.encode("latin-1") for h in HOP_BY_HOP - {"content-length"} | {"server"})


@dataclass(frozen=True, slots=True)
class Decision:
    status: int  # 200: go ahead; 302: log in first; 403, 404, 503: refused with `message`
    message: str = ""
    upstream: Upstream | None = None
    token: str = ""
    via_cookie: bool = False
    holder: Holder | None = None  # whose credential let it in (a WebSocket is held open by it)


_decisions: dict[tuple[str, str, int], tuple[float, Decision]] = {}  # (kind, hash, workspace)
_pools: dict[Upstream, HttpPool] = {}  # kept-alive upstream connections
# A revoke, logout or deactivation committed in this process is refused at once, not after the
# decision's AUTH_CACHE_S.
on_credentials_changed(_decisions.clear)


TOKEN, SESSION, PASS = "token", "session", "pass"  # the kinds of credential a request may carry


def _credential(
    headers: Any, cookies: Any, where: Listener, ws_id: int, secure: bool
) -> tuple[str, str] | None:
    """A bearer token, else the cookie of the listener it came in on: the portal's session
    cookie, or on the workspace listener its own for `ws_id` (over https, `secure`, only the
    `__Host-` one of either; the portal's is never accepted there: cookies are not kept apart by
    port, so the browser sends it along)."""
    token = bearer_token(headers.get("authorization", ""))
    if token is not None:
        return token, TOKEN
    if where is Listener.WORKSPACE:
        cookie = cookies.get(workspace_cookie(ws_id, secure)[0])
        return (cookie, PASS) if cookie else None
    cookie = cookies.get(SECURE_SESSION_COOKIE if secure else SESSION_COOKIE)
    return (cookie, SESSION) if cookie else None


def _principal(session: Session, secret: str, kind: str, ws_id: int) -> Principal:
    if kind == PASS:
        return authenticate_pass(session, secret, ws_id)
    return authenticate_session(session, secret) if kind == SESSION else authenticate_token(session, secret)


def _decide(factory: sessionmaker[Session], engine: Any, secret: str, kind: str, ws_id: int) -> Decision:
    with factory() as session:
        try:
            principal = _principal(session, secret, kind, ws_id)
        except ServiceError:
            return Decision(302)
        target: ProxyTarget | None = proxy_target(session, ws_id)
    if target is None or (target.owner_user_id != principal.user_id and not principal.is_admin):
        # Someone else's workspace is answered as a missing one: ids are not probeable.
        return _missing(ws_id)
    if target.owner_user_id != principal.user_id:
        return Decision(403, f"workspace {ws_id} belongs to another user; only its owner may open it")
    if target.attempt_id is None and target.starting:
        return Decision(
            503,
            f"workspace {target.name!r} is starting (job {target.job_id}): its JupyterLab answers here "
            f"once it runs; `corral ws show {target.name}` says why it waits",
        )
    if target.attempt_id is None:
        start = f"corral ws start {target.name}"
        return Decision(503, f"workspace {target.name!r} is stopped; start it with `{start}`")
    try:
        upstream = jupyter_upstream(engine, target.attempt_id, target.node_address)
    except EndpointUnusable as exc:
        return Decision(503, f"workspace {ws_id}: {exc}")
    if upstream is None:
        return Decision(503, f"workspace {ws_id}: JupyterLab has not said where it listens yet; try again")
    holder = Holder(principal.name, principal.credential)
    return Decision(200, upstream=upstream, token=target.token, via_cookie=kind != TOKEN, holder=holder)


def _missing(ws_id: int | str) -> Decision:
    return Decision(404, f"there is no workspace {ws_id}")


def workspace_id(text: str) -> int | None:
    """The id in `/ws/<id>/`: a plain positive decimal integer that a row can have (`1`, not `01`,
    `+1`, `1.0` or `abc`); None otherwise, answered as a missing workspace."""
    if PLAIN_ID.fullmatch(text) is None or int(text) > MAX_ROW_ID:
        return None
    return int(text)


async def authorize(
    app: Any,
    headers: Any,
    cookies: Any,
    ws_id: int,
    where: Listener = Listener.SHARED,
    secure: bool = False,
) -> Decision:
    """The decision for `ws_id` on the request's credential; `secure`: the listener's cookies are
    the https (`__Host-`) ones (_https_cookies)."""
    found = _credential(headers, cookies, where, ws_id, secure)
    if found is None:
        return Decision(302)
    secret, kind = found
    # By kind too: a portal session's decision is no answer for the same secret sent as a bearer
    # token or as the workspace origin's cookie (nor the other way round).
    key, now = (kind, sha256_hex(secret), ws_id), time.monotonic()
    cached = _decisions.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    decision = await run_in_threadpool(
        _decide, app.state.session_factory, app.state.engine, secret, kind, ws_id
    )
    if len(_decisions) > 10_000:
        _decisions.clear()
    # "Not running yet" changes within a second of a start: kept briefly, or a workspace that
    # has just started would keep answering 503 for AUTH_CACHE_S after its JupyterLab is up.
    ttl = NOT_RUNNING_CACHE_S if decision.status == 503 else AUTH_CACHE_S
    _decisions[key] = (now + ttl, decision)
    return decision


def _https_cookies(connection: Any, where: Listener) -> bool:
    """Whether the cookies of the listener `connection` came in on are the https (`__Host-`) ones:
    the workspace origin's as corral.workspaces.origin.secure_cookies decides, the portal's as
    corral.api.deps.portal_https does (with the listener off, the lab is on the portal's origin)."""
    return secure_cookies(connection) if where is Listener.WORKSPACE else portal_https(connection.scope)


def _pool(upstream: Upstream) -> HttpPool:
    pool = _pools.get(upstream)
    if pool is None:
        if len(_pools) > 256:  # old attempts' sockets: drop them all, they are cheap to make again
            for old in _pools.values():
                asyncio.get_running_loop().create_task(close_quietly(old))
            _pools.clear()
        pool = _pools[upstream] = HttpPool(
            upstream.socket, upstream.host, upstream.port, upstream.fingerprint
        )
    return pool


def _upstream_headers(headers: Any, token: str) -> list[tuple[str, str]]:
    out = [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "cookie"]
    cookies = [c for c in headers.get("cookie", "").split(";") if c.strip() and not _corral_cookie(c)]
    if cookies:
        out.append(("cookie", ";".join(cookies)))
    out.append(("host", headers.get("host", "localhost")))
    out.append((HEADER, token))
    return out


def _corral_cookie(item: str) -> bool:
    """Corral's own cookies, never passed on to JupyterLab: the portal's session (either name),
    the workspace origin's (every workspace's and the handoff's state, `__Host-` ones over https)."""
    name = item.strip().partition("=")[0]
    return name in (SESSION_COOKIE, SECURE_SESSION_COOKIE, WORKSPACE_COOKIE) or name.startswith(
        (STATE_COOKIE_PREFIX, HOST_PREFIX + "corral_")
    )


def _refusal(
    request: Request, decision: Decision, where: Listener, ws_id: str, path: str | None = None
) -> Response:
    if decision.status == 302 and where is Listener.WORKSPACE:
        if "text/html" not in request.headers.get("accept", ""):
            # Not a browser's page: an API client whose token was dropped on the portal's 307
            # (clients do, to another host or port) or a script; a redirect chain would end on
            # the portal's login page, a 200 of HTML. `message` is what JupyterLab's front end
            # shows of an error's body (ResponseError); `detail` is what the API's errors carry.
            message = no_credential(ws_id)
            return JSONResponse(
                {"detail": message, "message": message},
                status_code=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        return to_the_portal(request, ws_id)
    if decision.status == 302:
        return _to_login(path or request.url.path)
    return refused(request, decision.status, decision.message)


def no_credential(ws_id: str) -> str:
    return (
        f"no valid credential for workspace {ws_id}: send an API token (Authorization: Bearer) to "
        "this address itself (clients drop it on a redirect), or open the workspace from the portal"
    )


def _to_login(path: str) -> Response:
    return RedirectResponse(f"/login?next={quote(path, safe='/')}", status_code=302)


async def handoff_ticket(request: Request) -> Response:
    """The portal's TICKET_PATH (`?to=/ws/<id>/...&state=<hash>`, where the workspace origin's
    HANDOFF_BEGIN_PATH sends a browser): the decision of the portal's `/ws/<id>/` on its session
    cookie (a bearer token is no credential here); for the owner, a ticket bound to that state."""
    try:
        ws_id, target = handoff_target(request.query_params.get("to", ""))
    except BadTarget as problem:
        return bad_target(request, f"{TICKET_PATH} takes ?to=/ws/<id>/... from the workspace origin", problem)
    path = urlsplit(target).path
    secret = session_secret(request)
    if not secret:
        return _to_login(path)
    # the secret found under the name that fits this request, passed on under that name
    name, secure = session_cookie_name(request.scope), portal_https(request.scope)
    decision = await authorize(request.app, {}, {name: secret}, ws_id, Listener.PORTAL, secure)
    if decision.status != 200:
        return _refusal(request, decision, Listener.PORTAL, str(ws_id), path)
    return await send_ticket(request, ws_id, target, secret)


@router.api_route("/ws/{ws_id}/{path:path}", methods=HTTP_METHODS)
async def proxy_http(request: Request, ws_id: str, path: str) -> Response:
    number = workspace_id(ws_id)
    if number is None:
        return refused(request, 404, _missing(ws_id[:40]).message)
    where = listener(request.app, request.scope)
    decision = await authorize(
        request.app, request.headers, request.cookies, number, where, _https_cookies(request, where)
    )
    if decision.status != 200:
        return _refusal(request, decision, where, ws_id)
    if where is Listener.PORTAL:  # the owner: handed over to the workspace origin
        return await hand_over(request, number, session_secret(request) if decision.via_cookie else None)
    if (
        decision.via_cookie
        and request.method not in SAFE_METHODS
        and not allowed_origin(request.headers, settings_of(request.app), where)
    ):
        return refused(request, 403, "cross-origin request to a workspace refused")
    assert decision.upstream is not None
    target = request.scope.get("raw_path") or quote(f"/ws/{ws_id}/{path}").encode()
    query = request.scope.get("query_string", b"")
    target = target + b"?" + query if query else target
    length = request.headers.get("content-length")
    has_body = length not in (None, "0") or "transfer-encoding" in request.headers
    try:
        response = await _pool(decision.upstream).request(
            request.method,
            target.decode("latin-1"),
            _upstream_headers(request.headers, decision.token),
            request.stream() if has_body else None,
            int(length) if length is not None and length.isdigit() else None,
        )
    except UpstreamImpostor as exc:
        _decisions.clear()  # JupyterLab may have restarted, with a new port and certificate
        log.warning("workspace %s: %s", ws_id, exc)
        return refused(request, 502, f"workspace {ws_id}'s JupyterLab is not there: {exc}")
    except UpstreamError as exc:
        _decisions.clear()  # the workspace may have stopped: look again next time
        status = 504 if isinstance(exc, UpstreamTimeout) else 502
        return refused(request, status, f"workspace {ws_id}'s JupyterLab does not answer ({exc})")
    answer: Response
    if _small(response):
        # Read whole and sent in one message: a StreamingResponse's task group (it watches for
        # the client leaving) costs more than a short answer itself (docs/workspaces.md figures).
        try:
            body = await response.read()
        except UpstreamError as exc:
            return refused(request, 502, f"workspace {ws_id}'s JupyterLab broke off ({exc})")
        finally:
            await response.aclose()
        answer = Response(body, status_code=response.status_code)
    else:
        answer = StreamingResponse(
            response.chunks(), status_code=response.status_code, background=BackgroundTask(response.aclose)
        )
    # Raw, not a dict: several Set-Cookie headers must all arrive. Content-Length stays (the bytes
    # are passed on as they came, still compressed if they were).
    answer.raw_headers = _answer_headers(response.headers)
    return answer


def _answer_headers(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's headers passed on: not RESPONSE_DROPPED, not an empty
    Access-Control-Allow-Origin (JupyterLab echoes a token-authenticated request's Origin, the
    empty string when it sent none: that allows no origin, it only confuses), and no Set-Cookie of
    one of Corral's own cookies: what answers there is the owner's code, which could otherwise set
    or clear the workspace origin's cookies of other workspaces and the handoff's state (the one
    way in that the `__Host-` prefix leaves open; review118 #4)."""
    out = []
    for key, value in headers:
        name = key.lower()
        if name in RESPONSE_DROPPED or (name == b"access-control-allow-origin" and not value.strip()):
            continue
        if name == b"set-cookie" and _corral_cookie(value.decode("latin-1")):
            continue
        out.append((name, value))
    return out


def _small(response: UpstreamResponse) -> bool:
    """An answer of known length up to SMALL_BODY_BYTES (not a stream of unknown end)."""
    length = (response.header(b"content-length") or b"").decode("latin-1")
    return (length.isdigit() and int(length) <= SMALL_BODY_BYTES) or response.status_code in (204, 304)


@router.websocket("/ws/{ws_id}/{path:path}")
async def proxy_websocket(websocket: WebSocket, ws_id: str, path: str) -> None:
    number = workspace_id(ws_id)
    if number is None:
        await websocket.close(code=1008)  # as for a missing workspace: HTTP 403
        return
    where = listener(websocket.app, websocket.scope)
    if where is Listener.PORTAL:  # JupyterLab's WebSockets go to the workspace origin only
        await websocket.close(code=1008)
        return
    decision = await authorize(
        websocket.app, websocket.headers, websocket.cookies, number, where, _https_cookies(websocket, where)
    )
    if decision.status != 200 or not allowed_origin(websocket.headers, settings_of(websocket.app), where):
        await websocket.close(code=1008)  # before accept: the client gets HTTP 403
        return
    assert decision.upstream is not None
    # The path as the browser sent it, as for HTTP: the decoded one turned an escaped `?` or `#`
    # into a query or a fragment (websockets then refused the URI) and `%2F` into a `/`.
    target = websocket.scope.get("raw_path") or quote(f"/ws/{ws_id}/{path}").encode()
    query = websocket.scope.get("query_string", b"")
    target = target + b"?" + query if query else target
    protocols = [
        p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
    ]
    try:
        upstream = await _connect_upstream(decision, target.decode("latin-1"), protocols)
    except (OSError, websockets.InvalidHandshake, TimeoutError) as exc:
        _decisions.clear()
        log.info("workspace %s: upstream WebSocket refused: %s", ws_id, exc)
        await _deny(websocket, 502, _upstream_failure(ws_id, decision.upstream, exc))
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    # Held open by its credential (a kernel's WebSocket lives for hours): closed when that
    # loses access (corral.services.open_sessions).
    with held_open(websocket.app.state, decision.holder) as ended:
        async with upstream:
            await _pump(websocket, upstream, ended)


async def _connect_upstream(decision: Decision, target: str, protocols: list[str]) -> Any:
    """The WebSocket to JupyterLab: over its Unix socket (checked peer), or over TLS pinned to its
    certificate (the pin is checked in the handshake, before the upgrade request and its
    credential are sent). Never through an HTTP proxy named in the server's environment."""
    upstream = decision.upstream
    assert upstream is not None
    options: dict[str, Any] = {
        "additional_headers": {HEADER: decision.token},
        "subprotocols": protocols or None,
        "max_size": None,
        "compression": None,
        "open_timeout": 10,
    }
    if upstream.socket is not None:
        sock = await open_unix_socket(upstream.socket)
        return await websockets.unix_connect(None, f"ws://localhost{target}", sock=sock, **options)
    if upstream.fingerprint is None:  # (jupyter_upstream never makes one): no clear text
        raise ssl.SSLError("no certificate fingerprint for a TCP upstream")
    tls = pinned_context(upstream.fingerprint)
    return await websockets.connect(f"wss://{upstream.authority}{target}", ssl=tls, proxy=None, **options)


def _upstream_failure(ws_id: str, upstream: Upstream, exc: BaseException) -> str:
    if isinstance(exc, ssl.SSLError):  # the pin's PinMismatch included: a squatter, or no TLS
        return (
            f"workspace {ws_id}'s JupyterLab is not there: {upstream.authority} did not prove to be "
            f"it ({exc}); nothing was sent to it"
        )
    return f"workspace {ws_id}'s JupyterLab does not answer ({exc})"


async def _deny(websocket: WebSocket, status: int, message: str) -> None:
    """Refuse a WebSocket before accepting it: an HTTP answer saying why where the server can send
    one (uvicorn), else a close (the client sees a 403)."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(JSONResponse({"detail": message}, status_code=status))
    else:
        await websocket.close(code=1011)


async def _pump(client: WebSocket, upstream: Any, ended: asyncio.Event | None = None) -> None:
    """Copy frames both ways until either side closes, or `ended` is set; then close the other."""

    async def client_to_upstream() -> None:
        while True:
            message = await client.receive()
            if message["type"] == "websocket.disconnect":
                return
            data = message.get("bytes")
            await upstream.send(data if data is not None else message.get("text", ""))

    async def upstream_to_client() -> None:
        async for data in upstream:
            if isinstance(data, bytes):
                await client.send_bytes(data)
            else:
                await client.send_text(data)

    tasks: list[asyncio.Task[Any]] = [
        asyncio.create_task(client_to_upstream()),
        asyncio.create_task(upstream_to_client()),
    ]
    if ended is not None:
        tasks.append(asyncio.create_task(ended.wait()))
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in (*done, *pending):
        with contextlib.suppress(
            asyncio.CancelledError, WebSocketDisconnect, websockets.ConnectionClosed, RuntimeError
        ):
            await task
    with contextlib.suppress(RuntimeError, WebSocketDisconnect):
        await client.close()


@dataclass(frozen=True, slots=True)
class _RouteLabel:
    path: str  # what the request metrics label the request with (corral.monitor.middleware)


WORKSPACE_PATH = re.compile(r"^/ws/([^/]*)/(.*)$", re.DOTALL)
ROUTE_LABEL = _RouteLabel("/ws/{ws_id}/{path:path}")
HANDOFF_LABEL = _RouteLabel(HANDOFF_PATH)  # (any other path there is counted as unmatched)
HANDOFF_BEGIN_LABEL = _RouteLabel(HANDOFF_BEGIN_PATH)
TICKET_LABEL = _RouteLabel(TICKET_PATH)


class ProxyDispatch:
    """ASGI middleware that hands `/ws/<id>/...` straight to the proxy's handlers, ahead of the
    API's own middleware and router. Why: the router tries every API route's pattern before
    this catch-all one, and the API's admission limit would hold a slot for the whole of a
    proxied stream; together they were most of what the proxy added to a JupyterLab request.
    The API's body limits never applied to /ws/ (corral.api.limits). Installed inside the
    request metrics, which still count these requests under ROUTE_LABEL. The router keeps the
    same routes (an app built without this middleware serves /ws/ the same way)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        kind = scope["type"]
        where = listener(scope.get("app"), scope) if kind in ("http", "websocket") else None
        if where is Listener.WORKSPACE:
            await self._workspace_listener(scope, receive, send)
            return
        if where is Listener.PORTAL and kind == "http" and scope["path"] == TICKET_PATH:
            scope["route"] = TICKET_LABEL
            await (await handoff_ticket(Request(scope, receive)))(scope, receive, send)
            return
        found = WORKSPACE_PATH.match(scope["path"]) if kind in ("http", "websocket") else None
        if found is None or (kind == "http" and scope["method"] not in HTTP_METHODS):
            await self.app(scope, receive, send)
            return
        scope["route"] = ROUTE_LABEL
        ws_id, path = found[1], found[2]
        if kind == "websocket":
            await proxy_websocket(WebSocket(scope, receive, send), ws_id, path)
            return
        response = await proxy_http(Request(scope, receive), ws_id, path)
        await response(scope, receive, send)

    async def _workspace_listener(self, scope: Any, receive: Any, send: Any) -> None:
        """The workspace listener serves the proxy and the handoff, and nothing of the API's."""
        found = WORKSPACE_PATH.match(scope["path"])
        if found is not None:
            scope["route"] = ROUTE_LABEL
        elif scope["path"] == HANDOFF_PATH:
            scope["route"] = HANDOFF_LABEL
        elif scope["path"] == HANDOFF_BEGIN_PATH:
            scope["route"] = HANDOFF_BEGIN_LABEL
        if scope["type"] == "websocket":
            if found is None:
                await WebSocket(scope, receive, send).close(code=1008)
            else:
                await proxy_websocket(WebSocket(scope, receive, send), found[1], found[2])
            return
        request = Request(scope, receive)
        if found is not None and scope["method"] in HTTP_METHODS:
            response = await proxy_http(request, found[1], found[2])
        elif scope["path"] == HANDOFF_PATH:
            response = await take_over(request)
        elif scope["path"] == HANDOFF_BEGIN_PATH:
            response = await begin_handoff(request)
        else:
            response = nothing_else(request)
        await response(scope, receive, send)


FRONT_MIDDLEWARE = ProxyDispatch  # installed by corral.api.app, inside the request metrics
