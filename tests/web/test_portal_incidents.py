"""The Incidents page (admins): an overheating GPU (injected through the chaos API) becomes a SEV3
incident; the list shows it with its SLA countdowns, the detail its timeline, and Ack works. An
incident's page offers only the moves its state allows (no close before resolve), keeps a note
being typed across its redraws, adds a comment and resolves with a note. A flapping incident shows
its badge in the list and on its page."""

from __future__ import annotations

import time
from typing import Any

from playwright.sync_api import expect

from corral.db.session import make_engine, make_session_factory
from corral.services import incidents
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


def test_a_flapping_incident_shows_its_badge_in_the_list_and_on_its_page(portal: Portal) -> None:
    """Made in the server's own database as the remediation rules would make it (an alert that
    resolved and fired again 3 times within the hour), which is quicker than toggling a GPU."""
    engine = make_engine(f"sqlite:///{portal.server.home / 'corral.db'}")
    t0, key, alert = time.time() - 300, "flap/portal", "portal-flap-alert"
    try:
        with make_session_factory(engine)() as db:

            def fire(now: float, title: str = "GPU 2 flapping") -> int:
                flapping = title == "GPU 2 flapping"
                return incidents.open_or_update(
                    db, fingerprint=key if flapping else title, title=title, severity="SEV3",
                    source="test", labels={}, links={}, now=now, alert=alert if flapping else "",
                ).id  # fmt: skip

            fire(t0, "GPU 3 steady")  # opened once, still firing: no badge
            incident_id = fire(t0)
            for n in (1, 2, 3):
                incidents.alert_resolved(db, alert, t0 + n * 60 - 30)
                assert fire(t0 + n * 60) == incident_id
            db.commit()
    finally:
        engine.dispose()
    page = portal.login("root", path="/incidents")
    row = page.locator("table.incidents tbody tr", has_text="GPU 2 flapping")
    expect(row.locator(".incident-flapping")).to_have_text("flapping")
    steady = page.locator("table.incidents tbody tr", has_text="GPU 3 steady")
    expect(steady).to_contain_text("triggered")
    expect(steady.locator(".incident-flapping")).to_have_count(0)
    row.locator("a").click()
    page.wait_for_url(f"**/incidents/{incident_id}")
    expect(page.locator("h1 .incident-flapping")).to_have_text("flapping")
    expect(page.locator("dl.facts")).to_contain_text("its reopens page nobody until it is quiet")
    expect(page.locator("table.incident-timeline")).to_contain_text("flapping: reopened 3 times in 2 min")
    screenshot(page, "incident_flapping")
    assert page.js_errors == []
