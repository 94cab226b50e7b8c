"""An unknown field in any request body is named as such, without sending the user to the job
spec: `corral oncall schedule set` of a file with `layer:` for `layers:` (or a PATCH of an incident
with a typo) said "unknown field 'layer'; check its spelling against the job spec"."""

from __future__ import annotations

from tests.api.conftest import SIMPLE_JOB, World

API = "/api/v1"


def test_an_unknown_field_is_named_without_the_job_spec(world: World) -> None:
    admin = world.as_("admin")
    r = world.client.put(f"{API}/oncall/schedules/s", json={"time_zone": "UTC", "layer": []}, headers=admin)
    assert r.status_code == 422, r.text
    msg = "unknown field 'layer'; check its spelling"
    assert r.json()["detail"] == [{"loc": ["body", "layer"], "msg": msg, "type": "extra_forbidden"}]
    r = world.client.post(f"{API}/jobs", json={**SIMPLE_JOB, "retires": 2}, headers=world.as_("alice"))
    assert r.status_code == 422 and "unknown field 'retires'; check its spelling" in r.text, r.text
