"""The incident <-> page connection (corral.services.incident_paging) in-process, on the real app
and SQLite: the policy chosen by severity, nobody paged without one (and the timeline says so),
an ack on either side acknowledges the other exactly once, resolving cancels an open page."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from corral.services import incident_paging, incidents
from tests.oncall.conftest import Env


@pytest.fixture
def bridged(env: Env) -> Iterator[Env]:
    incident_paging.install()
    incident_paging.install()  # idempotent: one set of listeners
    try:
        yield env
    finally:
        incident_paging.uninstall()


def open_incident(env: Env, fingerprint: str, severity: str) -> int:
    with env.factory() as db:
        incident = incidents.open_or_update(
            db, fingerprint=fingerprint, title=f"fault {fingerprint}", severity=severity, source="test",
            labels={}, links={"gpus": ["n1/0"]}, now=time.time(),
        )  # fmt: skip
        db.commit()
        return incident.id


def detail(env: Env, incident_id: int) -> dict[str, Any]:
    r = env.client.get(f"/api/v1/incidents/{incident_id}", headers=env.admin)
    assert r.status_code == 200, r.text
    return dict(r.json())


def page_of(env: Env, incident_id: int) -> dict[str, Any] | None:
    pages = env.client.get("/api/v1/oncall/pages", headers=env.admin).json()
    found = [p for p in pages if p["key"] == f"incident:{incident_id}"]
    return found[0] if found else None


def texts(env: Env, incident_id: int, kind: str) -> list[str]:
    return [e["text"] for e in detail(env, incident_id)["timeline"] if e["kind"] == kind]


def test_policy_by_severity_acks_both_ways_once_and_resolve_cancels(bridged: Env) -> None:
    env = bridged
    lonely = open_incident(env, "a", "SEV3")
    assert page_of(env, lonely) is None
    assert texts(env, lonely, "paging") == [
        "nobody paged: no escalation policy named 'incident-sev3' or 'incidents'"
    ]

    env.put("/oncall/policies/incidents", {"steps": [{"user": "alice", "wait_minutes": 5}]})
    env.put("/oncall/policies/incident-sev1", {"steps": [{"user": "bob", "wait_minutes": 5}]})
    sev1, sev2 = open_incident(env, "b", "SEV1"), open_incident(env, "c", "SEV2")
    page1, page2 = page_of(env, sev1), page_of(env, sev2)
    assert page1 is not None and page1["policy"] == "incident-sev1" and page1["subject"] == "[SEV1] fault b"
    assert page2 is not None and page2["policy"] == "incidents" and page2["state"] == "triggered"
    assert "n1/0" in page2["body"] and f"/incidents/{sev2}" in page2["body"], page2["body"]
    assert texts(env, sev1, "paging") == ["paged via policy incident-sev1"]

    # The incident acked -> its page acked (escalation stops); acking the page again changes nothing.
    r = env.client.post(f"/api/v1/incidents/{sev2}/ack", headers=env.admin)
    assert r.status_code == 200, r.text
    acked = page_of(env, sev2)
    assert acked is not None and acked["state"] == "acknowledged", acked
    assert acked["acked_by"] == r.json()["acknowledged_by"]
    assert env.client.post(f"/api/v1/oncall/pages/{acked['id']}/ack", headers=env.admin).status_code == 200
    assert len(texts(env, sev2, "acknowledged")) == 1

    # The page acked -> the incident acked, once.
    r = env.client.post(f"/api/v1/oncall/pages/{page1['id']}/ack", headers=env.admin)
    assert r.status_code == 200, r.text
    shown = detail(env, sev1)
    assert shown["state"] == "acknowledged" and shown["acknowledged_by"] == r.json()["acked_by"], shown
    assert len(texts(env, sev1, "acknowledged")) == 1

    # Resolving an incident whose page is still open cancels the page.
    sev2b = open_incident(env, "d", "SEV2")
    r = env.client.post(f"/api/v1/incidents/{sev2b}/resolve", json={}, headers=env.admin)
    assert r.status_code == 200, r.text
    cancelled = page_of(env, sev2b)
    assert cancelled is not None and cancelled["state"] == "cancelled", cancelled
    assert "page cancelled: the incident resolved" in texts(env, sev2b, "paging")


def test_a_reopened_incident_is_paged_again_on_a_page_of_its_own(bridged: Env) -> None:
    """An incident that fires again within the flap window goes back to triggered: its first page
    was cancelled when it resolved, so without a new page a triggered incident paged nobody."""
    env = bridged
    env.put("/oncall/policies/incidents", {"steps": [{"user": "alice", "wait_minutes": 5}]})
    first = open_incident(env, "flap", "SEV2")
    r = env.client.post(f"/api/v1/incidents/{first}/resolve", json={}, headers=env.admin)
    assert r.status_code == 200, r.text
    assert open_incident(env, "flap", "SEV2") == first  # within the flap window: the same incident
    assert detail(env, first)["state"] == "triggered"

    pages = env.client.get("/api/v1/oncall/pages", headers=env.admin).json()
    ours = {p["key"]: p["state"] for p in pages if p["key"].startswith(f"incident:{first}")}
    assert ours == {f"incident:{first}": "cancelled", f"incident:{first}/reopen-1": "triggered"}, ours
    assert texts(env, first, "paging")[-1] == "reopened: paged again via policy incidents"

    # Firing again while it is triggered starts no further page.
    assert open_incident(env, "flap", "SEV2") == first
    pages = env.client.get("/api/v1/oncall/pages", headers=env.admin).json()
    assert len([p for p in pages if p["key"].startswith(f"incident:{first}")]) == 2

    # The new page's ack acknowledges the incident; resolving it again cancels nothing more.
    again = next(p for p in pages if p["key"] == f"incident:{first}/reopen-1")
    r = env.client.post(f"/api/v1/oncall/pages/{again['id']}/ack", headers=env.admin)
    assert r.status_code == 200, r.text
    assert detail(env, first)["state"] == "acknowledged"

    # A second reopen pages on a third key; resolving cancels that one.
    r = env.client.post(f"/api/v1/incidents/{first}/resolve", json={}, headers=env.admin)
    assert r.status_code == 200, r.text
    assert open_incident(env, "flap", "SEV2") == first
    r = env.client.post(f"/api/v1/incidents/{first}/resolve", json={}, headers=env.admin)
    assert r.status_code == 200, r.text
    pages = env.client.get("/api/v1/oncall/pages", headers=env.admin).json()
    ours = {p["key"]: p["state"] for p in pages if p["key"].startswith(f"incident:{first}")}
    assert ours[f"incident:{first}/reopen-2"] == "cancelled", ours
    assert ours[f"incident:{first}/reopen-1"] == "acknowledged", ours
