"""A job's notifications in a real browser (real server, Chromium): the job page's summary shows
its spec's `notify`, and its timeline the `notify` event the notification loop recorded (here: its
owner has no contact of the kind asked for, so nothing was sent, and the page says so)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.server_fixture import wait_for
from tests.web.conftest import Portal

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SPEC = {
    "name": "told-one",
    "group": "team-a",
    "tasks": {"main": {"command": "exit 3", "resources": {"cpus": 0.25, "memory": "128MiB"}}},
    "notify": {"on": ["fail"], "to": ["slack"]},
}


def test_the_job_page_shows_notify_and_what_it_sent(portal: Portal) -> None:
    with portal.api() as api:
        r = api.post("/api/v1/jobs", json=SPEC)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        wait_for(
            lambda: any(e["kind"] == "notify" for e in api.get(f"/api/v1/jobs/{job_id}").json()["events"]),
            60,
            0.2,
            "the job's notify event",
        )
    page = portal.login("root", path=f"/jobs/{job_id}")
    expect(page.locator("dl.summary")).to_contain_text("failed to slack")
    expect(page.locator("ol.timeline")).to_contain_text(
        "no notification of 'failed' sent: admin has no contact of kind slack"
    )
    assert page.js_errors == []
