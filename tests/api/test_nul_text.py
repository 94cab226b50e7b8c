"""A NUL in a free-text field is a 422 naming the field, never a 500: PostgreSQL stores no NUL in
text (psycopg refuses it), so a template's description, a token's or SSH key's name, a quota's GPU
model, an email or a contact address with one was an unhandled DataError there (SQLite stores it).
The request bodies refuse it themselves (corral.api.schemas.RequestBody), so both databases answer
the same 422 and store nothing; the DataError handler is only a backstop."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import World

API = "/api/v1"
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl x"
CASES = [
    ("admin", "PUT", "/groups/vision/quota", {"gpu_model": "A\x00", "guaranteed": 1}, "gpu_model"),
    (
        "alice",
        "POST",
        "/templates",
        {"name": "t", "spec": "name: x\ncommand: y\n", "description": "\x00"},
        "description",
    ),
    ("alice", "POST", "/tokens", {"name": "t\x00"}, "name"),
    ("alice", "POST", "/ssh-keys", {"name": "k\x00", "public_key": KEY}, "name"),
    ("alice", "PUT", "/users/alice/email", {"email": "a\x00@x.test"}, "email"),
    ("alice", "POST", "/users/alice/contacts", {"kind": "email", "address": "a\x00@x.test"}, "address"),
    ("admin", "POST", "/incidents/1/comment", {"text": "a\x00"}, "text"),
    ("admin", "PATCH", "/incidents/1", {"owner": "a\x00"}, "owner"),
    ("alice", "POST", "/environments", {"name": "e", "source": "x\n", "description": "\x00"}, "description"),
    ("alice", "POST", "/templates/t/use", {"values": {"msg": "a\x00b"}}, "values"),
    ("admin", "PUT", "/remediation/rules", {"text": "rules: []\n#\x00"}, "text"),
]


@pytest.mark.parametrize(("who", "method", "path", "body", "field"), CASES)
def test_a_nul_in_free_text_is_never_a_500(
    world: World, who: str, method: str, path: str, body: dict[str, Any], field: str
) -> None:
    r = world.client.request(method, API + path, json=body, headers=world.as_(who))
    assert r.status_code < 500, r.text
    # On either database: the body's own check, before anything is looked up or stored.
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["msg"].startswith(f"{field!r} holds a NUL character"), r.text
    assert r.json()["detail"][0]["loc"][:2] == ["body", field], r.text


def test_nothing_with_a_nul_is_stored(world: World) -> None:
    r = world.client.post(API + "/tokens", json={"name": "t\x00"}, headers=world.as_("alice"))
    assert r.status_code == 422, r.text
    tokens = world.client.get(API + "/tokens", headers=world.as_("alice")).json()
    assert all("\x00" not in t["name"] for t in tokens), tokens


def test_a_secret_value_may_hold_a_nul(world: World) -> None:
    # Stored encrypted (never as text), and a file secret may hold any bytes.
    r = world.client.put(API + "/secrets/blob", json={"value": "a\x00b"}, headers=world.as_("alice"))
    assert r.status_code < 300, r.text


@pytest.mark.parametrize(
    ("extra", "loc"),
    [
        ({"group": "a\x00"}, ["body", "group"]),
        ({"mounts": [{"source": "data/x\x00"}]}, ["body", "mounts", 0, "source"]),
    ],
)
def test_a_nul_anywhere_in_a_job_spec_is_a_422_naming_it(
    world: World, extra: dict[str, Any], loc: list[Any]
) -> None:
    # The spec (corral.spec, no RequestBody): a NUL in a group's name was a 404 'there is no group
    # named' on SQLite and the backstop's 422 (loc ['body'], "'name' holds ...") on PostgreSQL.
    task = {"command": "true", "resources": {"cpus": 1, "memory": "256MiB"}}
    r = world.client.post(
        API + "/jobs", json={"name": "n", "tasks": {"main": task}, **extra}, headers=world.as_("alice")
    )
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["loc"] == loc and "holds a NUL character" in r.json()["detail"][0]["msg"], (
        r.text
    )


def test_a_webhook_address_with_a_control_character_is_refused_and_never_breaks_paging(
    world: World,
) -> None:
    """bench/fuzz_api.py (stateful, admin): a webhook contact 'https://\\x10...' matched the
    address pattern (a control character is no blank) and was stored; httpx refuses such a URL,
    so every page view showing it was a 500 and the paging loop failed on every tick. Now the
    schema's pattern and the service refuse it (422 naming the field), and an address stored
    before is shown as not a URL and fails its delivery only."""
    from corral.db.oncall_models import Page, PageNotification
    from corral.monitor.pager import ChannelError, Outgoing, post_webhook
    from corral.services.oncall import shown_url

    for address in ("https://a\x10b/hook", "http://host/p\x7fq"):
        r = world.client.post(
            "/api/v1/users/alice/contacts",
            json={"kind": "webhook", "address": address},
            headers=world.as_("alice"),
        )
        assert r.status_code == 422, r.text
        assert [e["loc"] for e in r.json()["detail"]] == [["body", "address"]]
    stored = "https://a\x10b/hook"
    assert shown_url(stored) == "(not a valid URL)"
    note = PageNotification(kind="webhook", address=stored, round=0, step=0)
    with pytest.raises(ChannelError, match=r"POST \(not a valid URL\): Invalid non-printable"):
        post_webhook(Outgoing(note, Page(), "alice", "http://ack", 0.0))


def test_a_template_values_key_with_a_nul_is_outside_the_schema_and_refused(world: World) -> None:
    """bench/fuzz_api.py --postgres (stateful, ST202): POST /templates/{name}/use with a NUL in a
    key of `values` was schema-valid (the no-NUL pattern covered the values only) and refused.
    The schema's propertyNames now say it; the refusal names 'values'."""
    import re

    schemas = world.client.get("/openapi.json").json()["components"]["schemas"]
    names = re.compile(schemas["UseIn"]["properties"]["values"]["propertyNames"]["pattern"])
    assert names.search("msg") and not names.search("m\x00sg")
    spec = "name: x\ncommand: echo ${msg}\nparameters:\n  msg: {type: string, default: hi}\n"
    r = world.client.post("/api/v1/templates", json={"name": "t", "spec": spec}, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    r = world.client.post(
        "/api/v1/templates/t/use", json={"values": {"m\x00sg": "x"}}, headers=world.as_("alice")
    )
    assert r.status_code == 422 and "'values' holds a NUL" in r.text, r.text


def test_the_schema_of_an_email_address_admits_no_control_character(world: World) -> None:
    """bench/fuzz_api.py (ST202): `PUT /users/{name}/email` with a NUL in the address was valid by
    the schema (the email pattern left out blanks, not NUL) and refused by the server; the pattern
    now leaves out every control character, and the refusal still names the NUL."""
    import re

    schemas = world.client.get("/openapi.json").json()["components"]["schemas"]
    (branch,) = [b for b in schemas["EmailIn"]["properties"]["email"]["anyOf"] if "pattern" in b]
    email = re.compile(branch["pattern"])
    assert [
        v for v in ("a\x00@x.test", "a@x.te\x00st", "a\x1b@x.test", "a@x.test\x7f") if email.search(v)
    ] == []
    assert [v for v in ("a@x.test", "ü.b@x.test") if not email.search(v)] == []
