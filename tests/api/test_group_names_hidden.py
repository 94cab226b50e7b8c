"""Every parameter that names a group the caller must belong to answers a non-member as it
answers a name no group has (404 "no group named ..."), so no answer tells which groups exist
(accounts.visible_group_id); admins are unchanged. The member and default-group routes are
tested in test_offboard.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from corral.config import Settings
from tests.api.conftest import SIMPLE_JOB, World

API = "/api/v1"
TEMPLATE = {"name": "t", "command": "echo hi", "resources": {"cpus": 1, "memory": "256MiB"}}
DIGEST = "0" * 64


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # A package source, so that POST /environments reaches its group check (it refuses first
    # when environments cannot be built at all).
    return Settings(home=tmp_path / "home", database_url="sqlite:///unused", env_find_links=tmp_path)


def _carol_template(w: World) -> str:
    r = w.client.post(f"{API}/templates", json={"name": "mine", "spec": TEMPLATE}, headers=w.as_("carol"))
    assert r.status_code == 201, r.text
    return "mine"


Call = Callable[[World, str], httpx.Response]
CALLS: dict[str, Call] = {
    "POST /jobs (group)": lambda w, g: w.client.post(
        f"{API}/jobs", json={**SIMPLE_JOB, "group": g}, headers=w.as_("carol")
    ),
    "POST /workspaces (group)": lambda w, g: w.client.post(
        f"{API}/workspaces", json={"name": "ws", "group": g, "start": False}, headers=w.as_("carol")
    ),
    "GET /secrets?group=": lambda w, g: w.client.get(f"{API}/secrets?group={g}", headers=w.as_("carol")),
    "PUT /secrets/{name}?group=": lambda w, g: w.client.put(
        f"{API}/secrets/token?group={g}", json={"value": "x"}, headers=w.as_("carol")
    ),
    "DELETE /secrets/{name}?group=": lambda w, g: w.client.delete(
        f"{API}/secrets/token?group={g}", headers=w.as_("carol")
    ),
    "POST /templates (group)": lambda w, g: w.client.post(
        f"{API}/templates",
        json={"name": "t", "spec": TEMPLATE, "group": g, "visibility": "group"},
        headers=w.as_("carol"),
    ),
    "POST /templates/{name}/share (group)": lambda w, g: w.client.post(
        f"{API}/templates/{_carol_template(w)}/share",
        json={"visibility": "group", "group": g},
        headers=w.as_("carol"),
    ),
    "POST /environments (group)": lambda w, g: w.client.post(
        f"{API}/environments",
        json={"name": "e", "source": "numpy\n", "visibility": "group", "group": g},
        headers=w.as_("carol"),
    ),
    "POST /datasets/uploads (group)": lambda w, g: w.client.post(
        f"{API}/datasets/uploads",
        json={"name": "d", "group": g, "bytes": 1, "files": 1, "digest": DIGEST},
        headers=w.as_("carol"),
    ),
}


@pytest.mark.parametrize("route", list(CALLS))
def test_a_non_member_gets_a_missing_groups_answer(world: World, route: str) -> None:
    """carol (nlp only) gets the same 404 for vision (exists) as for a name no group has."""
    answers: list[tuple[int, Any]] = []
    for name in ("vision", "no-such-group"):
        r = CALLS[route](world, name)
        answers.append((r.status_code, r.json()["detail"].replace(name, "NAME")))
    assert answers[0] == answers[1] == (404, "no group named 'NAME'"), answers


def test_workspace_policies_list_only_the_callers_groups(world: World) -> None:
    w = world
    r = w.client.get(f"{API}/workspaces/policies", headers=w.as_("carol"))
    assert r.status_code == 200 and [p["group"] for p in r.json()] == ["nlp"], r.text
    r = w.client.get(f"{API}/workspaces/policies", headers=w.as_("admin"))
    assert [p["group"] for p in r.json()] == ["default", "nlp", "vision"], r.text


def test_members_and_admins_still_reach_the_group(world: World) -> None:
    w = world
    r = w.client.post(f"{API}/jobs", json={**SIMPLE_JOB, "group": "vision"}, headers=w.as_("alice"))
    assert r.status_code == 201 and r.json()["group"] == "vision", r.text
    r = w.client.post(f"{API}/jobs", json={**SIMPLE_JOB, "group": "vision"}, headers=w.as_("admin"))
    assert r.status_code == 201 and r.json()["group"] == "vision", r.text  # admins: any group
    r = w.client.put(f"{API}/secrets/token?group=vision", json={"value": "x"}, headers=w.as_("alice"))
    assert r.status_code == 403 and "admins" in r.json()["detail"], r.text  # a member, not its admin
    assert w.client.get(f"{API}/secrets?group=vision", headers=w.as_("alice")).status_code == 200
    r = w.client.put(f"{API}/secrets/token?group=vision", json={"value": "x"}, headers=w.as_("admin"))
    assert r.status_code == 201, r.text
