"""The reverse proxy in front of each workspace's JupyterLab: `/ws/<id>/...`, HTTP and WebSockets
(kernels, terminals, events), on the Corral server itself.

Every request is checked against Corral's own credentials (the portal's session cookie, or a
bearer token): the workspace's owner gets in; anyone else, administrators included, gets 403 (a
notebook runs code as its owner: entering someone's workspace would be acting as them; admins
stop or remove it instead); no credential: a redirect to the portal's login (a WebSocket: 403).
Cookie-authenticated requests that change state, and every WebSocket, must come from the
server's own origin (`Origin` equal to the request's host): the session cookie is SameSite=Lax,
and this check keeps other sites from driving a kernel with it.

Upstream, JupyterLab listens only on a Unix socket in the attempt's work dir (local engine), or
on its Slurm node's address and a port the job reports (corral.workspaces.endpoint), and trusts
one header, the per-start credential the proxy adds
(corral.workspaces.jupyter_auth); Corral's cookie and token are not passed on. The decision for
a (credential, workspace) pair is cached for AUTH_CACHE_S, so a revoked session or a stopped
workspace is refused within that time; a request costs no database query in between.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx
import websockets
from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from sqlalchemy.orm import Session, sessionmaker
from starlette.background import BackgroundTask
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from corral.api.deps import SESSION_COOKIE
from corral.services.auth import Principal, authenticate_session, authenticate_token, sha256_hex
from corral.services.errors import ServiceError
from corral.services.workspaces import ProxyTarget, proxy_target
from corral.workspaces.endpoint import Upstream, jupyter_upstream
from corral.workspaces.jupyter_auth import HEADER

log = logging.getLogger("corral.workspaces.proxy")
logging.getLogger("httpx").setLevel(logging.WARNING)  # not a log line per proxied request
router = APIRouter(include_in_schema=False)

AUTH_CACHE_S = 2.0
HTTP_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Not forwarded either way: hop-by-hop headers, and Corral's own credentials.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer"}
    | {"transfer-encoding", "upgrade", "host", "authorization", "content-length"}
)


@dataclass(frozen=True, slots=True)
class Decision:
    status: int  # 200: go ahead; 302: log in first; 403, 404, 503: refused with `message`
    message: str = ""
    upstream: Upstream | None = None
    token: str = ""
    via_cookie: bool = False


_decisions: dict[tuple[str, int], tuple[float, Decision]] = {}
_clients: dict[str, httpx.AsyncClient] = {}


def _credential(headers: Any, cookies: Any) -> tuple[str, bool] | None:
    auth = headers.get("authorization", "")
    scheme, _, value = auth.partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip(), False
    cookie = cookies.get(SESSION_COOKIE)
    return (cookie, True) if cookie else None


def _decide(
    factory: sessionmaker[Session], engine: Any, secret: str, via_cookie: bool, ws_id: int
) -> Decision:
    with factory() as session:
        try:
            principal: Principal = (
                authenticate_session(session, secret) if via_cookie else authenticate_token(session, secret)
            )
        except ServiceError:
            return Decision(302)
        target: ProxyTarget | None = proxy_target(session, ws_id)
    if target is None:
        return Decision(404, f"there is no workspace {ws_id}")
    if target.owner_user_id != principal.user_id:
        return Decision(403, f"workspace {ws_id} belongs to another user; only its owner may open it")
    if target.attempt_id is None:
        return Decision(503, f"workspace {ws_id} is not running; start it with `corral ws start`")
    upstream = jupyter_upstream(engine, target.attempt_id, target.node_address)
    if upstream is None:
        return Decision(503, f"workspace {ws_id}: JupyterLab has not said where it listens yet; try again")
    return Decision(200, upstream=upstream, token=target.token, via_cookie=via_cookie)


async def authorize(app: Any, headers: Any, cookies: Any, ws_id: int) -> Decision:
    found = _credential(headers, cookies)
    if found is None:
        return Decision(302)
    secret, via_cookie = found
    key, now = (sha256_hex(secret), ws_id), time.monotonic()
    cached = _decisions.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    decision = await run_in_threadpool(
        _decide, app.state.session_factory, app.state.engine, secret, via_cookie, ws_id
    )
    if len(_decisions) > 10_000:
        _decisions.clear()
    _decisions[key] = (now + AUTH_CACHE_S, decision)
    return decision


def same_origin(headers: Any) -> bool:
    origin = headers.get("origin")
    if origin is None:
        return False
    return urlsplit(origin).netloc == headers.get("host", "")


def _client(upstream: Upstream) -> httpx.AsyncClient:
    client = _clients.get(upstream.key)
    if client is None:
        if len(_clients) > 256:  # old attempts' sockets: drop them all, they are cheap to make again
            for old in _clients.values():
                asyncio.get_running_loop().create_task(old.aclose())
            _clients.clear()
        transport = httpx.AsyncHTTPTransport(uds=upstream.socket)  # uds=None: TCP to host:port
        client = _clients[upstream.key] = httpx.AsyncClient(transport=transport, timeout=None)
    return client


def _upstream_headers(headers: Any, token: str) -> list[tuple[str, str]]:
    out = [(k, v) for k, v in headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "cookie"]
    cookies = [c for c in headers.get("cookie", "").split(";") if c.strip() and not _corral_cookie(c)]
    if cookies:
        out.append(("cookie", ";".join(cookies)))
    out.append(("host", headers.get("host", "localhost")))
    out.append((HEADER, token))
    return out


def _corral_cookie(item: str) -> bool:
    return item.strip().startswith(SESSION_COOKIE + "=")


def _refusal(request_path: str, decision: Decision) -> Response:
    if decision.status == 302:
        return RedirectResponse(f"/login?next={quote(request_path, safe='/')}", status_code=302)
    return JSONResponse({"detail": decision.message}, status_code=decision.status)


@router.api_route("/ws/{ws_id}/{path:path}", methods=HTTP_METHODS)
async def proxy_http(request: Request, ws_id: int, path: str) -> Response:
    decision = await authorize(request.app, request.headers, request.cookies, ws_id)
    if decision.status != 200:
        return _refusal(request.url.path, decision)
    if decision.via_cookie and request.method not in SAFE_METHODS and not same_origin(request.headers):
        return JSONResponse({"detail": "cross-origin request to a workspace refused"}, status_code=403)
    assert decision.upstream is not None
    client = _client(decision.upstream)
    url = httpx.URL(path="/" + f"ws/{ws_id}/{path}", query=request.url.query.encode())
    upstream = client.build_request(
        request.method,
        url.copy_with(scheme="http", host=decision.upstream.host, port=decision.upstream.port),
        headers=_upstream_headers(request.headers, decision.token),
        content=request.stream() if request.method not in ("GET", "HEAD") else None,
    )
    try:
        response = await client.send(upstream, stream=True)
    except httpx.TransportError as exc:
        _decisions.clear()  # the workspace may have stopped: look again next time
        return JSONResponse({"detail": f"workspace {ws_id}'s JupyterLab does not answer ({exc})"}, 502)
    answer = StreamingResponse(
        _body(response), status_code=response.status_code, background=BackgroundTask(response.aclose)
    )
    # Raw, not a dict: several Set-Cookie headers must all arrive. Content-Length stays (the bytes
    # are passed on as they came, still compressed if they were).
    answer.raw_headers = [
        (k.lower().encode("latin-1"), v.encode("latin-1"))
        for k, v in response.headers.multi_items()
        if k.lower() not in HOP_BY_HOP or k.lower() == "content-length"
    ]
    return answer


async def _body(response: httpx.Response) -> AsyncIterator[bytes]:
    async for chunk in response.aiter_raw():
        yield chunk


@router.websocket("/ws/{ws_id}/{path:path}")
async def proxy_websocket(websocket: WebSocket, ws_id: int, path: str) -> None:
    decision = await authorize(websocket.app, websocket.headers, websocket.cookies, ws_id)
    if decision.status != 200 or not same_origin(websocket.headers):
        await websocket.close(code=1008)  # before accept: the client gets HTTP 403
        return
    assert decision.upstream is not None
    query = websocket.url.query
    uri = f"ws://{decision.upstream.authority}/ws/{ws_id}/{path}" + (f"?{query}" if query else "")
    protocols = [
        p.strip() for p in websocket.headers.get("sec-websocket-protocol", "").split(",") if p.strip()
    ]
    try:
        options: dict[str, Any] = {
            "additional_headers": {HEADER: decision.token},
            "subprotocols": protocols or None,
            "max_size": None,
            "compression": None,
            "open_timeout": 10,
        }
        if decision.upstream.socket is not None:
            upstream = await websockets.unix_connect(decision.upstream.socket, uri, **options)
        else:
            upstream = await websockets.connect(uri, **options)
    except (OSError, websockets.InvalidHandshake, TimeoutError) as exc:
        log.info("workspace %s: upstream WebSocket refused: %s", ws_id, exc)
        _decisions.clear()
        await websocket.close(code=1011)
        return
    await websocket.accept(subprotocol=upstream.subprotocol)
    async with upstream:
        await _pump(websocket, upstream)


async def _pump(client: WebSocket, upstream: Any) -> None:
    """Copy frames both ways until either side closes; then close the other."""

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

    tasks = [asyncio.create_task(client_to_upstream()), asyncio.create_task(upstream_to_client())]
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
