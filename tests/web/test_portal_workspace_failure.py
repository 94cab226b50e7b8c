"""The Workspaces page says why a workspace failed: the API's `failure` (its job's reason, which
`corral ws show` prints) was on no page; the list said "stopped" and nothing else."""

from __future__ import annotations

import time

from playwright.sync_api import expect

from corral.db.models import Job
from corral.db.session import make_engine, make_session_factory
from corral.services.lifecycle import JobState, transition
from tests.web.conftest import Portal, api_as, screenshot

REASON = "launch failed: jupyter-lab: <b>not found</b> on node"  # markup in it stays text


def test_a_failed_workspace_says_why_in_the_list(portal: Portal) -> None:
    with portal.api() as admin:  # nowhere to place it, so that it fails here and nowhere else
        node = admin.get("/api/v1/nodes").json()[0]["name"]
        assert admin.post(f"/api/v1/nodes/{node}/cordon").status_code == 200
    try:
        ann = api_as(portal, "ann")
        try:
            r = ann.post("/api/v1/workspaces", json={"name": "nb-broken", "cpus": 0.25, "memory": "128MiB"})
            assert r.status_code == 201, r.text
            job_id = r.json()["job_id"]
            engine = make_engine(f"sqlite:///{portal.server.home / 'corral.db'}")
            try:
                with make_session_factory(engine)() as db:
                    job = db.get(Job, job_id)
                    assert job is not None and job.state == "queued", job and job.state
                    assert transition(db, job, JobState.FAILED, now=time.time(), message=REASON)
                    db.commit()
            finally:
                engine.dispose()
            view = ann.get("/api/v1/workspaces/nb-broken").json()
            assert (view["job_state"], view["failure"]) == ("failed", REASON), view
        finally:
            ann.close()
    finally:
        with portal.api() as admin:
            admin.post(f"/api/v1/nodes/{node}/uncordon")
    page = portal.login("ann", path="/workspaces")
    row = page.locator("#ws-list tr", has_text="nb-broken")
    why = row.locator("td[data-label='Why'] .ws-failure")
    expect(why).to_have_text(f"failed: {REASON}")
    assert why.locator("b").count() == 0  # textContent, not HTML
    screenshot(page, "workspace-failed")
    assert page.js_errors == []
