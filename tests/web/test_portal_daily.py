"""Daily tasks the CLI had and the portal lacked, in a real browser (real server, Chromium): why a
job waits in words (`corral why`), deleting a finished job (`corral rm`), managing users (`corral
user ...`), removing a node (`corral node remove`), an incident's severity, owner and postmortem
(`corral incident ...`), and the submit page's tab kept in its address."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server_fixture import wait_for
from tests.web.conftest import Portal, after_redraw, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SPEC = {
    "group": "team-a",
    "tasks": {"main": {"command": "echo daily", "resources": {"cpus": 0.25, "memory": "128MiB"}}},
}


def submit(portal: Portal, name: str, *, hold: bool = False) -> dict:
    with portal.api() as api:
        r = api.post("/api/v1/jobs", json={**SPEC, "name": name}, params={"hold": "true"} if hold else None)
        assert r.status_code == 201, r.text
        return r.json()


def test_why_waiting_shows_the_reason_in_words_and_the_code_as_its_tooltip(portal: Portal) -> None:
    job = submit(portal, "why-words", hold=True)
    page = portal.login("root", path=f"/jobs/{job['id']}")
    reason = page.locator("ul.reasons li[data-code=on_hold]")
    expect(reason).to_contain_text(f"corral release {job['id']}")
    expect(reason).not_to_contain_text("on_hold")  # the code is not the text ...
    expect(reason).to_have_attribute("title", re.compile(r"^on_hold, "))  # ... but its tooltip
    assert page.js_errors == []


def test_a_finished_job_is_deleted_from_its_page_and_a_live_one_refused(portal: Portal) -> None:
    live = submit(portal, "delete-live", hold=True)
    done = submit(portal, "delete-done", hold=True)  # held: cancelled at once, never started
    with portal.api() as api:
        assert api.post(f"/api/v1/jobs/{done['id']}/cancel").status_code == 200
        assert api.get(f"/api/v1/jobs/{done['id']}").json()["state"] == "cancelled"
    page = portal.login("root", path=f"/jobs/{live['id']}")
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete-job")
    refused = page.locator("#job-message")
    expect(refused).to_contain_text(f"Job #{live['id']} was not deleted: ")
    expect(refused).to_contain_text("only finished jobs can be deleted")
    after_redraw(page, ".page-head h1")  # the head is drawn again every 2 s: the refusal stays
    expect(refused).to_contain_text("only finished jobs can be deleted")
    expect(refused).to_be_visible()
    page.click("#job-message .message-close")  # until it is dismissed
    expect(refused).to_be_hidden()
    page.goto(f"{portal.url}/jobs/{done['id']}")
    dialogs: list[str] = []
    page.once("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    page.click("#delete-job")  # dismissed: nothing happens
    expect(page.locator("#delete-job")).to_be_enabled()
    assert dialogs and "cannot be undone" in dialogs[0]
    page.once("dialog", lambda dialog: dialog.accept())
    page.click("#delete-job")
    page.wait_for_url(re.compile(r"/jobs$"))
    expect(page.locator(".toast-success")).to_contain_text(f"Job #{done['id']} deleted")
    with portal.api() as api:
        assert api.get(f"/api/v1/jobs/{done['id']}").status_code == 404
        assert api.get(f"/api/v1/jobs/{live['id']}").status_code == 200
    assert page.js_errors == []


def test_an_admin_manages_users_and_refusals_show_next_to_the_field(portal: Portal) -> None:
    page = portal.login("root", path="/users")
    expect(page.locator("#topbar nav a[href='/users']")).to_have_count(1)
    page.fill("#new-user-name", "Carl")  # the API's rule, said in words
    page.click("#create-user button[type=submit]")
    expect(page.locator("#new-user-name-error")).to_contain_text("lowercase letters")
    expect(page.locator("#new-user-name")).to_have_attribute("aria-invalid", "true")
    page.fill("#new-user-name", "ann")
    page.click("#create-user button[type=submit]")
    expect(page.locator("#new-user-name-error")).to_contain_text("a user named 'ann' already exists")
    page.fill("#new-user-name", "carl")
    page.fill("#new-user-password", "carl-pass-1")
    page.select_option("#new-user-group", "team-b")
    page.click("#create-user button[type=submit]")
    row = page.locator("table.users tr", has_text="carl")
    expect(row.locator("td[data-label=Groups]")).to_have_text("team-b")
    expect(page.locator("#new-user-name-error")).to_be_hidden()
    with portal.api() as api:
        carl = next(u for u in api.get("/api/v1/users").json() if u["name"] == "carl")
    assert carl["default_group"] == "team-b" and carl["active"] and not carl["is_admin"]

    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Deactivate carl").click()
    expect(row.locator("td[data-label=State]")).to_have_text("deactivated")
    row.get_by_role("button", name="Activate carl").click()
    expect(row.locator("td[data-label=State]")).to_have_text("active")
    page.once("dialog", lambda dialog: dialog.accept())  # an admin cannot deactivate themself
    page.get_by_role("button", name="Deactivate root").click()
    refused = page.locator(".user-actions[data-user=root] .field-error")
    expect(refused).to_contain_text("cannot deactivate themself")
    screenshot(page, "users")

    page.fill("#passwd-user", "nobody")
    page.fill("#passwd-password", "whatever-123")
    page.click("#set-password button[type=submit]")
    expect(page.locator("#passwd-user-error")).to_contain_text("nobody")
    page.fill("#passwd-user", "carl")
    page.fill("#passwd-password", "short")
    page.click("#set-password button[type=submit]")
    expect(page.locator("#passwd-password-error")).to_contain_text("At least 8")
    page.fill("#passwd-password", "carl-new-pass")
    page.click("#set-password button[type=submit]")
    expect(page.locator(".toast-success", has_text="carl's password set")).to_have_count(1)
    with portal.api() as api:
        r = api.post("/api/v1/auth/login", json={"username": "carl", "password": "carl-new-pass"})
        assert r.status_code == 200, r.text
        assert next(u for u in api.get("/api/v1/users").json() if u["name"] == "root")["active"]
    assert page.js_errors == []


def test_a_plain_user_gets_no_users_page(portal: Portal) -> None:
    page = portal.login("ann", path="/users")
    expect(page.locator(".error-page")).to_have_attribute("data-status", "403")
    expect(page.locator("#topbar nav a[href='/users']")).to_have_count(0)
    assert page.js_errors == []


def test_an_admin_edits_an_incidents_severity_owner_and_postmortem(portal: Portal) -> None:
    with portal.api() as api:
        node = api.get("/api/v1/nodes").json()[0]["name"]
        assert api.post(f"/api/v1/chaos/gpus/{node}/2", json={"temperature_c": 97}).status_code == 200
        try:

            def opened() -> list[dict[str, Any]]:
                items = api.get("/api/v1/incidents").json()["items"]
                return [i for i in items if f"GPU 2 on {node}" in i["title"]]

            (incident,) = wait_for(opened, 20, what="the GPU 2 incident")
            assert incident["severity"] == "SEV3" and not incident["owner"]
            page = portal.login("root", path=f"/incidents/{incident['id']}")
            page.select_option("#incident-edit-severity", "SEV2")  # the owner left empty: not sent
            page.click("#incident-edit button[type=submit]")
            expect(page.locator("h1")).to_contain_text("SEV2")
            page.click("#incident-edit button[type=submit]")
            expect(page.locator("#incident-edit-error")).to_contain_text("Nothing to save")
            page.fill("#incident-edit-owner", "nobody")
            page.click("#incident-edit button[type=submit]")
            expect(page.locator("#incident-edit-owner-error")).to_contain_text("no user named 'nobody'")
            page.fill("#incident-edit-owner", "ann")
            page.click("#incident-edit button[type=submit]")
            expect(page.locator("table.incident-timeline")).to_contain_text("owner ann set by root")
            expect(page.locator("#incident-edit-owner-error")).to_be_hidden()
            got = api.get(f"/api/v1/incidents/{incident['id']}").json()
            assert (got["severity"], got["owner"]) == ("SEV2", "ann")
            edits = [e["text"] for e in got["timeline"] if e["kind"] in ("severity", "owner")]
            assert edits == ["SEV3 -> SEV2 by root", "owner ann set by root"]

            page.fill("#postmortem-summary", "GPU 2 overheated")
            page.fill("#postmortem-impact", "one GPU out for an hour")
            page.fill("#postmortem-root-cause", "a failed fan")
            page.fill("#postmortem-actions", "replace the fans")  # not WHAT;OWNER;DUE: said in the page
            page.click("#postmortem-form button[type=submit]")
            expect(page.locator("#postmortem-actions-error")).to_contain_text(
                "line 1: expected WHAT;OWNER;YYYY-MM-DD"
            )
            page.fill("#postmortem-actions", "replace the fans;nobody;2026-12-31")  # the API's refusal
            page.click("#postmortem-form button[type=submit]")
            expect(page.locator("#postmortem-actions-error")).to_contain_text("no user named 'nobody'")
            page.fill("#postmortem-actions", "replace the fans;ann;2026-12-31")
            page.click("#postmortem-form button[type=submit]")
            expect(page.locator("section", has_text="Root cause: a failed fan")).to_have_count(1)
            got = api.get(f"/api/v1/incidents/{incident['id']}").json()["postmortem"]
            assert got["root_cause"] == "a failed fan"
            assert got["action_items"] == [{"what": "replace the fans", "owner": "ann", "due": "2026-12-31"}]
            page.reload()  # the form is the postmortem's, to edit
            expect(page.locator("h2", has_text="Edit the postmortem")).to_have_count(1)
            expect(page.locator("#postmortem-actions")).to_have_value("replace the fans;ann;2026-12-31")
            expect(page.locator("#incident-edit-owner")).to_have_value("ann")
            screenshot(page, "incident_postmortem")
            assert page.js_errors == []
        finally:
            api.post(f"/api/v1/chaos/gpus/{node}/2", json={"clear": True})


def test_an_admin_removes_a_cordoned_node_and_a_ready_one_is_refused(portal: Portal) -> None:
    with portal.api() as api:
        node = api.get("/api/v1/nodes").json()[0]["name"]
    page = portal.login("root", path="/nodes")
    card = page.locator(f"article.node[data-node='{node}']")
    page.once("dialog", lambda dialog: dialog.accept())
    card.locator("button.remove-node").click()
    refused = page.locator("#nodes-message")
    expect(refused).to_contain_text(f"{node} was not removed: ")
    expect(refused).to_contain_text("only a cordoned, drained or down node can be removed")
    after_redraw(page, f"article.node[data-node='{node}']")  # the grid is drawn again every 5 s
    expect(refused).to_contain_text("only a cordoned, drained or down node can be removed")
    try:
        with portal.api() as api:
            assert api.post(f"/api/v1/nodes/{node}/cordon").status_code == 200
        page.reload()
        page.once("dialog", lambda dialog: dialog.accept())
        card.locator("button.remove-node").click()
        expect(page.locator(".toast-success")).to_contain_text(f"{node} removed")
        with portal.api() as api:
            removed = api.get("/api/v1/audit", params={"action": "node.remove"}).json()
        assert [e["target_id"] for e in removed["items"]] == [node]
        assert page.js_errors == []
    finally:  # the local agent still reports it: it comes back cordoned; put it back in service
        with portal.api() as api:
            wait_for(lambda: api.get("/api/v1/nodes").json(), 60, 0.5, f"{node} back")
            assert api.post(f"/api/v1/nodes/{node}/uncordon").status_code == 200


def test_the_submit_tab_survives_a_reload(portal: Portal) -> None:
    job = submit(portal, "tab-clone", hold=True)
    page = portal.login("root", path=f"/submit?clone={job['id']}")
    expect(page.locator("#job-name")).to_have_value("tab-clone-copy")
    page.click("#tab-yaml")
    page.wait_for_url(re.compile(rf"/submit\?clone={job['id']}&tab=yaml$"))
    page.reload()
    expect(page.locator("#yaml-form")).to_be_visible()
    expect(page.locator("#tab-yaml")).to_have_attribute("aria-selected", "true")
    expect(page.locator("#job-yaml")).to_have_value(re.compile("tab-clone"))
    page.click("#tab-form")
    page.wait_for_url(re.compile(rf"/submit\?clone={job['id']}$"))
    page.reload()
    expect(page.locator("#submit-form")).to_be_visible()
    expect(page.locator("#yaml-form")).to_be_hidden()
    assert page.js_errors == []
