"""Workspaces on their own origin (corral.workspaces.origin, corral.services.workspace_passes), on
the real app and database (SQLite and PostgreSQL): the portal listener (the test client's port,
80) hands its owner over with a one-time ticket; the workspace listener (CORRAL_WORKSPACE_PORT,
8081 here: the portal's 8080 + 1) exchanges it for its own cookie, serves the proxy and nothing
of the API's, and accepts neither the portal's cookie nor another workspace's. JupyterLab is a
`websockets` server on a Unix socket (HTTP answered by process_request), in place of the
attempt's endpoint (the rest of the proxy's decision is real: sessions, owner, running attempt).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from websockets.asyncio.server import ServerConnection
from websockets.http11 import Request as WsRequest
from websockets.http11 import Response as WsResponse

from corral.api.app import create_app
from corral.config import Settings
from corral.db.models import Node, User, WebSession
from corral.db.workspace_models import WorkspacePass
from corral.server.context import LoopMemory, ServerContext
from corral.server.retention import purge_expired_sessions
from corral.services import auth, workspace_passes
from corral.workspaces import proxy
from corral.workspaces.endpoint import Upstream
from corral.workspaces.jupyter_auth import HEADER
from corral.workspaces.origin import (
    HANDOFF_BEGIN_PATH,
    HANDOFF_PATH,
    STATE_COOKIE_PREFIX,
    STATE_COOKIES_KEPT,
    TICKET_PATH,
    WORKSPACE_COOKIE,
)
from tests.api.conftest import ALICE_PASSWORD, World, alice_password_hash
from tests.api.helpers import add_node, make_running
from tests.workspaces.unix_ws import serve_on_unix

API = "/api/v1"
WS_LISTENER = "http://testserver:8081"  # the settings' port 8080 + 1
PORTAL_ORIGIN = "http://testserver"  # the test client's own (port 80): the portal listener


LAB_SET_COOKIES = (
    "_xsrf=lab-own; Path=/",  # JupyterLab's own: passed on
    "__Host-corral_ws_99=planted; Path=/; Secure",  # Corral's: another workspace's cookie
    "corral_workspace=planted; Path=/ws/99/",
    "corral_handoff_0123456789abcdef=planted; Path=/corral-handoff",
    "corral_session=planted; Path=/",
    "__Host-corral_session=planted; Path=/; Secure",  # the portal's, over https
)


@pytest.fixture
def jupyter(tmp_path: Path) -> Iterator[str]:
    """JupyterLab's stand-in on a Unix socket: an HTTP request is answered with what arrived
    (path, cookies, the proxy's credential) as JSON; a WebSocket with its path, then an echo."""

    def answer_http(connection: ServerConnection, request: WsRequest) -> WsResponse | None:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return None
        seen = {
            "path": request.path,
            "cookie": request.headers.get("Cookie", ""),
            "credential": request.headers.get(HEADER, ""),
        }
        answer = connection.respond(HTTPStatus.OK, json.dumps(seen))
        if request.path.endswith("/set-cookies"):  # what the owner's code in the lab may answer
            for cookie in LAB_SET_COOKIES:
                answer.headers["Set-Cookie"] = cookie
        return answer

    async def answer_ws(connection: ServerConnection) -> None:
        await connection.send(connection.request.path if connection.request else "")
        async for message in connection:
            await connection.send(message)

    yield from serve_on_unix(str(tmp_path / "jupyter.sock"), answer_ws, process_request=answer_http)


@pytest.fixture
def lab(world: World, jupyter: str, monkeypatch: Any) -> Iterator[TestClient]:
    """The workspace listener's client; the proxy's JupyterLab endpoint is `jupyter`."""
    monkeypatch.setattr(proxy, "jupyter_upstream", lambda *_: Upstream(socket=jupyter))
    proxy._decisions.clear()
    settings: Settings = world.client.app.state.settings  # type: ignore[attr-defined]
    assert settings.workspace_listen_port == 8081
    client = TestClient(world.client.app, base_url=WS_LISTENER)
    yield client
    proxy._decisions.clear()


def running_workspace(world: World, name: str, user: str = "alice", gpu: int = 0) -> int:
    """A workspace of `user` whose job has a running attempt (on GPU `gpu` of node n1); its id."""
    with world.session_factory() as db:
        if db.get(Node, "n1") is None:
            add_node(db)
            db.commit()
    created = world.client.post(f"{API}/workspaces", json={"name": name}, headers=world.as_(user))
    assert created.status_code == 201, created.text
    with world.session_factory() as db:
        make_running(db, created.json()["job_id"], gpu_indices=(gpu,))
    return int(created.json()["id"])


def portal_session(world: World, user: str) -> str:
    """A portal session's cookie secret for `user` (logged in with a password, as the portal does)."""
    with world.session_factory() as db:
        account = db.scalar(sa.select(User).where(User.name == user))
        assert account is not None
        account.password_hash = alice_password_hash()
        secret, _user, _csrf = auth.login(db, user, ALICE_PASSWORD)
        db.commit()
    return secret


PORTAL_URL = "http://testserver:8080"  # the portal as the workspace listener links to it


@dataclass(frozen=True)
class Handoff:
    ticket: str
    state: str  # `name=value` of the state cookie the workspace origin set in the browser


def ticket_of(world: World, lab: TestClient, secret: str, path: str) -> Handoff:
    """The handoff of the portal's `path` for the owner: the portal sends her browser to the
    workspace origin's begin, which sets a state cookie there and sends her back to the portal
    for a ticket bound to it, and on to the workspace listener's redeem with it."""
    jar = {"Cookie": f"corral_session={secret}"}
    tickets = sa.select(sa.func.count()).select_from(WorkspacePass).where(WorkspacePass.kind == "ticket")
    with world.session_factory() as db:
        before = db.scalar(tickets)
    r = world.client.get(path, headers=jar, follow_redirects=False)
    assert r.status_code == 303, r.text
    begin_prefix = f"{WS_LISTENER}{HANDOFF_BEGIN_PATH}?to="
    assert r.headers["location"].startswith(begin_prefix), r.headers
    assert r.headers["cache-control"] == "no-store" and r.headers["x-frame-options"] == "DENY"
    with world.session_factory() as db:  # nothing is issued before the browser has its state
        assert db.scalar(tickets) == before
    begin = lab.get(r.headers["location"][len(WS_LISTENER) :], follow_redirects=False)
    lab.cookies.clear()  # (every cookie is sent by hand: the test client's jar would mix them)
    assert begin.status_code == 303, begin.text
    assert begin.headers["location"].startswith(f"{PORTAL_URL}{TICKET_PATH}?to="), begin.headers
    assert begin.headers["content-security-policy"] == "frame-ancestors 'none'"
    name_value, *attributes = [part.strip() for part in begin.headers["set-cookie"].split(";")]
    name, _, value = name_value.partition("=")
    flags = {a.split("=")[0].lower(): a.partition("=")[2] for a in attributes}
    assert name.startswith(STATE_COOKIE_PREFIX) and value, name_value
    assert flags["path"] == HANDOFF_PATH and flags["max-age"] == "60" and "httponly" in flags, flags
    back = world.client.get(begin.headers["location"][len(PORTAL_URL) :], headers=jar, follow_redirects=False)
    assert back.status_code == 303, back.text
    prefix = f"{WS_LISTENER}{HANDOFF_PATH}?ticket="
    assert back.headers["location"].startswith(prefix), back.headers
    assert back.headers["cache-control"] == "no-store" and back.headers["x-frame-options"] == "DENY"
    return Handoff(back.headers["location"][len(prefix) :], f"{name}={value}")


def redeem(lab: TestClient, ticket: str, cookies: str = "", **headers: str) -> Any:
    """The workspace listener's redeem of `ticket` in a browser sending `cookies`."""
    answer = lab.get(
        f"{HANDOFF_PATH}?ticket={ticket}", headers={"Cookie": cookies, **headers}, follow_redirects=False
    )
    lab.cookies.clear()
    return answer


def cookie_of(lab: TestClient, handoff: Handoff, expected_path: str, ws_id: int) -> str:
    """The workspace origin's cookie the ticket is exchanged for (in the browser that has its
    state cookie; which is deleted)."""
    r = redeem(lab, handoff.ticket, handoff.state)
    assert r.status_code == 303, r.text
    assert r.headers["location"] == expected_path
    assert r.headers["x-frame-options"] == "DENY"
    set_cookies = r.headers.get_list("set-cookie")
    name_value, *attributes = [part.strip() for part in set_cookies[0].split(";")]
    name, _, value = name_value.partition("=")
    assert name == WORKSPACE_COOKIE and value, set_cookies
    flags = {a.split("=")[0].lower(): a.partition("=")[2] for a in attributes}
    assert flags["path"] == f"/ws/{ws_id}/" and "httponly" in flags, set_cookies
    assert flags["samesite"].lower() == "lax" and "secure" not in flags, set_cookies  # http here
    state_name = handoff.state.partition("=")[0]
    assert any(c.startswith(f'{state_name}=""') and "Max-Age=0" in c for c in set_cookies[1:]), set_cookies
    return value


def test_the_owner_is_handed_over_with_a_ticket_that_opens_her_lab_once(
    world: World, lab: TestClient
) -> None:
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    handoff = ticket_of(world, lab, secret, f"/ws/{ws_id}/lab?reset")
    with world.session_factory() as db:  # only its hash is stored, and its state's
        stored = db.execute(sa.select(WorkspacePass.id_hash, WorkspacePass.state_hash)).all()
    assert stored == [(auth.sha256_hex(handoff.ticket), auth.sha256_hex(handoff.state.partition("=")[2]))]
    cookie = cookie_of(lab, handoff, f"/ws/{ws_id}/lab?reset", ws_id)
    # The lab through the workspace listener: JupyterLab gets its own cookies only.
    jar = f"corral_session={secret}; {WORKSPACE_COOKIE}={cookie}; _xsrf=x1"
    r = lab.get(f"/ws/{ws_id}/lab?reset", headers={"Cookie": jar})
    assert r.status_code == 200, r.text
    seen = r.json()
    assert seen["path"] == f"/ws/{ws_id}/lab?reset"
    assert seen["cookie"] == "_xsrf=x1" and seen["credential"], seen
    # A second handoff (another tab) replaces the cookie: one row per session and workspace.
    newer = cookie_of(lab, ticket_of(world, lab, secret, f"/ws/{ws_id}/tree"), f"/ws/{ws_id}/tree", ws_id)
    with world.session_factory() as db:
        rows = db.execute(sa.select(WorkspacePass.kind, WorkspacePass.id_hash)).all()
    assert rows == [("cookie", auth.sha256_hex(newer))], rows
    again = redeem(lab, handoff.ticket, handoff.state)
    assert again.status_code == 403 and WORKSPACE_COOKIE not in again.headers.get("set-cookie", ""), (
        again.text
    )
    assert again.json()["detail"] == (
        "this link to a workspace has expired or was used already; open the workspace from the portal again"
    )


def test_a_ticket_minted_by_one_user_is_refused_in_another_users_browser(
    world: World, lab: TestClient
) -> None:
    """Login CSRF: Mallory (bob) mints a ticket for her workspace and has Alice's browser open its
    link. Alice's browser holds her portal cookie and perhaps a state cookie of her own, but not
    Mallory's state: refused, no workspace cookie, and the ticket is spent."""
    malloryws = running_workspace(world, "trap", user="bob")
    alices_ws = running_workspace(world, "nb", gpu=1)
    bob = portal_session(world, "bob")
    alice = portal_session(world, "alice")
    her_own = ticket_of(world, lab, alice, f"/ws/{alices_ws}/lab")  # a state cookie of hers
    not_this_browser = (
        "this link to a workspace was not issued to this browser; open the workspace from the portal"
    )
    for jar in (
        f"corral_session={alice}",  # no state cookie
        f"corral_session={alice}; {her_own.state}",  # a state of her own, not the ticket's
        "{name}=guessed",  # the ticket's state cookie's name, another secret
    ):
        mallory = ticket_of(world, lab, bob, f"/ws/{malloryws}/lab")
        jar = jar.format(name=mallory.state.partition("=")[0])
        r = redeem(lab, mallory.ticket, jar, Accept="application/json")
        assert r.status_code == 403 and r.json()["detail"] == not_this_browser, (jar, r.text)
        assert WORKSPACE_COOKIE not in r.headers.get("set-cookie", ""), r.headers
        # Spent by the refusal: Mallory cannot try it again either.
        again = redeem(lab, mallory.ticket, mallory.state, Accept="application/json")
        assert again.status_code == 403 and again.json()["detail"].endswith(
            "was used already; open the workspace from the portal again"
        )
    with world.session_factory() as db:
        kinds = db.execute(sa.select(WorkspacePass.workspace_id, WorkspacePass.kind)).all()
    assert kinds == [(alices_ws, "ticket")], kinds
    # Alice's own handoff still works in her browser.
    cookie_of(lab, her_own, f"/ws/{alices_ws}/lab", alices_ws)


def test_the_handoffs_steps_refuse_frames_scripts_strangers_and_bad_input(
    world: World, lab: TestClient
) -> None:
    ws_id = running_workspace(world, "nb")
    alice, bob = portal_session(world, "alice"), portal_session(world, "bob")
    to = f"/ws/{ws_id}/lab"
    state = "a" * 64
    framed = {"Sec-Fetch-Mode": "navigate", "Sec-Fetch-Dest": "iframe", "Accept": "application/json"}
    served_at = f"workspace {ws_id} is served at {WS_LISTENER}/ws/{ws_id}/, not on the portal"
    for client, path, cookie in (
        (world.client, to, alice),
        (lab, f"{HANDOFF_BEGIN_PATH}?to={to}", ""),
        (world.client, f"{TICKET_PATH}?to={to}&state={state}", alice),
    ):
        r = client.get(path, headers={**framed, "Cookie": f"corral_session={cookie}"}, follow_redirects=False)
        assert r.status_code == 403 and r.json()["detail"] == served_at, (path, r.text)
        assert "set-cookie" not in r.headers, path
    not_under = "is not a path under /ws/<id>/ (a workspace's id: 1, 2, ...)"
    a_host = "names a scheme or a host: the destination is a path on the workspace origin"
    for bad, why in {
        "/ws/0/lab": not_under,
        "/ws/1x/lab": not_under,
        "/api/v1/me": not_under,
        f"/ws/{ws_id}/a b": "holds a space, a control character or a non-ASCII one: a link comes escaped",
        "https://evil.example/ws/1/": a_host,
    }.items():
        r = lab.get(HANDOFF_BEGIN_PATH, params={"to": bad}, follow_redirects=False)
        assert r.status_code == 400 and "set-cookie" not in r.headers, (bad, r.text)
        assert (
            r.json()["detail"]
            == f"{HANDOFF_BEGIN_PATH} takes ?to=/ws/<id>/... from the portal: {bad!r} {why}"
        )
    ticket = world.client.get
    for bad_state in ("", "A" * 64, "a" * 63):
        r = ticket(
            TICKET_PATH, params={"to": to, "state": bad_state}, headers={"Cookie": f"corral_session={alice}"}
        )
        assert r.status_code == 400, (bad_state, r.text)
    stranger = ticket(
        TICKET_PATH,
        params={"to": to, "state": state},
        headers={"Cookie": f"corral_session={bob}"},
        follow_redirects=False,
    )
    assert stranger.status_code == 404 and stranger.json()["detail"] == f"there is no workspace {ws_id}"
    nobody = ticket(TICKET_PATH, params={"to": to + "?x=1", "state": state}, follow_redirects=False)
    assert nobody.status_code == 302 and nobody.headers["location"] == f"/login?next=/ws/{ws_id}/lab"
    bearer = ticket(
        TICKET_PATH, params={"to": to, "state": state}, headers=world.as_("alice"), follow_redirects=False
    )
    assert bearer.status_code == 302, bearer.text  # a token is no credential for a ticket
    with world.session_factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(WorkspacePass)) == 0


def test_the_handoff_goes_to_the_workspace_asked_for_only(world: World, lab: TestClient) -> None:
    """The ticket's destination is the path under the workspace decided on (an id spelled
    `%31` is that workspace's path again); one too long to keep is refused, not cut; the handoff
    is spent by GET only (a HEAD, such as a link preview's, leaves it)."""
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    escaped_id = "".join(f"%{ord(digit):02X}" for digit in str(ws_id))  # 1 -> %31
    handoff = ticket_of(world, lab, secret, f"/ws/{escaped_id}/lab?x=%2F")
    assert (
        lab.head(f"{HANDOFF_PATH}?ticket={handoff.ticket}", headers={"Cookie": handoff.state}).status_code
        == 405
    )
    cookie_of(lab, handoff, f"/ws/{ws_id}/lab?x=%2F", ws_id)
    long = world.client.get(
        f"/ws/{ws_id}/lab?" + "a" * 3000,
        headers={"Cookie": f"corral_session={secret}", "Accept": "application/json"},
        follow_redirects=False,
    )
    assert long.status_code == 414, long.text
    assert long.json()["detail"] == (
        "the address is longer than the 2048 characters a workspace link may have; "
        f"open {WS_LISTENER}/ws/{ws_id}/lab"
    )


def test_the_begin_expires_older_state_cookies_beyond_a_few(world: World, lab: TestClient) -> None:
    """A page looping the begin in a popup must not pile state cookies up in the browser: the
    begin keeps the newest STATE_COOKIES_KEPT - 1 it is sent (oldest first), plus its own."""
    held = [f"{STATE_COOKIE_PREFIX}{n:016x}" for n in range(STATE_COOKIES_KEPT + 2)]
    jar = "; ".join([f"{name}=s{n}" for n, name in enumerate(held)] + ["_xsrf=x1"])
    begin = lab.get(f"{HANDOFF_BEGIN_PATH}?to=/ws/1/lab", headers={"Cookie": jar}, follow_redirects=False)
    lab.cookies.clear()
    assert begin.status_code == 303, begin.text
    set_cookies = begin.headers.get_list("set-cookie")
    expired = [c.partition("=")[0] for c in set_cookies if "Max-Age=0" in c]
    assert expired == held[:3], set_cookies  # 6 sent: the 3 oldest go, 3 stay with the new one
    assert all(f"Path={HANDOFF_PATH}" in c for c in set_cookies), set_cookies
    (fresh,) = [c for c in set_cookies if "Max-Age=60" in c]
    assert fresh.startswith(STATE_COOKIE_PREFIX) and fresh.partition("=")[0] not in held, fresh
    few = lab.get(
        f"{HANDOFF_BEGIN_PATH}?to=/ws/1/lab", headers={"Cookie": f"{held[0]}=s0"}, follow_redirects=False
    )
    lab.cookies.clear()
    assert [c for c in few.headers.get_list("set-cookie") if "Max-Age=0" in c] == [], few.headers


def test_a_ticket_past_its_expiry_is_refused(world: World, lab: TestClient) -> None:
    ws_id = running_workspace(world, "nb")
    handoff = ticket_of(world, lab, portal_session(world, "alice"), f"/ws/{ws_id}/lab")
    with world.session_factory() as db:
        db.execute(sa.update(WorkspacePass).values(expires_at=time.time() - 1))
        db.commit()
    r = redeem(lab, handoff.ticket, handoff.state, Accept="text/html")
    assert r.status_code == 403 and WORKSPACE_COOKIE not in r.headers.get("set-cookie", ""), r.text
    # The page links to the portal's workspaces, at the portal's address (not this listener's).
    assert '<a href="http://testserver:8080/workspaces">' in r.text, r.text
    for wrong in ("", "x" * 200, "not-a-ticket"):
        assert lab.get(f"{HANDOFF_PATH}?ticket={wrong}", follow_redirects=False).status_code == 403


def test_a_workspace_cookie_opens_its_own_workspace_only(world: World, lab: TestClient) -> None:
    first, second = running_workspace(world, "one"), running_workspace(world, "two", gpu=1)
    secret = portal_session(world, "alice")
    cookie = cookie_of(lab, ticket_of(world, lab, secret, f"/ws/{first}/lab"), f"/ws/{first}/lab", first)
    own = lab.get(f"/ws/{first}/api/status", headers={"Cookie": f"{WORKSPACE_COOKIE}={cookie}"})
    assert own.status_code == 200, own.text
    jar = {"Cookie": f"{WORKSPACE_COOKIE}={cookie}"}
    other = lab.get(
        f"/ws/{second}/api/status", headers={**jar, "Accept": "text/html"}, follow_redirects=False
    )
    # Not a credential there: a browser back to the portal, which hands over to that workspace
    # afresh; a script or an API client gets a 401 saying so.
    assert other.status_code == 302, other.text
    scripted = lab.get(f"/ws/{second}/api/status", headers=jar, follow_redirects=False)
    message = proxy.no_credential(str(second))
    assert scripted.status_code == 401 and scripted.json() == {"detail": message, "message": message}
    assert scripted.headers["www-authenticate"] == "Bearer"
    assert other.headers["location"] == f"http://testserver:8080/ws/{second}/api/status"


def test_another_user_gets_no_ticket_and_a_logout_ends_the_workspace_cookie(
    world: World, lab: TestClient
) -> None:
    ws_id = running_workspace(world, "nb")
    bobs = portal_session(world, "bob")
    r = world.client.get(
        f"/ws/{ws_id}/lab", headers={"Cookie": f"corral_session={bobs}"}, follow_redirects=False
    )
    assert r.status_code == 404 and r.json()["detail"] == f"there is no workspace {ws_id}", r.text
    with world.session_factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(WorkspacePass)) == 0
    secret = portal_session(world, "alice")
    # The owner's cookie without a navigation (a script's fetch, a POST): no ticket, a refusal
    # naming where the workspace is served.
    for method, mode in (("GET", "cors"), ("POST", "navigate"), ("PUT", None)):
        headers = {"Cookie": f"corral_session={secret}", **({"Sec-Fetch-Mode": mode} if mode else {})}
        r = world.client.request(method, f"/ws/{ws_id}/api/contents", headers=headers, follow_redirects=False)
        assert r.status_code == 403, (method, mode, r.text)
        assert (
            r.json()["detail"]
            == f"workspace {ws_id} is served at {WS_LISTENER}/ws/{ws_id}/, not on the portal"
        )
    with world.session_factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(WorkspacePass)) == 0
    cookie = cookie_of(lab, ticket_of(world, lab, secret, f"/ws/{ws_id}/lab"), f"/ws/{ws_id}/lab", ws_id)
    logout = world.client.post(
        f"{API}/auth/logout",
        headers={"Cookie": f"corral_session={secret}", "X-CSRF-Token": csrf_of(world, secret)},
    )
    assert logout.status_code == 204, logout.text
    after = lab.get(
        f"/ws/{ws_id}/lab",
        headers={"Cookie": f"{WORKSPACE_COOKIE}={cookie}", "Accept": "text/html"},
        follow_redirects=False,
    )
    assert after.status_code == 302 and after.headers["location"].startswith("http://testserver:8080/"), (
        after.text
    )
    with world.session_factory() as db:  # gone with the session
        assert db.scalar(sa.select(sa.func.count()).select_from(WorkspacePass)) == 0


def csrf_of(world: World, secret: str) -> str:
    r = world.client.get(f"{API}/auth/csrf", headers={"Cookie": f"corral_session={secret}"})
    assert r.status_code == 200, r.text
    return str(r.json()["csrf_token"])


def test_the_retention_loop_deletes_expired_sessions_with_their_workspace_cookies(
    world: World, lab: TestClient, tmp_path: Path
) -> None:
    ws_id = running_workspace(world, "nb")
    expired, live = portal_session(world, "alice"), portal_session(world, "alice")
    for secret in (expired, live):
        cookie_of(lab, ticket_of(world, lab, secret, f"/ws/{ws_id}/lab"), f"/ws/{ws_id}/lab", ws_id)
    now = time.time()
    with world.session_factory() as db:
        db.execute(
            sa.update(WebSession)
            .where(WebSession.id_hash == auth.sha256_hex(expired))
            .values(expires_at=now - 1)
        )
        db.commit()
    ctx = cast(
        ServerContext,
        SimpleNamespace(
            settings=Settings(home=tmp_path), session_factory=world.session_factory, memory=LoopMemory()
        ),
    )
    purge_expired_sessions(ctx, now)
    with world.session_factory() as db:
        sessions = db.scalars(sa.select(WebSession.id_hash)).all()
        passes = db.scalars(sa.select(WorkspacePass.session_hash)).all()
    assert auth.sha256_hex(expired) not in sessions and auth.sha256_hex(live) in sessions
    assert passes == [auth.sha256_hex(live)], passes


def test_the_portals_cookie_is_not_accepted_on_the_workspace_listener(world: World, lab: TestClient) -> None:
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    r = lab.get(
        f"/ws/{ws_id}/lab?x=1",
        headers={"Cookie": f"corral_session={secret}", "Accept": "text/html"},
        follow_redirects=False,
    )
    assert r.status_code == 302 and r.headers["location"] == f"http://testserver:8080/ws/{ws_id}/lab?x=1", (
        r.text
    )
    with world.session_factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(WorkspacePass)) == 0


def test_a_cached_decision_is_for_its_kind_of_credential_only(world: World, lab: TestClient) -> None:
    """The portal's decision on its session cookie is cached; the same secret sent within that
    time as a bearer token or as the workspace cookie is still no credential there."""
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    ticket_of(world, lab, secret, f"/ws/{ws_id}/lab")  # a 200 decision for the session, cached
    for headers in ({"Authorization": f"Bearer {secret}"}, {"Cookie": f"{WORKSPACE_COOKIE}={secret}"}):
        r = lab.get(f"/ws/{ws_id}/api/status", headers=headers, follow_redirects=False)
        assert r.status_code == 401 and r.json()["detail"] == proxy.no_credential(str(ws_id)), (
            headers,
            r.text,
        )


def test_a_session_ended_since_the_decision_gets_a_login_not_a_500(world: World, lab: TestClient) -> None:
    """A logout through another server leaves this one's cached decision for up to 2 s: the
    ticket step then sends the browser to log in again."""
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    ticket_of(world, lab, secret, f"/ws/{ws_id}/lab")  # the decision is cached now
    with world.session_factory() as db:
        db.execute(sa.delete(WebSession).where(WebSession.id_hash == auth.sha256_hex(secret)))
        db.commit()
    r = world.client.get(
        TICKET_PATH,
        params={"to": f"/ws/{ws_id}/lab?x=1", "state": "b" * 64},
        headers={"Cookie": f"corral_session={secret}"},
        follow_redirects=False,
    )
    assert r.status_code == 302 and r.headers["location"] == f"/login?next=/ws/{ws_id}/lab", r.text
    with world.session_factory() as db:
        assert db.scalar(sa.select(sa.func.count()).select_from(WorkspacePass)) == 0


def test_the_workspace_cookie_is_not_accepted_by_the_portal(world: World, lab: TestClient) -> None:
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    cookie = cookie_of(lab, ticket_of(world, lab, secret, f"/ws/{ws_id}/lab"), f"/ws/{ws_id}/lab", ws_id)
    only_ws = {"Cookie": f"{WORKSPACE_COOKIE}={cookie}"}
    assert world.client.get(f"{API}/me", headers=only_ws).status_code == 401
    assert world.client.get(f"{API}/jobs", headers=only_ws).status_code == 401
    r = world.client.get(f"/ws/{ws_id}/lab", headers=only_ws, follow_redirects=False)
    assert r.status_code == 302 and r.headers["location"] == f"/login?next=/ws/{ws_id}/lab", r.text


def test_the_workspace_listener_serves_nothing_of_the_api_or_the_portal(
    world: World, lab: TestClient
) -> None:
    admin = world.as_("admin")
    assert world.client.get(f"{API}/me", headers=admin).status_code == 200  # the portal's
    for path in (f"{API}/me", f"{API}/jobs", "/", "/workspaces", "/login", "/docs", "/healthz", "/metrics"):
        r = lab.get(path, headers=admin)
        assert r.status_code == 404, (path, r.status_code, r.text)
        assert r.text.startswith("this address serves workspaces only"), (path, r.text)
    login = lab.post(f"{API}/auth/login", json={"username": "alice", "password": ALICE_PASSWORD})
    assert login.status_code == 404 and "set-cookie" not in login.headers


def test_a_bearer_token_works_on_the_workspace_listener_and_the_portal_sends_it_there(
    world: World, lab: TestClient
) -> None:
    ws_id = running_workspace(world, "nb")
    r = lab.get(f"/ws/{ws_id}/api/status?a=1", headers=world.as_("alice"))
    assert r.status_code == 200 and r.json()["path"] == f"/ws/{ws_id}/api/status?a=1", r.text
    sent = world.client.post(f"/ws/{ws_id}/api/kernels", headers=world.as_("alice"), follow_redirects=False)
    assert sent.status_code == 307 and sent.headers["location"] == f"{WS_LISTENER}/ws/{ws_id}/api/kernels"
    # The client follows without its token (httpx, requests and curl drop it for another port):
    # a 401 saying why, not a redirect chain ending on the portal's login page.
    followed = lab.post(
        f"/ws/{ws_id}/api/kernels", headers={"Accept": "application/json"}, follow_redirects=False
    )
    assert followed.status_code == 401 and followed.json()["detail"] == proxy.no_credential(str(ws_id))
    other = lab.get(f"/ws/{ws_id}/api/status", headers=world.as_("bob"))
    assert other.status_code == 404 and other.json()["detail"] == f"there is no workspace {ws_id}"


def test_the_lab_cannot_set_corrals_own_cookies(world: World, lab: TestClient) -> None:
    """What answers in a workspace is its owner's code: a Set-Cookie of one of Corral's cookies
    (another workspace's, the handoff's state, the portal's session) would plant or clear it in
    the browser on the workspace origin, past what the `__Host-` prefix closes (review118 #4).
    Those are dropped; JupyterLab's own pass."""
    ws_id = running_workspace(world, "nb")
    r = lab.get(f"/ws/{ws_id}/set-cookies", headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    assert r.headers.get_list("set-cookie") == ["_xsrf=lab-own; Path=/"], r.headers


def test_cookie_state_changes_and_websockets_must_come_from_the_workspace_origin(
    world: World, lab: TestClient
) -> None:
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    cookie = cookie_of(lab, ticket_of(world, lab, secret, f"/ws/{ws_id}/lab"), f"/ws/{ws_id}/lab", ws_id)
    jar = f"{WORKSPACE_COOKIE}={cookie}"
    for origin, status in (("http://testserver:8080", 403), (PORTAL_ORIGIN, 403), (WS_LISTENER, 200)):
        r = lab.post(f"/ws/{ws_id}/api/contents", headers={"Cookie": jar, "Origin": origin})
        assert r.status_code == status, (origin, r.text)
    channels = f"/ws/{ws_id}/api/kernels/k1/channels?session_id=s"
    on_lab = "ws://testserver:8081" + channels  # (websocket_connect ignores the client's base URL)
    with lab.websocket_connect(on_lab, headers={"Cookie": jar, "Origin": WS_LISTENER}) as kernel:
        assert kernel.receive_text() == channels
        kernel.send_text("execute_request")
        assert kernel.receive_text() == "execute_request"
    for origin in ("http://testserver:8080", PORTAL_ORIGIN, "http://evil.example"):
        with (
            pytest.raises(WebSocketDisconnect),
            lab.websocket_connect(on_lab, headers={"Cookie": jar, "Origin": origin}),
        ):
            pass
    # The portal's cookie is no credential there, even from the workspace origin.
    with (
        pytest.raises(WebSocketDisconnect),
        lab.websocket_connect(on_lab, headers={"Cookie": f"corral_session={secret}", "Origin": WS_LISTENER}),
    ):
        pass
    # And the portal serves no workspace WebSocket at all, to its own pages either.
    with (
        pytest.raises(WebSocketDisconnect),
        world.client.websocket_connect(
            channels, headers={"Cookie": f"corral_session={secret}", "Origin": PORTAL_ORIGIN}
        ),
    ):
        pass


def test_settings_name_what_is_wrong_with_the_workspace_origin() -> None:
    assert Settings(port=9000).workspace_listen_port == 9001
    assert Settings(port=9000, workspace_port=0).workspace_listen_port == 0
    assert Settings(port=65535, workspace_port=0).workspace_listen_port == 0
    assert Settings(port=65535, workspace_port=8081).workspace_listen_port == 8081
    assert Settings(port=0).workspace_listen_port == 0  # an ephemeral portal port (tests)
    assert (
        Settings(workspace_origin="HTTPS://WS.Example.org:443/").workspace_origin == "https://ws.example.org"
    )
    assert Settings(workspace_origin="http://ws.local:8081").workspace_origin == "http://ws.local:8081"
    cases = {
        "CORRAL_WORKSPACE_ORIGIN: 'ws.example.org' is not an origin": {"workspace_origin": "ws.example.org"},
        "has more than a scheme, host and port": {"workspace_origin": "https://ws.example.org/lab"},
        "CORRAL_WORKSPACE_ORIGIN needs the workspace listener": {
            "workspace_origin": "https://ws.example.org",
            "workspace_port": 0,
        },
        "CORRAL_WORKSPACE_PORT=8080 is the portal's own port": {"port": 8080, "workspace_port": 8080},
        "CORRAL_PORT=65535 leaves no next port for the workspace listener": {"port": 65535},
    }
    for words, values in cases.items():
        with pytest.raises(ValueError, match=words):
            Settings(**values)


def test_the_handoffs_cookies_are_host_prefixed_when_the_workspace_origin_is_https(
    world: World, jupyter: str, monkeypatch: Any, db_engine: sa.Engine, tmp_path: Path
) -> None:
    """Over https the workspace origin's cookies are `__Host-` ones (Secure, Path=/, no Domain),
    which a plain-http answer, a sibling host or another port cannot plant in a browser; the
    workspace's is named per workspace, found by the proxy, and never passed on to JupyterLab.
    Behind a TLS proxy that is not trusted for X-Forwarded-Proto the request looks plain http;
    the cookies follow CORRAL_WORKSPACE_ORIGIN's https all the same."""
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "https://corral.example.org")
    monkeypatch.setattr(proxy, "jupyter_upstream", lambda *_: Upstream(socket=jupyter))
    proxy._decisions.clear()
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    settings = Settings(
        home=tmp_path / "home",
        database_url="sqlite:///unused",
        workspace_port=8081,
        workspace_origin="https://corral-ws.example.net",
    )

    def flags_of(set_cookie: str) -> tuple[str, str, dict[str, str]]:
        name_value, *attributes = [part.strip() for part in set_cookie.split(";")]
        name, _, value = name_value.partition("=")
        return name, value, {a.split("=")[0].lower(): a.partition("=")[2] for a in attributes}

    with TestClient(create_app(settings, db_engine=db_engine), base_url=WS_LISTENER) as behind_tls:
        begin = behind_tls.get(f"{HANDOFF_BEGIN_PATH}?to=/ws/{ws_id}/lab", follow_redirects=False)
        behind_tls.cookies.clear()
        assert begin.status_code == 303, begin.text
        assert begin.headers["location"].startswith(f"https://corral.example.org{TICKET_PATH}?to=")
        name, value, flags = flags_of(begin.headers["set-cookie"])
        assert name.startswith(f"__Host-{STATE_COOKIE_PREFIX}") and value, name
        assert flags["path"] == "/" and "secure" in flags and "domain" not in flags, flags
        state = f"{name}={value}"
        # Older ones are expired on that path and Secure too (a __Host- cookie needs both).
        older = "; ".join(f"__Host-{STATE_COOKIE_PREFIX}{n:016x}=s" for n in range(STATE_COOKIES_KEPT))
        again = behind_tls.get(
            f"{HANDOFF_BEGIN_PATH}?to=/ws/{ws_id}/lab", headers={"Cookie": older}, follow_redirects=False
        )
        behind_tls.cookies.clear()
        (expired,) = [flags_of(c) for c in again.headers.get_list("set-cookie") if "Max-Age=0" in c]
        assert expired[0] == f"__Host-{STATE_COOKIE_PREFIX}{0:016x}", expired
        assert expired[2]["path"] == "/" and "secure" in expired[2], expired
        with world.session_factory() as db:
            state_hash = auth.sha256_hex(value)
            ticket = workspace_passes.issue_ticket(db, secret, ws_id, f"/ws/{ws_id}/lab", state_hash)
        r = behind_tls.get(
            f"{HANDOFF_PATH}?ticket={ticket}", headers={"Cookie": state}, follow_redirects=False
        )
        behind_tls.cookies.clear()
        assert r.status_code == 303, r.text
        set_cookies = r.headers.get_list("set-cookie")
        name, cookie, flags = flags_of(set_cookies[0])
        assert name == f"__Host-corral_ws_{ws_id}" and cookie, set_cookies
        assert flags["path"] == "/" and "secure" in flags and "domain" not in flags, flags
        spent = flags_of(set_cookies[1])
        assert spent[0] == state.partition("=")[0] and spent[2]["max-age"] == "0", set_cookies
        assert spent[2]["path"] == "/" and "secure" in spent[2], set_cookies
        jar = f"{name}={cookie}; {state}; __Host-corral_ws_999={cookie}; _xsrf=x1"
        opened = behind_tls.get(f"/ws/{ws_id}/api/status", headers={"Cookie": jar})
        assert opened.status_code == 200, opened.text
        assert opened.json()["cookie"] == "_xsrf=x1", opened.json()  # none of Corral's passed on
        # The plain name, which anyone able to set a cookie for the host could plant, is no
        # credential over https.
        plain = behind_tls.get(f"/ws/{ws_id}/api/status", headers={"Cookie": f"{WORKSPACE_COOKIE}={cookie}"})
        assert plain.status_code == 401, plain.text
    proxy._decisions.clear()


def test_no_handoff_over_https_to_a_workspace_origin_on_the_portals_host_name(
    world: World, jupyter: str, monkeypatch: Any
) -> None:
    """review126 #1: without CORRAL_WORKSPACE_ORIGIN the workspace origin is derived from the
    request (the portal's host name, the workspace port); over https (Corral's TLS, a trusted TLS
    proxy the start-up check cannot see, CORRAL_PUBLIC_URL https) a workspace's script there could
    set the portal's `__Host-corral_session`. Every step of the handoff refuses, saying what to set;
    plain http (the demo, the other tests here) is handed over as before."""
    monkeypatch.setattr(proxy, "jupyter_upstream", lambda *_: Upstream(socket=jupyter))
    proxy._decisions.clear()
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    html = {"Accept": "text/html"}
    with (
        TestClient(world.client.app, base_url="https://testserver") as portal,
        TestClient(world.client.app, base_url="https://testserver:8081") as listener,
    ):
        own = {"Cookie": f"__Host-corral_session={secret}"}
        steps = {
            "session": portal.get(f"/ws/{ws_id}/lab", headers=own, follow_redirects=False),
            "token": portal.get(f"/ws/{ws_id}/lab", headers=world.as_("alice"), follow_redirects=False),
            "ticket": portal.get(
                TICKET_PATH, params={"to": f"/ws/{ws_id}/lab", "state": "d" * 64}, headers=own,
                follow_redirects=False,
            ),
            "begin": listener.get(f"{HANDOFF_BEGIN_PATH}?to=/ws/{ws_id}/lab", follow_redirects=False),
        }  # fmt: skip
        # review127 #4: a bearer-token client sends no cookie a workspace's script could set: 307
        token = steps.pop("token")
        assert token.status_code == 307, token.text
        assert token.headers["location"] == f"https://testserver:8081/ws/{ws_id}/lab", token.headers
        for step, answer in steps.items():
            assert answer.status_code == 503, (step, answer.status_code, answer.text)
            assert "set CORRAL_WORKSPACE_ORIGIN to a host name of its own" in answer.json()["detail"], step
        page = portal.get(f"/ws/{ws_id}/lab", headers={**own, **html}, follow_redirects=False)
        assert page.status_code == 503 and "set CORRAL_WORKSPACE_ORIGIN to a host name" in page.text
    # A TLS proxy not trusted for X-Forwarded-Proto: the request looks plain, CORRAL_PUBLIC_URL says https.
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "https://testserver")
    proxied = world.client.get(
        f"/ws/{ws_id}/lab", headers={"Cookie": f"__Host-corral_session={secret}"}, follow_redirects=False
    )
    assert proxied.status_code == 503, proxied.text
    monkeypatch.delenv("CORRAL_PUBLIC_URL")
    # review127 #5: nor CORRAL_PUBLIC_URL: only the proxy's header, untrusted, says https; refused
    # rather than handing the browser to plain http on the portal's host name.
    for says_https in ({"X-Forwarded-Proto": "https"}, {"Forwarded": 'for=192.0.2.1;proto="HTTPS"'}):
        untrusted = world.client.get(
            f"/ws/{ws_id}/lab",
            headers={"Cookie": f"corral_session={secret}", **says_https},
            follow_redirects=False,
        )
        assert untrusted.status_code == 503, (says_https, untrusted.text)
        # review128 #1: nor a bearer-token client sent from https down to plain http (its path,
        # query and body would cross in clear)
        token = world.client.get(
            f"/ws/{ws_id}/lab?x=1", headers={**world.as_("alice"), **says_https}, follow_redirects=False
        )
        assert token.status_code == 503, (says_https, token.status_code, token.headers)
        assert "the workspace listener's address is plain http" in token.json()["detail"], token.text
    # review128 #7: a proxy chain's second header line is read too
    two_lines = [
        ("x-forwarded-proto", "http"),
        ("x-forwarded-proto", "https"),
        ("cookie", f"corral_session={secret}"),
    ]
    chained = world.client.get(f"/ws/{ws_id}/lab", headers=two_lines, follow_redirects=False)
    assert chained.status_code == 503, chained.text
    plain_token = world.client.get(f"/ws/{ws_id}/lab", headers=world.as_("alice"), follow_redirects=False)
    assert plain_token.status_code == 307, plain_token.text  # plain http to plain http: sent on
    plain = world.client.get(
        f"/ws/{ws_id}/lab", headers={"Cookie": f"corral_session={secret}"}, follow_redirects=False
    )
    assert plain.status_code == 303 and HANDOFF_BEGIN_PATH in plain.headers["location"], plain.text
    proxy._decisions.clear()


def test_https_answers_of_both_listeners_send_hsts_when_corral_serves_tls(
    db_engine: sa.Engine, tmp_path: Path
) -> None:
    """With CORRAL_SSL_CERTFILE Corral is the TLS end: its https answers, the portal's and the
    workspace listener's, say Strict-Transport-Security; plain http ones and an app behind a
    proxy (which sends its own) do not."""
    tls = {"ssl_certfile": tmp_path / "c.pem", "ssl_keyfile": tmp_path / "k.pem"}
    base = {"home": tmp_path / "home", "database_url": "sqlite:///unused", "workspace_port": 8081}
    with TestClient(create_app(Settings(**base, **tls), db_engine=db_engine)) as client:  # type: ignore[arg-type]
        for url in ("https://testserver/healthz", "https://testserver:8081/nothing"):
            r = client.get(url)
            assert r.headers.get_list("strict-transport-security") == ["max-age=31536000"], (url, r.headers)
        assert "strict-transport-security" not in client.get("http://testserver/healthz").headers
    with TestClient(create_app(Settings(**base), db_engine=db_engine)) as client:  # type: ignore[arg-type]
        assert "strict-transport-security" not in client.get("https://testserver/healthz").headers


def test_with_the_workspace_port_off_the_portal_serves_the_lab_as_before(
    world: World, jupyter: str, monkeypatch: Any, db_engine: sa.Engine, tmp_path: Path
) -> None:
    """CORRAL_WORKSPACE_PORT=0: no handoff; the portal's session cookie opens the lab on the
    portal's origin (the documented risk), its Origin checked against the portal's host."""
    monkeypatch.setattr(proxy, "jupyter_upstream", lambda *_: Upstream(socket=jupyter))
    proxy._decisions.clear()
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    shared = create_app(
        Settings(home=tmp_path / "home", database_url="sqlite:///unused", workspace_port=0),
        db_engine=db_engine,
    )
    with TestClient(shared) as portal:
        jar = {"Cookie": f"corral_session={secret}; _xsrf=x1"}
        r = portal.get(f"/ws/{ws_id}/lab", headers=jar)
        assert r.status_code == 200 and r.json()["cookie"] == "_xsrf=x1", r.text
        own = portal.post(f"/ws/{ws_id}/api/contents", headers={**jar, "Origin": "http://testserver"})
        assert own.status_code == 200, own.text
        other = portal.post(f"/ws/{ws_id}/api/contents", headers={**jar, "Origin": "http://testserver:8081"})
        assert other.status_code == 403, other.text
        assert portal.get(f"{HANDOFF_PATH}?ticket=x").status_code == 404  # no handoff either
    proxy._decisions.clear()
