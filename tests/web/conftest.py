"""Portal tests: a real Corral server (tests/server_fixture.py) and the Debian Chromium, driven by
Playwright's sync API. One server and one browser per module keep the whole suite short; each test
gets its own browser context (cookies, storage), so sessions never leak between tests."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.server_fixture import CorralServer, start_server
from tests.support import require

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"
PASSWORD = "portal-pass-123"
# Two teams with one member each, and a platform admin; created through the API like an operator.
USERS = {
    "root": {"is_admin": True, "groups": ["team-a"], "default_group": "team-a"},
    "ann": {"groups": ["team-a"], "default_group": "team-a"},
    "ben": {"groups": ["team-b"], "default_group": "team-b"},
}


@dataclass
class Portal:
    server: CorralServer
    browser: Any

    @property
    def url(self) -> str:
        return self.server.url

    def api(self) -> Any:
        return self.server.client()

    def new_page(self, width: int = 1280, height: int = 900) -> Any:
        context = self.browser.new_context(viewport={"width": width, "height": height})
        context.set_default_timeout(15_000)
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.js_errors = errors  # checked by tests: an uncaught exception is a bug
        return page

    def login(self, user: str, width: int = 1280, path: str = "/", height: int = 900) -> Any:
        page = self.new_page(width, height)
        page.goto(self.url + path)
        page.wait_for_url("**/login**")
        page.fill("#username", user)
        page.fill("#password", PASSWORD)
        page.click("form.login-form button[type=submit]")
        page.wait_for_selector("#topbar:not([hidden])")
        return page


def api_as(portal: Portal, user: str) -> Any:
    """An httpx client logged in as `user` through the same login the portal uses."""
    client = portal.server.client()
    client.headers.pop("Authorization")
    r = client.post("/api/v1/auth/login", json={"username": user, "password": PASSWORD})
    assert r.status_code == 200, r.text
    client.headers["X-CSRF-Token"] = r.json()["csrf_token"]
    return client


def after_redraw(page: Any, selector: str) -> None:
    """Wait until the page's timer has drawn `selector` again: a new element in its place (the
    job page redraws its head every 2 s, the nodes page its grid every 5 s)."""
    page.evaluate("(s) => { window.__beforeRedraw = document.querySelector(s); }", selector)
    page.wait_for_function(
        "(s) => { const now = document.querySelector(s); "
        "return now !== null && now !== window.__beforeRedraw; }",
        arg=selector,
        timeout=15_000,
    )


def setup_accounts(server: CorralServer) -> None:
    with server.client() as api:
        for group in ("team-a", "team-b"):
            r = api.post(
                "/api/v1/groups", json={"name": group, "quotas": [{"gpu_model": "VGPU", "guaranteed": 2}]}
            )
            assert r.status_code == 201, r.text
        for name, extra in USERS.items():
            r = api.post("/api/v1/users", json={"name": name, "password": PASSWORD, **extra})
            assert r.status_code == 201, r.text


def launch_browser(playwright: Any) -> Any:
    require(os.path.exists(CHROMIUM), "Chromium at /usr/bin/chromium")
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


@pytest.fixture(scope="module")
def playwright_instance() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - the dev extra installs it
        require(False, "the playwright Python package")
    with sync_playwright() as p:
        yield p


@pytest.fixture(scope="module")
def portal(playwright_instance: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Portal]:
    home = tmp_path_factory.mktemp("portal") / "corral-home"
    # GPU samples every second, so utilization shows up while a test watches. A scrape token, as
    # on Slurm or a public bind: the portal must draw utilization without reading /metrics.
    server = start_server(
        home,
        extra_env={
            "CORRAL_MONITOR_SAMPLE_INTERVAL_S": "1",
            "CORRAL_MONITOR_HEALTH_INTERVAL_S": "1",
            "CORRAL_METRICS_TOKEN": "portal-tests-scrape-token",
        },
    )
    with open_portal(playwright_instance, server, home) as portal:
        yield portal


@contextmanager
def open_portal(playwright: Any, server: CorralServer, scratch: Path) -> Iterator[Portal]:
    """The portal of a started `server`, with the test accounts and a browser; afterwards the
    browser is closed, the server stopped and `scratch` (its home, or what holds it) removed."""
    browser = None
    try:
        setup_accounts(server)
        browser = launch_browser(playwright)
        yield Portal(server=server, browser=browser)
    finally:
        if browser is not None:
            browser.close()
        server.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def screenshot(page: Any, name: str) -> Path:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
