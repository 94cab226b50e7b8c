"""The portal's session cookie over https is `__Host-corral_session` (Secure, Path=/, no Domain),
which a sibling host or a plain-http answer for the host cannot plant or overwrite; a plain
`corral_session` is then no credential, however valid its secret. Over plain http (the demo) the
cookie is `corral_session`, as before. https is the request's own scheme (Corral's TLS, or a
proxy trusted for X-Forwarded-Proto: the test client's `https://` base URL) or CORRAL_PUBLIC_URL's
(a TLS proxy not trusted for it). On the real app and database (SQLite and PostgreSQL)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from corral.api.app import create_app
from corral.api.limits import caller_key
from corral.config import Settings
from corral.db.models import WebSession
from corral.services import auth
from corral.workspaces import proxy
from corral.workspaces.endpoint import Upstream
from corral.workspaces.origin import HANDOFF_BEGIN_PATH, TICKET_PATH
from tests.api import test_workspace_origin as origin_tests
from tests.api.conftest import ALICE_PASSWORD, World
from tests.api.test_workspace_origin import portal_session, running_workspace

jupyter, lab = origin_tests.jupyter, origin_tests.lab  # its fixtures: JupyterLab's stand-in, its listener

API = "/api/v1"
PREFIXED, PLAIN = "__Host-corral_session", "corral_session"
LOGIN = {"username": "alice", "password": ALICE_PASSWORD}


@pytest.fixture
def https(world: World) -> Iterator[TestClient]:
    """The portal reached over https (its scope's scheme), on the world's app and database."""
    with TestClient(world.client.app, base_url="https://testserver") as client:
        yield client


def set_cookie(answer: Any) -> tuple[str, str, dict[str, str]]:
    """The name, value and attributes (lower-case names) of the answer's one Set-Cookie."""
    (header,) = answer.headers.get_list("set-cookie")
    name_value, *attributes = [part.strip() for part in header.split(";")]
    name, _, value = name_value.partition("=")
    return name, value, {a.split("=")[0].lower(): a.partition("=")[2] for a in attributes}


def test_a_login_over_https_sets_the_host_prefixed_cookie(
    world: World, https: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    r = https.post(f"{API}/auth/login", json=LOGIN)
    https.cookies.clear()
    assert r.status_code == 200, r.text
    name, value, flags = set_cookie(r)
    assert name == PREFIXED and value, r.headers
    assert flags["path"] == "/" and "secure" in flags and "domain" not in flags, flags
    assert "httponly" in flags and flags["samesite"].lower() == "lax", flags
    assert https.get(f"{API}/me", headers={"Cookie": f"{PREFIXED}={value}"}).json()["name"] == "alice"
    plain = world.client.post(f"{API}/auth/login", json=LOGIN)
    world.client.cookies.clear()
    name, value, flags = set_cookie(plain)
    assert name == PLAIN and value and flags["path"] == "/" and "secure" not in flags, plain.headers
    # Behind a TLS proxy not trusted for X-Forwarded-Proto the request looks plain: the public
    # address says https.
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "https://corral.example.org")
    proxied = world.client.post(f"{API}/auth/login", json=LOGIN)
    world.client.cookies.clear()
    name, value, flags = set_cookie(proxied)
    assert name == PREFIXED and value and "secure" in flags and flags["path"] == "/", proxied.headers
    # review120 #3: a browser on plain http would drop that Secure cookie and be sent back to the
    # login page after each "successful" login: refused, saying where to log in; nothing made
    sessions_before = _session_count(world)
    on_http = world.client.post(f"{API}/auth/login", json=LOGIN, headers={"Origin": "http://testserver"})
    assert on_http.status_code == 403 and "set-cookie" not in on_http.headers, on_http.text
    assert "for https only (CORRAL_PUBLIC_URL is https://corral.example.org)" in on_http.json()["detail"]
    assert _session_count(world) == sessions_before
    # behind the TLS proxy the browser's Origin is https: logged in as above
    via_proxy = world.client.post(
        f"{API}/auth/login", json=LOGIN, headers={"Origin": "https://corral.example.org"}
    )
    world.client.cookies.clear()
    assert via_proxy.status_code == 200 and set_cookie(via_proxy)[0] == PREFIXED, via_proxy.text


def _session_count(world: World) -> int:
    with world.session_factory() as db:
        return int(db.scalar(sa.select(sa.func.count()).select_from(WebSession)) or 0)


@pytest.mark.usefixtures("lab")  # (JupyterLab's stand-in: the workspace is running)
def test_a_plain_named_session_cookie_is_refused_over_https(
    world: World, https: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone able to set a cookie for the host (a sibling host's `Domain=`, a plain-http answer
    on the network path) can plant `corral_session` of an account of theirs: over https it is no
    credential, on the API, the session list, or the portal's `/ws/` and its handoff's ticket."""
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    planted, own = {"Cookie": f"{PLAIN}={secret}"}, {"Cookie": f"{PREFIXED}={secret}"}
    assert https.get(f"{API}/me", headers=planted).status_code == 401
    assert https.get(f"{API}/sessions", headers=planted).status_code == 401
    assert https.get(f"{API}/me", headers=own).json()["name"] == "alice"
    sessions = https.get(f"{API}/sessions", headers=own).json()
    assert [s["current"] for s in sessions] == [True], sessions
    # Over http, the other way round (a browser never sends a Secure cookie there).
    assert world.client.get(f"{API}/me", headers=planted).json()["name"] == "alice"
    assert world.client.get(f"{API}/me", headers=own).status_code == 401
    lab_path, state = f"/ws/{ws_id}/lab", "d" * 64
    # (over https the handoff needs a workspace origin of its own: review126 #1)
    settings: Settings = world.client.app.state.settings  # type: ignore[attr-defined]
    monkeypatch.setattr(settings, "workspace_origin", "https://corral-ws.example.net")
    to_login = https.get(lab_path, headers=planted, follow_redirects=False)
    assert to_login.status_code == 302 and to_login.headers["location"] == f"/login?next={lab_path}"
    handed = https.get(lab_path, headers=own, follow_redirects=False)
    assert handed.status_code == 303 and HANDOFF_BEGIN_PATH in handed.headers["location"], handed.text
    ticket = {"to": lab_path, "state": state}
    no_ticket = https.get(TICKET_PATH, params=ticket, headers=planted, follow_redirects=False)
    assert no_ticket.status_code == 302 and no_ticket.headers["location"] == f"/login?next={lab_path}"
    issued = https.get(TICKET_PATH, params=ticket, headers=own, follow_redirects=False)
    assert issued.status_code == 303 and "ticket=" in issued.headers["location"], issued.text
    # CORRAL_PUBLIC_URL https: the same on a request that looks plain.
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "https://corral.example.org")
    assert world.client.get(f"{API}/me", headers=planted).status_code == 401
    assert world.client.get(f"{API}/me", headers=own).json()["name"] == "alice"


def test_a_logout_clears_the_cookie_that_fits_the_request(world: World, https: TestClient) -> None:
    for client, name, secure in ((https, PREFIXED, True), (world.client, PLAIN, False)):
        secret = portal_session(world, "alice")
        jar = {"Cookie": f"{name}={secret}"}
        csrf = client.get(f"{API}/auth/csrf", headers=jar).json()["csrf_token"]
        out = client.post(f"{API}/auth/logout", headers={**jar, "X-CSRF-Token": csrf})
        client.cookies.clear()
        assert out.status_code == 204, out.text
        cleared, value, flags = set_cookie(out)
        assert cleared == name and value in ("", '""') and flags["max-age"] == "0", out.headers
        # A `__Host-` cookie's deletion needs Secure and Path=/ too, or the browser ignores it.
        assert flags["path"] == "/" and ("secure" in flags) is secure, flags
        assert client.get(f"{API}/me", headers=jar).status_code == 401  # the session ended
        with world.session_factory() as db:
            assert db.get(WebSession, auth.sha256_hex(secret)) is None


def test_the_rate_limits_count_the_cookie_that_fits_the_request() -> None:
    both = [(b"cookie", b"__Host-corral_session=over-https; corral_session=over-http; x=1")]

    def key(scheme: str, headers: list[tuple[bytes, bytes]]) -> str:
        scope = {"type": "http", "scheme": scheme, "headers": headers, "client": ("192.0.2.1", 5)}
        return caller_key(scope, per_address=False)

    assert key("https", both) == "cred:" + auth.sha256_hex("over-https")
    assert key("http", both) == "cred:" + auth.sha256_hex("over-http")  # not the one inside the other's name
    assert key("https", [(b"cookie", b"corral_session=planted")]) == "addr:192.0.2.1"
    # review120 #1: every Cookie header, as the session lookup reads them (the last one wins
    # there): a random cookie in a first header does not buy a fresh bucket per request
    two = [(b"cookie", b"__Host-corral_session=random-1"), (b"cookie", b"__Host-corral_session=real")]
    assert key("https", two) == "cred:" + auth.sha256_hex("real")
    # a token as authentication reads it: any case of the scheme, blanks around it dropped
    token_keys = {
        key("https", [(b"authorization", spelling)])
        for spelling in (b"Bearer X", b"bearer X", b"Bearer  X", b"Bearer X ")
    }
    assert token_keys == {"cred:" + auth.sha256_hex("X")}
    # an empty Authorization header is none to authentication (the cookie decides): so here too
    # (review121 #3: it keyed by address, a fresh bucket per source address for one session)
    empty = [(b"authorization", b""), (b"cookie", b"corral_session=S")]
    assert key("http", empty) == "cred:" + auth.sha256_hex("S")


def test_the_proxy_passes_neither_session_cookie_to_the_lab(world: World, lab: TestClient) -> None:
    ws_id = running_workspace(world, "nb")
    jar = f"{PLAIN}=a; {PREFIXED}=b; _xsrf=x1"
    r = lab.get(f"/ws/{ws_id}/api/status", headers={**world.as_("alice"), "Cookie": jar})
    assert r.status_code == 200 and r.json()["cookie"] == "_xsrf=x1", r.text


def test_with_the_workspace_port_off_the_lab_takes_the_prefixed_cookie_over_https(
    world: World, jupyter: str, monkeypatch: pytest.MonkeyPatch, db_engine: sa.Engine, tmp_path: Path
) -> None:
    """CORRAL_WORKSPACE_PORT=0: JupyterLab on the portal's origin, with the portal's cookie, the
    name that fits the request there too."""
    monkeypatch.setattr(proxy, "jupyter_upstream", lambda *_: Upstream(socket=jupyter))
    proxy._decisions.clear()
    ws_id = running_workspace(world, "nb")
    secret = portal_session(world, "alice")
    settings = Settings(home=tmp_path / "home", database_url="sqlite:///unused", workspace_port=0)
    with TestClient(create_app(settings, db_engine=db_engine), base_url="https://testserver") as shared:
        own = shared.get(f"/ws/{ws_id}/lab", headers={"Cookie": f"{PREFIXED}={secret}; _xsrf=x1"})
        assert own.status_code == 200 and own.json()["cookie"] == "_xsrf=x1", own.text
        planted = shared.get(
            f"/ws/{ws_id}/lab", headers={"Cookie": f"{PLAIN}={secret}"}, follow_redirects=False
        )
        assert planted.status_code == 302 and planted.headers["location"] == f"/login?next=/ws/{ws_id}/lab"
    proxy._decisions.clear()


def test_the_https_only_login_refusal_names_an_address_only_when_it_is_an_https_one(
    https: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review122 #4: with https from Corral's own TLS and CORRAL_PUBLIC_URL http://..., the refusal
    sent the browser to that plain-http address, the very one it refuses."""
    monkeypatch.setenv("CORRAL_PUBLIC_URL", "http://corral.example.org")
    r = https.post(f"{API}/auth/login", json=LOGIN, headers={"Origin": "http://corral.example.org"})
    assert r.status_code == 403 and "set-cookie" not in r.headers, r.text
    assert r.json()["detail"] == (
        "login refused: this portal's sessions are for https only; log in at its https address, "
        "not over plain http"
    )
