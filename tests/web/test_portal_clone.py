"""Job and usage pages in a real browser (real server, Chromium). Cloning a job from its page and
submitting the form submits the job again: what the form does not show (mounts, stop_grace,
on_hang, idle_gpu, a task's env) is kept, what it shows is taken from the form. An id no job can
have gets the 404 page; a period the usage page does not offer, its default."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.web.conftest import Portal

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

SPEC = {
    "name": "clone-me",
    "priority": "low",
    "stop_grace": "45s",
    "on_hang": "notify",
    "idle_gpu": {"below_percent": 10, "for": "1h", "action": "warn"},
    "mounts": [{"source": "home", "target": "/mnt/home", "mode": "ro"}],
    "env": {"TOP": "1"},
    "tasks": {
        "main": {
            "command": "echo clone-me",
            "resources": {"cpus": 0.25, "memory": "128MiB"},
            "env": {"ROLE_ONLY": "yes"},
        }
    },
}


def test_a_clone_by_form_keeps_what_the_form_does_not_show(portal: Portal) -> None:
    with portal.api() as api:
        r = api.post("/api/v1/jobs", json={**SPEC, "group": "team-a"})
        assert r.status_code == 201, r.text
        original = r.json()
    page = portal.login("root", path=f"/submit?clone={original['id']}")
    page.wait_for_url(re.compile(r"/submit\?clone="))
    expect(page.locator("#job-name")).to_have_value("clone-me-copy")
    page.locator("fieldset.task").first.locator(".task-command").fill("echo the-copy")
    page.click("#submit-job")
    page.wait_for_url(re.compile(r"/jobs/\d+$"))
    copy_id = int(page.url.rsplit("/", 1)[1])
    assert copy_id != original["id"]
    with portal.api() as api:
        copy = api.get(f"/api/v1/jobs/{copy_id}").json()["spec"]
    for key in ("stop_grace", "on_hang", "idle_gpu", "mounts", "env", "priority"):
        assert copy.get(key) == original["spec"].get(key), key
    assert copy["tasks"]["main"]["env"] == {"ROLE_ONLY": "yes"}
    assert copy["tasks"]["main"]["command"] == "echo the-copy"
    assert copy["name"] == "clone-me-copy"
    assert page.js_errors == []


def test_an_id_no_job_can_have_gets_the_404_page_and_a_bad_period_the_default(portal: Portal) -> None:
    # /jobs/0 and /jobs/99999999999 got the generic "Error" page with the API's 422 about the
    # path parameter; docs/portal.md: a missing job gets the 404 page.
    page = portal.login("ann")
    for job_id in ("0", "99999999999"):
        page.goto(f"{portal.url}/jobs/{job_id}")
        expect(page.locator(".error-page")).to_have_attribute("data-status", "404")
        expect(page.locator(".error-page")).to_contain_text(f"no job with id {job_id}")
    # /usage?days=abc matched no period: the select was blank and the API refused a 0-day period.
    page.goto(f"{portal.url}/usage?days=abc")
    expect(page.locator("#usage-period")).to_have_value("30")
    expect(page.locator("#usage-body .error-box")).to_have_count(0)
    expect(page.locator("#usage-body")).not_to_be_empty()
    assert page.js_errors == []
