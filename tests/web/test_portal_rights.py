"""The portal follows the user's rights as they change, without a reload: /me is read again on
every navigation, on a return to the tab, after a 403 and every few minutes (it was read once per
page load, so a group or role given meanwhile showed only after a reload)."""

from __future__ import annotations

from typing import Any

from tests.web.conftest import PASSWORD


def _api_post(portal: Any, path: str, body: dict[str, Any]) -> None:
    with portal.api() as api:
        r = api.post("/api/v1" + path, json=body)
        assert r.status_code == 201, r.text


def test_a_group_given_meanwhile_shows_on_navigation_and_on_return_to_the_tab(portal: Any) -> None:
    _api_post(portal, "/users", {"name": "cal", "password": PASSWORD, "groups": ["team-a"]})
    page = portal.login("cal", path="/profile")
    groups = page.locator("dl.summary div:has(dt:text-is('Groups')) dd")
    assert groups.inner_text() == "team-a"
    page.evaluate("window.notReloaded = true")

    _api_post(portal, "/groups/team-b/members", {"user": "cal", "role": "admin"})
    page.click("nav a[href='/submit']")  # a client-side navigation: the submit form's groups
    page.wait_for_selector("#job-group option[value='team-b']", state="attached", timeout=5_000)
    page.click("nav a[href='/profile']")
    page.wait_for_function(
        "() => document.querySelector('dl.summary')?.innerText.includes('team-b (admin)')", timeout=5_000
    )

    _api_post(portal, "/groups", {"name": "team-c"})
    _api_post(portal, "/groups/team-c/members", {"user": "cal"})
    page.evaluate("window.dispatchEvent(new Event('focus'))")  # back to the tab: no navigation
    page.wait_for_function(
        "() => document.querySelector('dl.summary')?.innerText.includes('team-c')", timeout=5_000
    )
    assert page.evaluate("window.notReloaded") is True
    assert page.js_errors == []
