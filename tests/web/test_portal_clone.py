"""Cloning a job from its page and submitting the form (real server, Chromium) submits the job
again: what the form does not show (mounts, stop_grace, on_hang, idle_gpu, a task's env) is kept,
what it shows is taken from the form."""

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
