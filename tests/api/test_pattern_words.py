"""A field refused by its pattern says what was expected in words: `corral oncall contact email
alice notanemail` answered "field 'email' 'notanemail' does not match pattern
^[^@\\t\\n\\v\\f\\r \\x1c-\\x1f\\x85\\xa0\\u1680..." (260 characters of regex), and a contact
address or an SSH key the same way."""

from __future__ import annotations

from tests.api.conftest import World

API = "/api/v1"


def test_refused_email_address_and_key_are_said_in_words(world: World) -> None:
    c, alice = world.client, world.as_("alice")
    r = c.put(f"{API}/users/alice/email", json={"email": "notanemail"}, headers=alice)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["msg"] == "field 'email' 'notanemail' is not an email address"
    r = c.post(f"{API}/users/alice/contacts", json={"kind": "webhook", "address": "nope"}, headers=alice)
    assert r.status_code == 422, r.text
    assert (
        r.json()["detail"][0]["msg"]
        == "field 'address' 'nope' is neither an email address nor an http(s):// URL"
    )
    r = c.post(f"{API}/ssh-keys", json={"name": "k", "public_key": "ssh-dss AAAA x"}, headers=alice)
    assert r.status_code == 422, r.text
    msg = r.json()["detail"][0]["msg"]
    assert msg.startswith(
        "field 'public_key' 'ssh-dss AAAA x' is not an SSH public key: give the line of a .pub"
    )
    assert "pattern" not in msg and "\\\\s" not in msg
