"""The Incidents page (admins): an overheating GPU (injected through the chaos API) becomes a SEV3
incident; the list shows it with its SLA countdowns, the detail its timeline, and Ack works."""

from __future__ import annotations

from typing import Any

from playwright.sync_api import expect

from tests.server_fixture import wait_for
from tests.web.conftest import Portal, screenshot


def test_an_overheating_gpu_is_an_incident_listed_shown_and_acknowledged(portal: Portal) -> None:
    with portal.api() as api:
        node = api.get("/api/v1/nodes").json()[0]["name"]
        r = api.post(f"/api/v1/chaos/gpus/{node}/3", json={"temperature_c": 97})
        assert r.status_code == 200, r.text

        def opened() -> list[dict[str, Any]]:
            return list(api.get("/api/v1/incidents").json()["items"])

        (incident,) = wait_for(opened, 20, what="the overheating incident")
        assert incident["severity"] == "SEV3"
        page = portal.login("root", path="/incidents")
        row = page.locator("table.incidents tbody tr", has_text="overheating").first
        expect(row).to_contain_text("SEV3")
        expect(row).to_contain_text("triggered")
        screenshot(page, "incidents")
        row.locator("a").click()
        page.wait_for_url(f"**/incidents/{incident['id']}")
        timeline = page.locator("table.incident-timeline")
        expect(timeline).to_contain_text("opened")
        expect(timeline).to_contain_text("remedy gpu-overheating")
        page.click("button:has-text('ack')")
        expect(page.locator("h1 .incident-acknowledged")).to_have_text("acknowledged")
        screenshot(page, "incident_detail")
        assert page.js_errors == []
        assert api.get(f"/api/v1/incidents/{incident['id']}").json()["acknowledged_by"] == "root"
        api.post(f"/api/v1/chaos/gpus/{node}/3", json={"clear": True})

    member = portal.login("ann", path="/incidents")
    expect(member.locator(".error-page")).to_have_attribute("data-status", "403")
    expect(member.locator("nav")).not_to_contain_text("Incidents")
