"""A schedule, override or escalation policy naming a user or schedule that does not exist is bad
input at that place of the body: 422 naming the field (layers.1.members.0, fallback_user,
steps.1.user, ...), not a 404 that reads as "no such schedule" and leaves the admin to guess which
of a file's names is wrong. Nothing is stored."""

from __future__ import annotations

from typing import Any

from tests.oncall.conftest import Env

LAYER = {"name": "weekly", "rotation": "weekly", "start_date": "2026-11-02", "members": ["alice"]}


def refusal(env: Env, method: str, path: str, body: dict[str, Any]) -> list[tuple[list[Any], str]]:
    response = env.client.request(method, f"/api/v1{path}", json=body, headers=env.admin)
    assert response.status_code == 422, response.text
    return [(item["loc"], item["msg"]) for item in response.json()["detail"]]


def test_an_unknown_member_of_a_later_layer_is_named_by_its_place(env: Env) -> None:
    days = {"name": "days", "rotation": "daily", "start_date": "2026-11-07", "members": ["bob", "dave"]}
    body = {"time_zone": "Europe/Berlin", "layers": [LAYER, days]}
    assert refusal(env, "PUT", "/oncall/schedules/primary", body) == [
        (["body", "layers", 1, "members", 1], "no user named 'dave'")
    ]
    assert env.client.get("/api/v1/oncall/schedules/primary", headers=env.admin).status_code == 404


def test_an_unknown_fallback_user_is_named(env: Env) -> None:
    body = {"time_zone": "UTC", "fallback_user": "root", "layers": [LAYER]}
    assert refusal(env, "PUT", "/oncall/schedules/primary", body) == [
        (["body", "fallback_user"], "no user named 'root'")
    ]


def test_an_unknown_override_user_is_named(env: Env) -> None:
    env.put("/oncall/schedules/primary", {"time_zone": "UTC", "layers": [LAYER]})
    body = {"user": "zed", "start": 1893456000, "end": 1893459600}
    assert refusal(env, "POST", "/oncall/schedules/primary/overrides", body) == [
        (["body", "user"], "no user named 'zed'")
    ]
    missing = env.client.post("/api/v1/oncall/schedules/nosuch/overrides", json=body, headers=env.admin)
    assert missing.status_code == 404  # the schedule in the path: that one is a missing resource


def test_an_unknown_step_target_is_named_by_its_step(env: Env) -> None:
    env.put("/oncall/schedules/primary", {"time_zone": "UTC", "layers": [LAYER]})
    steps = [{"schedule": "primary", "wait_minutes": 5}, {"user": "zed", "wait_minutes": 10}]
    assert refusal(env, "PUT", "/oncall/policies/gpu", {"steps": steps}) == [
        (["body", "steps", 1, "user"], "no user named 'zed'")
    ]
    steps = [{"user": "bob"}, {"schedule": "secondary"}]
    assert refusal(env, "PUT", "/oncall/policies/gpu", {"steps": steps}) == [
        (["body", "steps", 1, "schedule"], "no on-call schedule named 'secondary'")
    ]
    assert env.client.get("/api/v1/oncall/policies", headers=env.admin).json() == []
