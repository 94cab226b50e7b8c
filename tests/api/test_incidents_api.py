"""The incidents API's input checks (the lifecycle itself: tests/incidents)."""

from __future__ import annotations

import time

from corral.services import accounts, incidents
from tests.api.conftest import World

API = "/api/v1"


def _incident(w: World) -> int:
    with w.session_factory() as db:
        now = time.time()
        i = incidents.open_or_update(db, fingerprint=f"api/{now}", title="t", severity="SEV4",
                                     source="manual", labels={}, links={}, now=now)  # fmt: skip
        db.commit()
        return i.id


def test_an_incident_owner_must_be_an_active_user_and_can_be_cleared(world: World) -> None:
    incident_id = _incident(world)
    url, admin = f"{API}/incidents/{incident_id}", world.as_("admin")
    r = world.client.patch(url, json={"owner": "nobody-by-this-name", "severity": "SEV2"}, headers=admin)
    assert r.status_code == 422, r.text
    assert "no user named 'nobody-by-this-name'" in r.text and "owner" in r.text
    with world.session_factory() as db:
        accounts.user_by_name(db, "carol").active = False
        db.commit()
    r = world.client.patch(url, json={"owner": "carol"}, headers=admin)
    assert r.status_code == 422 and "user 'carol' is deactivated" in r.text, r.text
    after = world.client.get(url, headers=admin).json()
    assert (after["owner"], after["severity"]) == ("", "SEV4")  # a refused edit changes nothing
    r = world.client.patch(url, json={"owner": "alice"}, headers=admin)
    assert r.status_code == 200 and r.json()["owner"] == "alice", r.text
    r = world.client.patch(url, json={"owner": ""}, headers=admin)
    assert r.status_code == 200 and r.json()["owner"] == "", r.text
