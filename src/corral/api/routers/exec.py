"""WebSocket /api/v1/jobs/{job_id}/exec: a process inside a running job's sandbox, streamed.
Used by `corral exec`, `corral port-forward` and the SDK (docs/workspaces.md, "SSH gateway and
sandbox entry").

Protocol. Authenticate as for the REST API (Authorization: Bearer; or the portal's session cookie
from a page of the same origin). The first message (text, JSON) says what to run:
  {"argv": ["cmd", ...], "rank": 0, "tty": false, "rows": 24, "cols": 80}
  {"port": 6006, "rank": 0}            a TCP relay to 127.0.0.1:6006 in the job's network
The server answers {"started": true} or {"error": "...", "status": 4xx} and closes with code
4000+status. Then binary frames carry data, their first byte the stream: client -> server 0
(stdin); server -> client 1 (stdout) and 2 (stderr; with a TTY everything comes on 1). Text
frames: client -> server {"eof": true} (close stdin), {"resize": [rows, cols]}; server -> client
{"exit": code} last, then a normal close. Only the job's owner and admins get in; each entry is
in the audit log (action job.exec or job.port_forward). A session whose token or portal session
is revoked or expires, or whose user is deactivated, ends within seconds: the process is killed
and the client gets {"error": ..., "status": 401} and close code 4401. A session is counted, open and then
closed, in the server's SessionUse (app.state.session_use): a workspace's use for idle reclamation.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import replace
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from corral.api.deps import bearer_token, session_secret
from corral.engine.base import Engine, ExecRefused
from corral.gateway.spawn import SandboxProcess
from corral.services.auth import Principal, authenticate_session, authenticate_token
from corral.services.errors import Forbidden, ServiceError, Unauthenticated
from corral.services.open_sessions import ENDED_MESSAGE, Holder, held_open
from corral.services.sandbox_exec import exec_target, record_entry, relay_argv
from corral.services.session_use import SessionUse

router = APIRouter(tags=["jobs"])
STDIN = 0
MAX_ARGV = 256


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@router.websocket("/jobs/{job_id}/exec")
async def exec_in_job(websocket: WebSocket, job_id: int) -> None:
    await websocket.accept()
    try:
        request = json.loads(await websocket.receive_text())
        proc, principal = await _start(websocket, job_id, request)
    except Refused as exc:
        await _refuse(websocket, exc.status, str(exc))
        return
    except (ValueError, KeyError, TypeError) as exc:
        await _refuse(websocket, 400, f"the first message must be a JSON object naming argv or port: {exc}")
        return
    except WebSocketDisconnect:
        return
    use: SessionUse | None = getattr(websocket.app.state, "session_use", None)  # None: not counted
    if use is not None:
        use.opened(job_id)
    try:
        # Held open by its credential: ended when that loses access (corral.services.open_sessions).
        with held_open(websocket.app.state, Holder(principal.name, principal.credential)) as ended:
            await websocket.send_text(json.dumps({"started": True}))
            await _stream_until(websocket, proc, ended)
    finally:
        proc.kill()  # idempotent; a send failing before _stream must not leave it running
        if use is not None:
            use.closed(job_id, time.time())


async def _stream_until(websocket: WebSocket, proc: SandboxProcess, ended: asyncio.Event) -> None:
    """_stream, unless `ended` is set first: then the process is killed and the client told why
    (code 4401, as a refusal for an unauthenticated request)."""
    stream = asyncio.ensure_future(_stream(websocket, proc))
    waiter = asyncio.ensure_future(ended.wait())
    try:
        await asyncio.wait({stream, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if stream.done():
        return stream.result()
    stream.cancel()  # _stream's finally kills the process (and exec_in_job's, if it never ran)
    with contextlib.suppress(asyncio.CancelledError):
        await stream
    await _refuse(websocket, 401, ENDED_MESSAGE)


async def _start(websocket: WebSocket, job_id: int, request: Any) -> tuple[SandboxProcess, Principal]:
    if not isinstance(request, dict):
        raise Refused(400, "the first message must be a JSON object")
    rank, tty = request.get("rank", 0), bool(request.get("tty", False))
    rows, cols = int(request.get("rows", 24)), int(request.get("cols", 80))
    if not isinstance(rank, int) or rank < 0:
        raise Refused(422, f"rank must be a non-negative integer, got {rank!r}")
    port = request.get("port")
    if port is not None:
        if not isinstance(port, int):
            raise Refused(422, f"port must be an integer, got {port!r}")
        argv, how, tty = None, "port_forward", False
    else:
        argv = request.get("argv")
        if not isinstance(argv, list) or not argv or len(argv) > MAX_ARGV:
            raise Refused(422, "argv must be a non-empty list of strings (the command and its arguments)")
        if not all(isinstance(a, str) and "\0" not in a for a in argv):
            raise Refused(422, "argv must hold strings without NUL characters")
        how = "exec"
    engine: Engine | None = websocket.app.state.engine
    if engine is None:
        raise Refused(503, "this server runs no execution engine")
    factory: sessionmaker[Session] = websocket.app.state.session_factory
    try:
        principal = await run_in_threadpool(_authenticate, websocket, factory)
        command: list[str] = relay_argv(port) if port is not None else list(argv or ())
        cmd = await run_in_threadpool(_enter, factory, engine, principal, job_id, rank, how, command)
    except ServiceError as exc:
        raise Refused(exc.status_code, exc.message)
    except ExecRefused as exc:
        raise Refused(409, str(exc))
    return await SandboxProcess.start(cmd, tty=tty, rows=rows, cols=cols), principal


def _enter(
    factory: sessionmaker[Session],
    engine: Engine,
    principal: Principal,
    job_id: int,
    rank: int,
    how: str,
    argv: list[str],
) -> Any:
    with factory() as db:
        target = exec_target(db, principal, job_id, rank)
        cmd = engine.exec_command(target.attempt_id, target.rank, argv)
        record_entry(db, principal, target, how, argv if how == "exec" else [f"127.0.0.1:{argv[-1]}"])
        return cmd


def _authenticate(websocket: WebSocket, factory: sessionmaker[Session]) -> Principal:
    header = websocket.headers.get("authorization")
    with factory() as db:
        if header:
            token = bearer_token(header)  # as the API reads it
            if token is None:
                raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
            principal = authenticate_token(db, token)
        elif cookie := session_secret(websocket):
            # A cookie goes with any page's WebSocket: only the portal's own pages may use it.
            origin, host = websocket.headers.get("origin", ""), websocket.headers.get("host", "")
            if origin.split("://", 1)[-1] != host:
                raise Forbidden("a cookie-authenticated exec must come from a page of the portal itself")
            principal = authenticate_session(db, cookie)
        else:
            raise Unauthenticated("not authenticated: send 'Authorization: Bearer <token>' or log in")
    client = websocket.client.host if websocket.client else "unknown"
    return replace(principal, source=client)


async def _refuse(websocket: WebSocket, status: int, message: str) -> None:
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await websocket.send_text(json.dumps({"error": message, "status": status}))
        await websocket.close(code=4000 + status, reason=message[:120])


async def _stream(websocket: WebSocket, proc: SandboxProcess) -> None:
    """Client input to the process and its output to the client, until it exits."""
    inbound = asyncio.ensure_future(_from_client(websocket, proc))
    try:
        while (item := await proc.read()) is not None:
            channel, data = item
            await websocket.send_bytes(bytes([channel]) + data)
        code = await proc.wait()
        await websocket.send_text(json.dumps({"exit": code}))
        await websocket.close()
    except (WebSocketDisconnect, RuntimeError):
        pass
    finally:
        inbound.cancel()
        proc.kill()


async def _from_client(websocket: WebSocket, proc: SandboxProcess) -> None:
    while True:
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            proc.kill()
            return
        data = message.get("bytes")
        if data:
            if data[0] == STDIN:
                await proc.write(data[1:])
            continue
        text = message.get("text")
        if not text:
            continue
        try:
            control = json.loads(text)
        except ValueError:
            continue
        if isinstance(control, dict) and control.get("eof"):
            proc.close_stdin()
        resize = control.get("resize") if isinstance(control, dict) else None
        if isinstance(resize, list) and len(resize) == 2 and all(isinstance(n, int) for n in resize):
            proc.resize(resize[0], resize[1])
