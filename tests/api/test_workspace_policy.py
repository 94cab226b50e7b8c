"""A group's workspace idle timeouts (`PUT /workspaces/policies/{group}`, `corral ws policy`):
changing one value keeps the other. The CLI sent both, the unset one as null, and the API read
null as "the server's": `--default 2h` dropped the group's maximum set before, `--max 8h` its
default. A field left out now keeps the group's; null still means the server's; the answer says
whose each value is."""

from __future__ import annotations

import json

import pytest

from tests.api.conftest import World
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture

API = "/api/v1/workspaces/policies"


def test_a_field_left_out_keeps_the_groups_value(world: World) -> None:
    c, admin = world.client, world.as_("admin")
    both = c.put(
        f"{API}/vision", json={"default_idle_timeout": "1h", "max_idle_timeout": "8h"}, headers=admin
    )
    assert both.status_code == 200, both.text

    r = c.put(f"{API}/vision", json={"default_idle_timeout": "2h"}, headers=admin).json()
    assert (r["default_idle_timeout_s"], r["max_idle_timeout_s"]) == (7200, 8 * 3600), r
    assert r["default_idle_timeout_source"] == r["max_idle_timeout_source"] == "group"
    r = c.put(f"{API}/vision", json={"max_idle_timeout": "4h"}, headers=admin).json()
    assert (r["default_idle_timeout_s"], r["max_idle_timeout_s"]) == (7200, 4 * 3600), r
    # checked against the kept value too
    r2 = c.put(f"{API}/vision", json={"default_idle_timeout": "5h"}, headers=admin)
    assert r2.status_code == 422, r2.text
    [error] = r2.json()["detail"]  # the values, as people write them, and whose the maximum is (it
    # was "... is more than max_idle_timeout", with neither value, when the maximum was kept)
    assert (error["loc"], error["msg"]) == (
        ["body", "default_idle_timeout"],
        "default_idle_timeout 5h given is more than group vision's max_idle_timeout 4h, kept "
        "(raise the maximum too)",
    )
    # the mirror case: the maximum given, the group's default kept: the field given is blamed
    r2 = c.put(f"{API}/vision", json={"max_idle_timeout": "1h"}, headers=admin)
    assert r2.status_code == 422, r2.text
    [error] = r2.json()["detail"]  # (it was loc default_idle_timeout, a field not sent, "7200s")
    assert (error["loc"], error["msg"]) == (
        ["body", "max_idle_timeout"],
        "max_idle_timeout 1h given is less than group vision's default_idle_timeout 2h, kept "
        "(lower the default too)",
    )
    both = {"default_idle_timeout": "9h", "max_idle_timeout": "8h 30m"}
    r2 = c.put(f"{API}/vision", json=both, headers=admin)
    assert r2.json()["detail"][0]["msg"] == "default_idle_timeout 9h is more than max_idle_timeout 8h30m"

    # null: back to the server's, said so; the other stays the group's
    settings = c.app.state.settings  # type: ignore[attr-defined]
    r = c.put(f"{API}/vision", json={"default_idle_timeout": None}, headers=admin).json()
    assert r["default_idle_timeout_source"] == "server" and r["max_idle_timeout_source"] == "group", r
    assert r["default_idle_timeout_s"] == min(settings.workspace_idle_timeout_s, 4 * 3600)
    [listed] = [p for p in c.get(API, headers=admin).json() if p["group"] == "vision"]
    assert listed == {**r, "group": "vision"}
    # callers that send both: as before, the pair replaced
    r = c.put(f"{API}/vision", json={"default_idle_timeout": None, "max_idle_timeout": None}, headers=admin)
    assert r.json()["max_idle_timeout_s"] == settings.workspace_max_idle_timeout_s
    assert r.json()["max_idle_timeout_source"] == "server"


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_ws_policy_changes_only_the_value_given(world: World, server_url: str) -> None:
    code, out = run(world, server_url, "admin", "ws", "policy", "vision", "--default", "1h", "--max", "8h")
    assert code == 0, out
    code, out = run(world, server_url, "admin", "ws", "policy", "vision", "--default", "2h")
    assert code == 0 and "default 2h (the group's), max 8h (the group's)" in out, out
    code, out = run(world, server_url, "admin", "ws", "policy", "vision", "--max", "4h")
    assert code == 0 and "default 2h (the group's), max 4h (the group's)" in out, out
    code, out = run(world, server_url, "admin", "ws", "policy", "vision", "--default", "server")
    assert code == 0 and "(the server's), max 4h (the group's)" in out, out
    code, out = run(world, server_url, "admin", "ws", "policy", "vision")
    assert code == 1 and "give --default, --max or both" in out, out
    code, out = run(world, server_url, "admin", "ws", "policies", "-o", "json")
    [vision] = [p for p in json.loads(out) if p["group"] == "vision"]
    assert vision["max_idle_timeout_s"] == 14400 and vision["default_idle_timeout_source"] == "server"
