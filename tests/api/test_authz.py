"""Every API route x every role: who may do what. A route added without a row here fails
`test_every_route_is_in_the_matrix`."""

from __future__ import annotations

import base64
import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastapi.routing import APIRoute

from tests.api.conftest import ALICE_PASSWORD, SIMPLE_JOB, World
from tests.api.dataset_cases import dataset_cases
from tests.api.helpers import add_node

ROLES = ("anon", "alice", "bob", "carol", "admin")  # alice: vision member; bob: vision admin; carol: nlp
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq0xQh4sLrXGzV3bP9yKo6e0mmXo0e1n8z9F3N0bQn+ alice@laptop"
_counter = itertools.count()


def fresh_ssh_key() -> str:
    """A well-formed ed25519 public key no one has registered (one key belongs to one user)."""
    blob = b"\0\0\0\x0bssh-ed25519\0\0\0\x20" + os.urandom(32)
    return "ssh-ed25519 " + base64.b64encode(blob).decode() + " someone@laptop"


@dataclass(frozen=True)
class Case:
    method: str
    route: str  # the route template, as FastAPI lists it
    expect: dict[str, int]  # role -> status; anon is always 401 unless given
    body: Callable[[World], Any] | None = None
    path: Callable[[World], str] | None = None  # fills the template; may create fresh rows per call


def _job(world: World) -> int:
    r = world.client.post("/api/v1/jobs", json=SIMPLE_JOB, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def _finished_job(world: World) -> int:
    job_id = _job(world)
    r = world.client.post(f"/api/v1/jobs/{job_id}/cancel", headers=world.as_("alice"))
    assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
    return job_id


def _token_of_alice(world: World) -> int:
    r = world.client.post("/api/v1/tokens", json={"name": "x"}, headers=world.as_("alice"))
    return int(r.json()["id"])


def _key_of_alice(world: World) -> int:
    r = world.client.post(
        "/api/v1/ssh-keys",
        json={"name": f"k{next(_counter)}", "public_key": SSH_KEY},
        headers=world.as_("alice"),
    )
    if r.status_code == 409:  # same key again: delete and re-add happens per call below
        keys = world.client.get("/api/v1/ssh-keys", headers=world.as_("alice")).json()
        return int(keys[0]["id"])
    return int(r.json()["id"])


def _down_node(world: World) -> str:
    """A fresh node that may be removed (down, nothing on it)."""
    name = f"gone{next(_counter)}"
    with world.session_factory() as db:
        add_node(db, name, state="down")
        db.commit()
    return f"/api/v1/nodes/{name}"


def everyone(status: int) -> dict[str, int]:
    return {"alice": status, "bob": status, "carol": status, "admin": status}


ADMIN_ONLY_200 = {"alice": 403, "bob": 403, "carol": 403, "admin": 200}
# carol may not see alice's job: 404, as a missing job (test_job_ids_hidden.py)
JOB_OWNER_VIEW = {"alice": 200, "bob": 200, "carol": 404, "admin": 200}

CASES = [
    Case("POST", "/api/v1/auth/logout", everyone(204)),
    Case("GET", "/api/v1/me", everyone(200)),
    Case("GET", "/api/v1/jobs", everyone(200)),
    Case(
        "POST",
        "/api/v1/jobs",
        {"alice": 201, "bob": 201, "carol": 404, "admin": 201},
        body=lambda w: {**SIMPLE_JOB, "group": "vision"},
    ),
    Case("GET", "/api/v1/jobs/{job_id}", JOB_OWNER_VIEW, path=lambda w: f"/api/v1/jobs/{_job(w)}"),
    Case(
        "DELETE",
        "/api/v1/jobs/{job_id}",
        {"alice": 204, "bob": 403, "carol": 404, "admin": 204},
        path=lambda w: f"/api/v1/jobs/{_finished_job(w)}",
    ),
    Case(
        "GET", "/api/v1/jobs/{job_id}/events", JOB_OWNER_VIEW, path=lambda w: f"/api/v1/jobs/{_job(w)}/events"
    ),
    Case(
        "POST",
        "/api/v1/jobs/{job_id}/cancel",
        JOB_OWNER_VIEW,
        path=lambda w: f"/api/v1/jobs/{_job(w)}/cancel",
    ),
    Case(
        "PATCH",
        "/api/v1/jobs/{job_id}/labels",
        JOB_OWNER_VIEW,
        body=lambda w: {"labels": {"trial": "8"}},
        path=lambda w: f"/api/v1/jobs/{_job(w)}/labels",
    ),
    # A queued job needs no engine for its logs (they say why it waits); others get 404.
    Case("GET", "/api/v1/jobs/{job_id}/logs", JOB_OWNER_VIEW, path=lambda w: f"/api/v1/jobs/{_job(w)}/logs"),
    Case("GET", "/api/v1/nodes", everyone(200)),
    Case("POST", "/api/v1/nodes/{name}/{action}", ADMIN_ONLY_200, path=lambda w: "/api/v1/nodes/n1/cordon"),
    Case(
        "DELETE",
        "/api/v1/nodes/{name}",
        {"alice": 403, "bob": 403, "carol": 403, "admin": 204},
        path=_down_node,
    ),
    Case("GET", "/api/v1/groups", everyone(200)),
    Case(
        "POST",
        "/api/v1/groups",
        {"alice": 403, "bob": 403, "carol": 403, "admin": 201},
        body=lambda w: {"name": f"g{next(_counter)}"},
    ),
    Case(
        "GET",
        "/api/v1/groups/{name}",
        {"alice": 200, "bob": 200, "carol": 404, "admin": 200},
        path=lambda w: "/api/v1/groups/vision",
    ),
    Case(
        "PUT",
        "/api/v1/groups/{name}/quota",
        ADMIN_ONLY_200,
        path=lambda w: "/api/v1/groups/vision/quota",
        body=lambda w: {"gpu_model": "*", "guaranteed": 2, "max": 4},
    ),
    Case(
        "POST",
        "/api/v1/groups/{name}/members",
        {"alice": 403, "bob": 201, "carol": 403, "admin": 200},  # admin: carol is a member by then
        path=lambda w: "/api/v1/groups/vision/members",
        body=lambda w: {"user": "carol"},
    ),
    Case("GET", "/api/v1/users", ADMIN_ONLY_200),
    Case(
        "POST",
        "/api/v1/users",
        {"alice": 403, "bob": 403, "carol": 403, "admin": 201},
        body=lambda w: {"name": f"u{next(_counter)}", "groups": ["nlp"]},
    ),
    Case(
        "PUT",
        "/api/v1/users/{name}/default-group",
        {"alice": 200, "bob": 403, "carol": 403, "admin": 200},
        path=lambda w: "/api/v1/users/alice/default-group",
        body=lambda w: {"group": "vision"},
    ),
    Case(
        "PUT",
        "/api/v1/users/{name}/password",
        {"alice": 204, "bob": 403, "carol": 403, "admin": 204},
        path=lambda w: "/api/v1/users/alice/password",
        body=lambda w: {"password": ALICE_PASSWORD, "current_password": ALICE_PASSWORD},
    ),
    Case("GET", "/api/v1/tokens", everyone(200)),
    Case("POST", "/api/v1/tokens", everyone(201), body=lambda w: {"name": "t"}),
    Case(
        "DELETE",
        "/api/v1/tokens/{token_id}",
        {"alice": 204, "bob": 404, "carol": 404, "admin": 204},
        path=lambda w: f"/api/v1/tokens/{_token_of_alice(w)}",
    ),
    Case("GET", "/api/v1/ssh-keys", everyone(200)),
    Case(
        "POST",
        "/api/v1/ssh-keys",
        everyone(201),
        body=lambda w: {"name": "k", "public_key": fresh_ssh_key()},
    ),
    Case(
        "DELETE",
        "/api/v1/ssh-keys/{key_id}",
        {"alice": 204, "bob": 404, "carol": 404, "admin": 204},
        path=lambda w: f"/api/v1/ssh-keys/{_key_of_alice(w)}",
    ),
    Case("GET", "/api/v1/cluster/summary", everyone(200)),
    Case("GET", "/api/v1/usage", everyone(200)),
]
CASES += dataset_cases(Case, everyone)
PUBLIC = {("POST", "/api/v1/auth/login"), ("GET", "/healthz"), ("GET", "/readyz")}


def test_every_route_is_in_the_matrix(world: World) -> None:
    listed = {(c.method, c.route) for c in CASES} | PUBLIC
    for route in world.client.app.routes:  # type: ignore[attr-defined]
        # Monitoring and the portal test their own routes; this matrix covers corral.api.routers.
        if isinstance(route, APIRoute) and route.endpoint.__module__.startswith("corral.api.routers"):
            for method in route.methods:
                assert (method, route.path) in listed, f"{method} {route.path} has no authorization test"


def test_route_authorization(world: World) -> None:
    """One test over the whole matrix (fixtures once), reporting every mismatch at the end."""
    with world.session_factory() as db:
        add_node(db, "n1")
        add_node(db, "cpu1", gpus=0)
        db.commit()
    mismatches = []
    for case in CASES:
        got: dict[str, int] = {}
        for role in ROLES:
            path = case.path(world) if case.path else case.route
            body = case.body(world) if case.body else None
            headers = {} if role == "anon" else world.as_(role)
            r = world.client.request(case.method, path, json=body, headers=headers)
            got[role] = r.status_code
            if role == "anon":
                assert r.json()["detail"].startswith("not authenticated")
        if got != {"anon": 401, **case.expect}:
            mismatches.append(f"{case.method} {case.route}: expected {case.expect}, got {got}")
    assert not mismatches, "\n".join(mismatches)
