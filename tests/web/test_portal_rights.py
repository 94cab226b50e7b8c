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


def test_a_group_admin_adds_members_to_their_groups_only(portal: Any) -> None:
    """A group's admin may add users to it (or change a member's role) by API and CLI; the portal
    gave the member form to platform admins only."""
    _api_post(portal, "/users", {"name": "dee", "password": PASSWORD, "groups": ["team-a"]})
    _api_post(portal, "/groups/team-b/members", {"user": "dee", "role": "admin"})
    page = portal.login("dee", path="/groups")
    form = page.locator("form#add-member")
    form.wait_for(timeout=5_000)
    options = form.locator("#member-group option").evaluate_all("(os) => os.map((o) => o.value)")
    assert options == ["team-b"]  # not team-a, where dee is a member only
    assert page.locator("form#set-quota, form#create-group, form#set-default-group").count() == 0
    card = page.locator("section.group[data-group='team-b']")
    assert "dee (admin)" in card.locator(".members").inner_text()
    assert card.locator("table.quotas").count() == 1  # the quota, to see (an admin sets it)

    page.fill("#member-user", "ann")
    page.select_option("#member-role", "member")
    form.locator("button[type=submit]").click()
    page.wait_for_selector(".toast-success:has-text('ann added to team-b as member')", timeout=5_000)
    page.wait_for_selector("section.group[data-group='team-b'] .members:has-text('ann')", timeout=5_000)
    with portal.api() as api:
        members = {m["user"]: m["role"] for m in api.get("/api/v1/groups/team-b").json()["members"]}
    assert members["ann"] == "member"
    assert page.js_errors == []
