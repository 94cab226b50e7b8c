"""Chromium through the workspace origin (corral.workspaces.origin): the app served by uvicorn on
two sockets as the server process serves it (the portal's port and CORRAL_WORKSPACE_PORT), a real
database and a real login; JupyterLab's stand-in (a Unix-socket server in place of the attempt's
endpoint) answers `/ws/<id>/lab` with a page whose script tries what a hostile notebook output
would: call the API on its own origin, call the portal's API with the browser's cookies, read the
cookies. None of it gets anything; the lab's own API answers. The handoff goes portal -> the
workspace origin's begin (a state cookie) -> the portal's ticket -> the workspace origin's redeem."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from websockets.asyncio.server import ServerConnection, unix_serve
from websockets.datastructures import Headers
from websockets.http11 import Request as WsRequest
from websockets.http11 import Response as WsResponse

from corral.api.app import create_app
from corral.config import Settings
from corral.db.session import init_db, make_engine, make_session_factory
from corral.server.run import bind_listen_socket
from corral.services import accounts, auth
from corral.workspaces import proxy
from corral.workspaces.endpoint import Upstream
from tests.api.helpers import add_node, make_running
from tests.web.conftest import PASSWORD, launch_browser, screenshot

pytestmark = pytest.mark.browser

PROBE = """<!doctype html><html><head><title>lab</title></head><body><pre id="out">...</pre><script>
(async () => {
  const out = {cookies: document.cookie};
  const status = async (url, options) => {
    try { return (await fetch(url, options)).status; } catch (e) { return "blocked"; }
  };
  out.own_api = await status("/api/v1/me");
  out.portal_api = await status("PORTAL/api/v1/me", {credentials: "include"});
  out.portal_csrf = await status("PORTAL/api/v1/auth/csrf", {credentials: "include"});
  out.lab_api = await status("/ws/WS_ID/api/status");
  document.getElementById("out").textContent = JSON.stringify(out);
})();
</script></body></html>"""


def _jupyter(sock: str, page: str) -> Iterator[None]:
    """HTTP on a Unix socket: `page` for the lab, JSON for its API."""
    loop = asyncio.new_event_loop()
    ready, stop = threading.Event(), asyncio.Event()

    def answer(_connection: ServerConnection, request: WsRequest) -> WsResponse:
        lab = "/api/" not in request.path
        body = page.encode() if lab else json.dumps({"started": "now"}).encode()
        kind = "text/html; charset=utf-8" if lab else "application/json"
        headers = Headers([("Content-Type", kind), ("Content-Length", str(len(body)))])
        return WsResponse(200, "OK", headers, body)

    async def serve() -> None:
        async with unix_serve(lambda _c: asyncio.sleep(0), sock, process_request=answer, close_timeout=1):
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: Any) -> Iterator[tuple[str, str, int]]:
    """(portal URL, workspace origin, workspace id): ann's running workspace, behind the app."""
    portal_sock, lab_sock = bind_listen_socket("127.0.0.1", 0), bind_listen_socket("127.0.0.1", 0)
    port, lab_port = portal_sock.getsockname()[1], lab_sock.getsockname()[1]
    url = f"sqlite:///{tmp_path / 'corral.db'}"
    init_db(url)
    db_engine = make_engine(url)
    settings = Settings(home=tmp_path / "home", database_url=url, port=port, workspace_port=lab_port)
    factory = make_session_factory(db_engine)
    with factory() as db:
        assert auth.bootstrap_admin(db, settings) is not None
        accounts.create_group(db, "team")
        ann = accounts.create_user(db, accounts.NewUser("ann", password=PASSWORD, groups=("team",)))
        _row, token = auth.create_token(db, ann, "t")
        add_node(db)
        db.commit()
    app = create_app(settings, db_engine=db_engine)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [portal_sock, lab_sock]}, daemon=True)
    thread.start()
    portal, lab = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{lab_port}"
    _wait_listening(port)
    with httpx.Client(base_url=portal, headers={"Authorization": f"Bearer {token}"}) as api:
        created = api.post("/api/v1/workspaces", json={"name": "nb"})
        assert created.status_code == 201, created.text
    ws_id = int(created.json()["id"])
    with factory() as db:
        make_running(db, created.json()["job_id"])
    jupyter = str(tmp_path / "jupyter.sock")
    monkeypatch.setattr(proxy, "jupyter_upstream", lambda *_: Upstream(socket=jupyter))
    page = PROBE.replace("PORTAL", portal).replace("WS_ID", str(ws_id))
    try:
        for _ in _jupyter(jupyter, page):
            yield portal, lab, ws_id
    finally:
        server.should_exit = True
        thread.join(10)
        db_engine.dispose()


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"nothing listens on {port}")


def test_the_portal_hands_the_browser_to_a_lab_whose_script_reaches_nothing_of_the_portal(
    served: tuple[str, str, int], playwright_instance: Any
) -> None:
    portal, lab, ws_id = served
    browser = launch_browser(playwright_instance)
    try:
        page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(30_000)
        page.goto(f"{portal}/ws/{ws_id}/lab")
        page.wait_for_url("**/login**")
        page.fill("#username", "ann")
        page.fill("#password", PASSWORD)
        page.click("form.login-form button[type=submit]")
        page.wait_for_url(f"{lab}/ws/{ws_id}/lab")  # handed over: the workspace origin
        page.wait_for_function("document.getElementById('out').textContent.startsWith('{')")
        seen = json.loads(page.inner_text("#out"))
        screenshot(page, "workspace-origin-probe")
        assert seen == {
            "cookies": "",  # both of Corral's cookies are HttpOnly
            "own_api": 404,  # the workspace listener serves no API
            "portal_api": "blocked",  # another origin: its answer is not the page's to read
            "portal_csrf": "blocked",
            "lab_api": 200,  # JupyterLab's own API, with the workspace cookie
        }, seen
        names = {c["name"]: c for c in page.context.cookies()}
        assert names["corral_workspace"]["path"] == f"/ws/{ws_id}/"
        assert names["corral_workspace"]["httpOnly"] and names["corral_session"]["httpOnly"]
        # The handoff's state cookie (it bound the ticket to this browser) was spent and deleted.
        assert not [n for n in names if n.startswith("corral_handoff_")], names
        # Back on the portal the session is as it was: the handoff took nothing from it.
        page.goto(f"{portal}/workspaces")
        page.wait_for_selector("#topbar:not([hidden])")
        assert page.get_attribute("a.ws-open", "href") == f"/ws/{ws_id}/lab"
    finally:
        browser.close()
