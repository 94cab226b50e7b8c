"""A NUL in a job's command or environment is refused at submit (422 naming the field), not
stored to fail every attempt as `command_not_found`: typed in a spec, or through a template's
string parameter."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import World

API = "/api/v1"
TASK = {"command": "echo hi", "resources": {"cpus": 1, "memory": "256MiB"}}


@pytest.mark.parametrize(
    ("spec", "loc"),
    [
        ({"tasks": {"main": {**TASK, "command": "echo a\x00b"}}}, ["body", "tasks", "main", "command"]),
        ({"tasks": {"main": TASK}, "env": {"A": "x\x00"}}, ["body", "env", "A"]),
        ({"tasks": {"w": {**TASK, "env": {"B": "\x00"}}}}, ["body", "tasks", "w", "env", "B"]),
    ],
)
def test_a_nul_in_a_command_or_env_is_refused_naming_it(
    world: World, spec: dict[str, Any], loc: list[str]
) -> None:
    r = world.client.post(f"{API}/jobs", json={"name": "nul", **spec}, headers=world.as_("alice"))
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc and "NUL" in r.json()["detail"][0]["msg"]
    assert world.client.get(f"{API}/jobs", headers=world.as_("alice")).json()["total"] == 0


def test_a_template_value_with_a_nul_is_refused(world: World) -> None:
    spec = "parameters:\n  msg: {type: string, default: hi}\nname: t\ncommand: echo ${msg}\n"
    r = world.client.post(f"{API}/templates", json={"name": "t", "spec": spec}, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    r = world.client.post(
        f"{API}/templates/t/use", json={"values": {"msg": "a\x00b"}}, headers=world.as_("alice")
    )
    assert r.status_code == 422 and "NUL" in r.text, r.text
    assert world.client.get(f"{API}/jobs", headers=world.as_("alice")).json()["total"] == 0


@pytest.mark.parametrize(
    ("path", "param"), [(f"{API}/jobs", "user"), (f"{API}/jobs", "group"), (f"{API}/workspaces", "user")]
)
def test_a_nul_in_a_user_or_group_filter_is_a_422_naming_that_parameter(
    world: World, path: str, param: str
) -> None:
    """bench/fuzz_api.py --postgres: GET /jobs?user=<a NUL> was refused by the database, whose
    refusal named the column ('name'), not the parameter; on SQLite it was a search. The filter's
    schema now says no NUL, and the 422 names the parameter on either database."""
    r = world.client.get(path, params={param: "ali\x00ce"}, headers=world.as_("admin"))
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["query", param]
    assert error["msg"].startswith(f"query parameter {param!r}") and "NUL character" in error["msg"]


def test_the_schema_of_a_tasks_command_admits_no_nul_at_all(world: World) -> None:
    """bench/fuzz_api.py --postgres (stateful, ST202): a command of 'Þ"' and one NUL was valid by
    the schema and refused by the server. The pattern's non-blank character was `\\S`, which a NUL
    is; now neither it nor the text around it may be a NUL."""
    import re

    schemas = world.client.get("/openapi.json").json()["components"]["schemas"]
    command = re.compile(schemas["TaskV1"]["properties"]["command"]["pattern"])
    assert [v for v in ('Þ\x98"\x00', "\x00", " \x00 ", "a\x00b", "\x00a") if command.search(v)] == []
    assert [v for v in ("echo hi", " x ", "Þ", "sleep\t30") if not command.search(v)] == []
    r = world.client.post(
        f"{API}/jobs", json={"name": "n", "tasks": {"t": {"command": "\x00"}}}, headers=world.as_("alice")
    )
    assert r.status_code == 422 and "NUL" in r.text, r.text


@pytest.mark.parametrize(
    ("path", "param"),
    [
        (f"{API}/secrets", "group"),
        (f"{API}/oncall/now", "schedule"),
        (f"{API}/audit", "actor"),
        (f"{API}/audit", "action"),
        (f"{API}/audit", "target"),
    ],
)
def test_a_nul_in_any_other_text_filter_is_a_422_naming_it(world: World, path: str, param: str) -> None:
    """bench/fuzz_api.py --postgres, after the user/group filters: GET /secrets?group=<a NUL> was
    the database's refusal naming the column 'name'. Every text filter that reaches a query now
    says no NUL in the schema, and the 422 names the parameter."""
    r = world.client.get(path, params={param: "vi\x00sion"}, headers=world.as_("admin"))
    assert r.status_code == 422, r.text
    (error,) = r.json()["detail"]
    assert error["loc"] == ["query", param] and "NUL character" in error["msg"]
