from __future__ import annotations

from typing import cast

from fastapi import FastAPI

from tests.api.conftest import SIMPLE_JOB, World


def test_submit_list_show_cancel(world: World) -> None:
    c = world.client
    r = c.post("/api/v1/jobs", json=SIMPLE_JOB, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    job = r.json()
    assert job["state"] == "queued" and job["group"] == "vision" and job["user"] == "alice"
    assert job["attempts"] == []
    r = c.get("/api/v1/jobs", headers=world.as_("alice"))
    assert r.json()["total"] == 1
    r = c.post(f"/api/v1/jobs/{job['id']}/cancel", headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "cancelled"
    assert [e["to_state"] for e in r.json()["events"]] == ["queued", "cancelled"]


def test_literal_paths_are_built_at_start_up_not_by_the_first_request(world: World) -> None:
    """conformance.LiteralPaths reads them on every request; built lazily, the first request
    (a submission, under load) waited ~0.1 s of CPU for them."""
    app = cast(FastAPI, world.client.app)  # the fixture started it and sent nothing yet
    paths = app.state.literal_paths
    assert paths["/api/v1/jobs"] >= {"GET", "POST"}
