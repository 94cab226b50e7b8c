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


def test_apps_with_the_same_routers_share_their_literal_paths_and_others_do_not(
    world: World,
) -> None:
    """Walking every route's context costs ~0.1 s per app, and every create_app includes the
    same routers: the table is built once per process for them. An app whose routes differ (one
    more route here) gets a table of its own, with that route in it."""
    from fastapi import APIRouter

    from corral.api import conformance

    first = cast(FastAPI, world.client.app)
    shared = conformance.literal_paths(first)
    router = APIRouter()
    router.add_api_route("/api/v1/jobs/only-here", lambda: None, methods=["GET"])
    other = FastAPI(openapi_url=None)  # no routes of its own: only those copied below
    for route in first.router.routes:
        other.router.routes.append(route)
    other.include_router(router)
    assert conformance._routes_key(other.router.routes) != conformance._routes_key(first.router.routes)
    own = conformance.literal_paths(other)
    assert own is not shared and own["/api/v1/jobs/only-here"] == {"GET"}
    assert "/api/v1/jobs/only-here" not in shared
    again = FastAPI(openapi_url=None)
    for route in first.router.routes:
        again.router.routes.append(route)
    assert conformance.literal_paths(again) is shared
