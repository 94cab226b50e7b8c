"""The Incidents page (admins): an overheating GPU (injected through the chaos API) becomes a SEV3
incident; the list shows it with its SLA countdowns, the detail its timeline, and Ack works. An
incident's page offers only the moves its state allows (no close before resolve), keeps a note
being typed across its redraws, adds a comment and resolves with a note."""

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


def _buttons(page: Any) -> list[str]:
    return [b.inner_text() for b in page.locator(".incident-actions button").all() if b.is_visible()]


def test_an_incident_offers_the_moves_its_state_allows_and_keeps_notes(portal: Portal) -> None:
    with portal.api() as api:
        node = api.get("/api/v1/nodes").json()[0]["name"]
        assert api.post(f"/api/v1/chaos/gpus/{node}/1", json={"temperature_c": 97}).status_code == 200
        try:

            def opened() -> list[dict[str, Any]]:
                items = api.get("/api/v1/incidents").json()["items"]
                return [i for i in items if f"GPU 1 on {node}" in i["title"]]

            (incident,) = wait_for(opened, 20, what="the GPU 1 incident")
            assert incident["state"] == "triggered"
            page = portal.login("root", path=f"/incidents/{incident['id']}")
            expect(page.locator("h1")).to_contain_text("triggered")
            # No close while triggered: the API would refuse it (resolve first).
            assert _buttons(page) == ["ack", "mitigate", "resolve", "Add comment"]
            page.fill("#incident-note", "checking the fans")
            page.click("button[data-action=ack]")
            expect(page.locator("h1")).to_contain_text("acknowledged")
            assert _buttons(page) == ["mitigate", "resolve", "Add comment"]
            # Ack does not send the note, and the redraws after it keep what is being typed.
            expect(page.locator("#incident-note")).to_have_value("checking the fans")
            page.click("button[data-action=comment]")
            timeline = page.locator("table.incident-timeline")
            expect(timeline.locator("tr", has_text="checking the fans")).to_contain_text("comment")
            expect(page.locator("#incident-note")).to_have_value("")
            page.click("button[data-action=comment]")  # nothing to say: refused next to the box
            expect(page.locator("#incident-note-error")).to_have_text("Write the comment first.")
            page.fill("#incident-note", "fans replaced")
            page.click("button[data-action=resolve]")
            expect(page.locator("h1")).to_contain_text("resolved")
            expect(timeline.locator("tr", has_text="fans replaced")).to_contain_text("resolved")
            assert _buttons(page) == ["close", "Add comment"]
            screenshot(page, "incident_resolved_with_note")
            got = api.get(f"/api/v1/incidents/{incident['id']}").json()
            assert got["state"] == "resolved"
            assert [e["text"] for e in got["timeline"] if e["kind"] == "comment"] == ["checking the fans"]
            assert page.js_errors == []
        finally:
            api.post(f"/api/v1/chaos/gpus/{node}/1", json={"clear": True})
