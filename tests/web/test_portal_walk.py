"""What a walk through the portal as its users found (real server, Chromium): every link of the
top bar can be seen and clicked at 1280 and 800 px (they used to scroll out of sight inside the
bar); a long job name without spaces wraps in the jobs list instead of pushing its state off the
page; a plain member is not told that their group has no members; a group's admin removes a
member from the Groups page, and is offered to cancel the member's live jobs when those refuse
the removal; a quarantined GPU is not drawn free on the Nodes page, and an admin quarantines a
GPU and returns it to service from there; a workspace that is not running offers no JupyterLab
link to a page that is not there; the Environments form checks a name in the browser (its
pattern used to be an invalid regular expression, ignored with a console error), shows the
server's refusal as an error, and a link to an environment that is not there says so; the login
page shows no empty top bar; the Alerts and Incidents filters are kept in the address, so reload
and back keep them; an admin removes a group's GPU quota from the Groups page, and is told a
group name's rule in words; the audit log's table fits an 800 px window."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server_fixture import get_job, submit_spec, wait_for
from tests.web.conftest import PASSWORD, Portal, api_as, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

# Where a link's middle is, and what is drawn there: the link itself unless something covers or
# clips it (a nav scrolled sideways draws its overflow nowhere).
LINKS_ON_SCREEN = """() => Array.from(document.querySelectorAll('#topbar nav a')).map((a) => {
  const r = a.getBoundingClientRect();
  const x = r.left + r.width / 2, y = r.top + r.height / 2;
  const hit = document.elementFromPoint(x, y);
  return {text: a.textContent, shown: Boolean(hit && a.contains(hit)), right: r.right};
})"""


@pytest.mark.parametrize("width", [1280, 800])
def test_every_top_bar_link_is_on_screen(portal: Portal, width: int) -> None:
    page = portal.login("root", width=width)  # an admin: the most links (Audit, Incidents)
    links = page.evaluate(LINKS_ON_SCREEN)
    names = [link["text"] for link in links]
    assert {"On-call", "Usage", "Profile", "Audit", "Incidents"} <= set(names)
    hidden = [link["text"] for link in links if not link["shown"] or link["right"] > width]
    screenshot(page, f"walk-topbar-{width}")
    assert hidden == [], f"links out of sight at {width}px: {hidden}"
    page.click("nav >> text=Incidents")  # the last one works like any other
    page.wait_for_url("**/incidents")
    expect(page.locator("h1")).to_have_text("Incidents")
    assert page.js_errors == []


def test_a_long_job_name_wraps_in_the_jobs_list(portal: Portal) -> None:
    name = "sweep-" + "x" * 120
    with portal.api() as api:
        job_id = submit_spec(
            api,
            {
                "name": name,
                "group": "team-a",
                "tasks": {"main": {"command": "true", "resources": {"cpus": 0.25, "memory": "64MiB"}}},
            },
        )
    page = portal.login("root", width=800, path="/jobs")
    row = page.locator(f"tr[data-job-id='{job_id}']")
    expect(row).to_contain_text(name)
    wrap = page.locator("#jobs-results .table-wrap")
    overflow = wrap.evaluate("(el) => el.scrollWidth - el.clientWidth")
    state = row.locator("td[data-label='State']").bounding_box()
    screenshot(page, "walk-long-job-name-800")
    assert overflow <= 0, f"the jobs table is {overflow}px wider than the page"
    assert state is not None and state["x"] + state["width"] <= 800
    # Only the name breaks anywhere: the id link stays on one line (one box, not one per line).
    id_link = row.locator("td[data-label='ID'] a")
    assert id_link.evaluate("(el) => el.getClientRects().length") == 1


def _members(portal: Portal, group: str) -> dict[str, str]:
    with portal.api() as api:
        r = api.get(f"/api/v1/groups/{group}")
        assert r.status_code == 200, r.text
        return {m["user"]: m["role"] for m in r.json()["members"]}


def test_a_member_is_not_told_their_group_has_no_members(portal: Portal) -> None:
    assert set(_members(portal, "team-a")) >= {"ann", "root"}
    page = portal.login("ann", path="/groups")  # a member of team-a, not its admin
    card = page.locator("section.group[data-group='team-a']")
    expect(card.locator("td.quota-guaranteed")).to_have_text("2")
    expect(card).not_to_contain_text("No members")
    expect(card.locator(".members")).to_have_count(0)
    expect(card.locator(".remove-member")).to_have_count(0)


def test_a_group_admin_removes_a_member_cancelling_their_live_jobs(portal: Portal) -> None:
    with portal.api() as api:
        assert api.post("/api/v1/groups", json={"name": "team-w"}).status_code == 201
        for user, role in (("ann", "admin"), ("ben", "member")):
            r = api.post("/api/v1/groups/team-w/members", json={"user": user, "role": role})
            assert r.status_code == 201, r.text
    ben = api_as(portal, "ben")
    try:
        job_id = submit_spec(
            ben,
            {
                "name": "bens-run",
                "group": "team-w",
                "tasks": {"main": {"command": "sleep 300", "resources": {"cpus": 0.25, "memory": "64MiB"}}},
            },
        )
    finally:
        ben.close()
    page = portal.login("ann", path="/groups")
    card = page.locator("section.group[data-group='team-w']")
    expect(card.locator(".members")).to_contain_text("ann (admin)")
    dialogs: list[str] = []
    answers = [True, False]  # remove ben? yes; cancel his live job? not now

    def answer(dialog: Any) -> None:
        dialogs.append(dialog.message)
        if answers.pop(0):
            dialog.accept()
        else:
            dialog.dismiss()

    page.on("dialog", answer)
    card.locator("[data-member='ben'] .remove-member").click()
    for _ in range(200):  # the page's waits let Playwright deliver the dialogs (a sleep would not)
        if len(dialogs) == 2:
            break
        page.wait_for_timeout(50)
    assert len(dialogs) == 2, dialogs
    assert dialogs[0] == "Remove ben from team-w?"
    assert f"job {job_id}" in dialogs[1] and "Cancel those jobs and remove ben?" in dialogs[1]
    # Declined: nothing changed, and the button works again.
    expect(card.locator("[data-member='ben'] .remove-member")).to_be_enabled()
    assert _members(portal, "team-w") == {"ann": "admin", "ben": "member"}
    with portal.api() as api:
        assert get_job(api, job_id)["state"] not in ("cancelled", "failed", "succeeded")

    answers.extend([True, True])
    card.locator("[data-member='ben'] .remove-member").click()
    expect(page.locator("#toasts")).to_contain_text("ben removed from team-w.")
    expect(card.locator("[data-member='ben']")).to_have_count(0)
    expect(card.locator("[data-member='ann']")).to_contain_text("ann (admin)")
    screenshot(page, "walk-group-member-removed")
    assert _members(portal, "team-w") == {"ann": "admin"}
    with portal.api() as api:
        wait_for(lambda: get_job(api, job_id)["state"] == "cancelled", what=f"job {job_id} cancelled")
    assert page.js_errors == []


def _gpu_health(portal: Portal) -> dict[int, str]:
    with portal.api() as api:
        (node,) = api.get("/api/v1/nodes").json()
        return {g["index"]: g["health"] for g in node["gpus"]}


def test_a_quarantined_gpu_is_not_shown_free_and_admins_quarantine_and_return_gpus(portal: Portal) -> None:
    with portal.api() as api:
        node = api.get("/api/v1/nodes").json()[0]["name"]
        r = api.post(f"/api/v1/nodes/{node}/gpus/3/quarantine")
        assert r.status_code == 200, r.text
    try:
        page = portal.login("root", path="/nodes")
        card = page.locator(f"article.node[data-node='{node}']")
        gpu1, gpu3 = (card.locator("ul.gpus li").nth(i).locator(".gpu") for i in (1, 3))
        expect(gpu3).to_have_class(re.compile(r"\bgpu-unhealthy\b"))
        expect(gpu3).to_have_attribute("aria-label", re.compile(r"GPU 3 .*: quarantined"))
        expect(card.locator(".node-facts")).to_contain_text("3 of 4 GPUs free · 1 unhealthy")

        card.locator("button:has-text('Return GPU 3')").click()
        expect(page.locator("#toasts")).to_contain_text("GPU 3 back in service")
        expect(gpu3).to_have_class(re.compile(r"\bgpu-free\b"))
        assert _gpu_health(portal)[3] == "healthy"

        answers = ["9", "1"]  # no such GPU (refused here, nothing sent), then GPU 1
        page.on("dialog", lambda dialog: dialog.accept(answers.pop(0)))
        card.locator("button:has-text('Quarantine GPU')").click()
        refused = page.locator("#nodes-message")
        expect(refused).to_contain_text(f"{node} has no GPU '9': give one of 0, 1, 2, 3.")
        assert set(_gpu_health(portal).values()) == {"healthy"}
        card.locator("button:has-text('Quarantine GPU')").click()
        expect(page.locator("#toasts")).to_contain_text("GPU 1 quarantined")
        expect(refused).to_be_hidden()  # the next action cleared the refusal
        expect(gpu1).to_have_class(re.compile(r"\bgpu-unhealthy\b"))
        assert _gpu_health(portal) == {0: "healthy", 1: "quarantined", 2: "healthy", 3: "healthy"}
        screenshot(page, "walk-gpu-quarantined")
        assert page.js_errors == []
    finally:
        with portal.api() as api:
            for index in (1, 3):
                api.post(f"/api/v1/nodes/{node}/gpus/{index}/return")


def test_a_workspace_not_running_has_no_jupyterlab_link(portal: Portal) -> None:
    ann = api_as(portal, "ann")
    try:
        r = ann.post("/api/v1/workspaces", json={"name": "nb-stopped", "cpus": 0.25, "memory": "128MiB"})
        assert r.status_code == 201, r.text
        r = ann.post("/api/v1/workspaces/nb-stopped/stop")
        assert r.status_code == 200, r.text
        state = r.json()["state"]
    finally:
        ann.close()
    assert state != "running"
    page = portal.login("ann", path="/workspaces")
    row = page.locator("#ws-list tr", has_text="nb-stopped")
    expect(row.locator("td[data-label='State']")).not_to_have_text("running")
    link = row.locator("a.ws-open")
    expect(link).to_have_attribute("aria-disabled", "true")
    expect(link).to_have_attribute("title", re.compile("once the workspace is running"))
    assert link.get_attribute("href") is None
    assert page.js_errors == []


def test_the_environment_page_checks_names_and_shows_refusals_and_missing_ones(portal: Portal) -> None:
    page = portal.login("ann", path="/environments")
    console_errors: list[str] = []
    page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
    page.reload()  # the page again, now with the console watched
    name = page.locator("#env-form input[name=name]")
    page.fill("#env-form textarea[name=source]", "numpy\n")
    name.fill("bad name!")
    page.click("#env-form button[type=submit]")
    assert name.evaluate("(el) => el.validity.patternMismatch") is True
    expect(page.locator("#env-status")).to_have_text("")  # nothing was sent
    # This server has no package index: the API refuses (409), and the page says so as an error.
    name.fill("okenv")
    page.click("#env-form button[type=submit]")
    status = page.locator("#env-status")
    expect(status).to_contain_text("refused: ")
    expect(status).to_contain_text("no package index")
    expect(status).to_have_class("field-error")
    expect(status).to_have_attribute("role", "alert")
    # A link to an environment there is none of says so (it showed nothing).
    page.goto(portal.url + "/environments?name=gone-env")
    missing = page.locator("#environment-detail [role=alert]")
    expect(missing).to_contain_text("no environment named 'gone-env'")
    # The refusal's HTTP status is logged by Chromium itself; anything else is the page's.
    assert [m for m in console_errors if not m.startswith("Failed to load resource")] == []
    assert page.js_errors == []


def test_the_login_page_has_no_empty_top_bar(portal: Portal) -> None:
    page = portal.new_page()
    page.goto(portal.url + "/login")
    page.wait_for_selector("form.login-form")
    assert page.locator("#topbar").get_attribute("hidden") is not None
    expect(page.locator("#topbar")).to_be_hidden()
    page.fill("#username", "ann")
    page.fill("#password", "not-the-password")
    page.click("form.login-form button[type=submit]")
    expect(page.locator("form.login-form")).to_contain_text("Wrong username or password.")
    expect(page.locator("#topbar")).to_be_hidden()
    assert page.js_errors == []


def test_alert_and_incident_filters_survive_reload_and_back(portal: Portal) -> None:
    page = portal.login("root", path="/alerts")
    page.select_option("#alert-filter", "all")
    page.wait_for_url("**/alerts?show=all")
    page.reload()
    expect(page.locator("#alert-filter")).to_have_value("all")
    page.go_back()
    page.wait_for_url(re.compile(r"/alerts$"))
    expect(page.locator("#alert-filter")).to_have_value("firing")

    page.goto(portal.url + "/incidents")
    expect(page.locator("main")).to_contain_text("No open incidents.")
    page.select_option("#incident-state", "closed")
    page.wait_for_url("**/incidents?state=closed")
    # the address changes before the page is drawn again with new filters: a choice made on the
    # old severity select in between was lost with it (the fresh-clone CI saw it once)
    expect(page.locator("main")).to_contain_text("No closed incidents.")
    page.select_option("#incident-severity", "SEV1")
    page.wait_for_url("**/incidents?state=closed&severity=SEV1")
    page.reload()
    expect(page.locator("#incident-state")).to_have_value("closed")
    expect(page.locator("#incident-severity")).to_have_value("SEV1")
    expect(page.locator("main")).to_contain_text("No closed incidents.")
    page.go_back()
    page.wait_for_url("**/incidents?state=closed")
    expect(page.locator("#incident-severity")).to_have_value("")
    expect(page.locator("#incident-state")).to_have_value("closed")
    assert page.js_errors == []


def test_an_admin_removes_a_groups_quota_and_is_told_the_group_name_rule(portal: Portal) -> None:
    with portal.api() as api:
        r = api.put("/api/v1/groups/team-b/quota", json={"gpu_model": "*", "guaranteed": 1})
        assert r.status_code == 200, r.text
    page = portal.login("root", path="/groups")
    page.on("dialog", lambda dialog: dialog.accept())
    card = page.locator("section.group[data-group='team-b']")
    expect(card.locator("table.quotas tbody tr")).to_have_count(2)  # VGPU and any model
    page.select_option("#remove-quota-group", "team-b")
    page.fill("#remove-quota-model", "VGPU")
    page.click("#remove-quota button[type=submit]")
    expect(page.locator("#toasts")).to_contain_text("Quota of team-b for VGPU removed.")
    with portal.api() as api:
        assert api.get("/api/v1/groups/team-b").json()["quotas"] == [
            {"gpu_model": "*", "guaranteed": 1, "max": None}
        ]
    expect(card.locator("table.quotas tbody tr")).to_have_count(1)
    expect(card.locator("table.quotas")).not_to_contain_text("VGPU")
    # A group name the API would refuse is explained in words (the API's 422 quotes its regex).
    page.fill("#new-group-name", "Team B!")
    page.click("#create-group button[type=submit]")
    expect(page.locator("#create-group .field-error")).to_have_text(
        "Use lowercase letters, digits, '.', '_' or '-', starting with a letter or digit (64 at most)."
    )
    # A quota the group does not have: the API's 404 next to the form, nothing else changes.
    page.click("#remove-quota button[type=submit]")
    expect(page.locator("#remove-quota .field-error")).to_contain_text("VGPU")
    with portal.api() as api:
        assert len(api.get("/api/v1/groups/team-b").json()["quotas"]) == 1
    assert page.js_errors == []


# The audit table's width against its container's, and the page's against the window's.
AUDIT_WIDTHS = """() => {
  const table = document.querySelector('table.audit');
  const columns = Array.from(table.querySelectorAll('thead th'))
    .filter((th) => getComputedStyle(th).display !== 'none').map((th) => th.textContent);
  return {table: table.scrollWidth, box: table.parentElement.clientWidth, columns,
          page: document.documentElement.scrollWidth, window: document.documentElement.clientWidth};
}"""


def test_the_audit_table_fits_an_800_px_window(portal: Portal) -> None:
    """At 800x600 the audit log's table fits its box, long cells and all (a quota change's JSON
    with no spaces, a 64-character user name as the target): they wrap, nothing scrolls sideways.
    At 1280 px every column shows; at 800 the least useful one (From) gives way."""
    long_name = "audit-" + "w" * 58
    with portal.api() as api:
        r = api.post("/api/v1/users", json={"name": long_name, "password": PASSWORD, "groups": ["team-b"]})
        assert r.status_code == 201, r.text
        r = api.put("/api/v1/groups/team-b/quota", json={"gpu_model": "VGPU", "guaranteed": 2, "max": 4})
        assert r.status_code == 200, r.text
    wide = portal.login("root", path="/audit")
    expect(wide.locator("table.audit td.audit-target", has_text=long_name)).to_have_count(1)
    assert wide.evaluate(AUDIT_WIDTHS)["columns"] == ["When", "Actor", "From", "Action", "Target", "Change"]
    page = portal.login("root", width=800, height=600, path="/audit")
    expect(page.locator("table.audit td.audit-target", has_text=long_name)).to_have_count(1)
    widths = page.evaluate(AUDIT_WIDTHS)
    screenshot(page, "walk-audit-800")
    assert widths["table"] <= widths["box"], widths
    assert widths["page"] <= widths["window"], widths
    assert widths["columns"] == ["When", "Actor", "Action", "Target", "Change"], widths
    assert page.js_errors == []
