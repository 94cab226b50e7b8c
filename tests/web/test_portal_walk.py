"""What a walk through the portal as its users found (real server, Chromium): every link of the
top bar can be seen and clicked at 1280 and 800 px (they used to scroll out of sight inside the
bar); a long job name without spaces wraps in the jobs list instead of pushing its state off the
page; a plain member is not told that their group has no members; a group's admin removes a
member from the Groups page, and is offered to cancel the member's live jobs when those refuse
the removal."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import expect

from tests.server_fixture import submit_spec
from tests.web.conftest import Portal, screenshot

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
