"""A held job in a real browser (real server, Chromium): the job list and the job page mark it
"held", its why-pending is the hold, and the page's Release button releases it (as Cancel does,
through the API); the job then runs."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.web.conftest import Portal

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SPEC = {
    "name": "held-one",
    "group": "team-a",
    "tasks": {"main": {"command": "echo released", "resources": {"cpus": 0.25, "memory": "128MiB"}}},
}


def test_a_held_job_is_marked_and_released_from_its_page(portal: Portal) -> None:
    with portal.api() as api:
        r = api.post("/api/v1/jobs", json=SPEC, params={"hold": "true"})
        assert r.status_code == 201, r.text
        job = r.json()
    assert job["hold"]["by"] == "admin" and job["hold"]["admin"] is True
    page = portal.login("root", path="/jobs")
    expect(page.locator("table tr", has_text="held-one").locator(".badge.held")).to_have_text("held")
    page.goto(f"{portal.url}/jobs/{job['id']}")
    expect(page.locator("#held-badge")).to_have_text("held")
    expect(page.locator("#why-pending")).to_contain_text("none while it is held")
    expect(page.locator("ul.reasons")).to_contain_text(f"corral release {job['id']}")
    expect(page.locator("#hold-job")).to_have_count(0)
    page.click("#release-job")
    expect(page.locator("#held-badge")).to_have_count(0)
    with portal.api() as api:
        shown = api.get(f"/api/v1/jobs/{job['id']}").json()
    assert shown["hold"] is None
    assert [e["kind"] for e in shown["events"]][:3] == ["transition", "hold", "release"]
    assert page.js_errors == []
