"""A held job in a real browser (real server, Chromium): the job list and the job page mark it
"held", its why-pending is the hold, and the page's Release button releases it (as Cancel does,
through the API); the job then runs. The Hold button holds a queued job; an admin's hold its owner
cannot release, and the page says so where the next redraw leaves it."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.server_fixture import wait_for
from tests.web.conftest import Portal, after_redraw, api_as

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


def test_a_queued_job_is_held_from_its_page_and_an_admin_hold_stays_refused(portal: Portal) -> None:
    """ann's jobs wait behind a job holding every GPU: she holds one with its page's Hold button
    (the page marks it held, the server has her hold); one the admin held she may not release,
    and the refusal stays on the page through the head's redraws."""
    root, ann = api_as(portal, "root"), api_as(portal, "ann")
    blocker = ann_jobs = None
    try:
        r = root.post("/api/v1/jobs", json=gpu_job("hold-blocker", "sleep 120", gpus=4))
        assert r.status_code == 201, r.text
        blocker = r.json()["id"]
        wait_for(lambda: root.get(f"/api/v1/jobs/{blocker}").json()["state"] == "running", 30, 0.2, "blocker")
        ann_jobs = [
            ann.post("/api/v1/jobs", json=gpu_job(name, "true", gpus=1)).json()["id"]
            for name in ("mine", "admins")
        ]
        mine, admins = ann_jobs
        assert ann.get(f"/api/v1/jobs/{mine}").json()["state"] == "queued"  # behind the blocker

        page = portal.login("ann", path=f"/jobs/{mine}")
        expect(page.locator("h1 .badge").first).to_have_text("queued")
        expect(page.locator("#held-badge")).to_have_count(0)
        page.click("#hold-job")
        expect(page.locator("#held-badge")).to_have_text("held")
        expect(page.locator("#release-job")).to_be_visible()  # Hold became Release
        expect(page.locator("ul.reasons")).to_contain_text(f"corral release {mine}")
        expect(page.locator("#why-pending")).to_contain_text("none while it is held")
        shown = ann.get(f"/api/v1/jobs/{mine}").json()
        assert shown["state"] == "queued" and shown["hold"]["by"] == "ann" and shown["hold"]["admin"] is False
        assert shown["diagnosis"]["held"] is True
        expect(page.locator("#job-message")).to_be_hidden()

        r = root.post(f"/api/v1/jobs/{admins}/hold")
        assert r.status_code == 200 and r.json()["job"]["hold"]["admin"] is True, r.text
        page.goto(f"{portal.url}/jobs/{admins}")
        expect(page.locator("#held-badge")).to_have_attribute(
            "title", re.compile(r"only an admin can release it")
        )
        page.click("#release-job")
        refused = page.locator("#job-message")
        said = f"job {admins} is held by root as an admin: only an admin can release it"
        expect(refused).to_have_text(re.compile(rf"^Job #{admins} was not released: {said}"))
        after_redraw(page, ".page-head h1")  # drawn again from the server: the refusal stays
        after_redraw(page, ".page-head h1")
        expect(refused).to_contain_text("only an admin can release it")
        expect(refused).to_be_visible()
        expect(page.locator("#held-badge")).to_have_text("held")
        assert ann.get(f"/api/v1/jobs/{admins}").json()["hold"]["by"] == "root"
        assert page.js_errors == []
    finally:
        for job in [*(ann_jobs or []), *([blocker] if blocker is not None else [])]:
            root.post(f"/api/v1/jobs/{job}/cancel")
        root.close()
        ann.close()


def gpu_job(name: str, command: str, *, gpus: int) -> dict[str, object]:
    resources = {"gpus": gpus, "cpus": 0.25, "memory": "64MiB"}
    return {"name": name, "group": "team-a", "tasks": {"main": {"command": command, "resources": resources}}}
