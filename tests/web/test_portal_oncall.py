"""The portal's On-call page (real server, Chromium): who is on call now, the schedule's shifts
with its gap warned, the policy, and a page that notified ann, which she acknowledges from the
page; the escalation stops (the API shows who acknowledged)."""

from __future__ import annotations

import time

from tests.web.conftest import Portal, screenshot


def test_on_call_page_shows_who_and_acknowledges_a_page(portal: Portal) -> None:
    layer = {"name": "days", "rotation": "daily", "start_date": "2026-01-05", "members": ["ann"]}
    with portal.api() as api:
        assert api.put("/api/v1/users/ann/email", json={"email": "ann@example.org"}).status_code == 200
        spec = {
            "time_zone": "Europe/Berlin",
            "layers": [{**layer, "restrict_from": "00:00", "restrict_to": "23:30"}],
        }
        assert api.put("/api/v1/oncall/schedules/primary", json=spec).status_code == 201
        # one member every day: the shift runs past the 14 days looked at ('until' null)
        assert api.put("/api/v1/oncall/schedules/solo", json={"layers": [layer]}).status_code == 201
        steps = [{"schedule": "primary", "wait_minutes": 5}, {"user": "root", "wait_minutes": 5}]
        assert api.put("/api/v1/oncall/policies/gpu", json={"steps": steps}).status_code == 201
        override = {"user": "ann", "start": time.time() - 60, "end": time.time() + 3600}  # covers any gap
        assert api.post("/api/v1/oncall/schedules/primary/overrides", json=override).status_code == 201
        made = api.post(
            "/api/v1/oncall/pages", json={"policy": "gpu", "subject": "GPU 0 on node-a: ECC errors"}
        )
        assert made.status_code == 201, made.text
        page_id = made.json()["id"]
    page = portal.login("ann", path="/oncall")
    page.wait_for_selector("table.oncall-now")
    now_row = page.locator("table.oncall-now tbody tr", has_text="primary")
    assert "ann" in now_row.inner_text() and "override" in now_row.inner_text()
    assert "nobody on call" in page.locator("main").inner_text()  # 23:30-24:00 every night: warned
    solo_row = page.locator("table.oncall-now tbody tr", has_text="solo")
    assert "over 14 days" in solo_row.inner_text()  # it showed "—", as for no data
    page.wait_for_selector(
        "table.pages tbody tr:has-text('ECC errors')", timeout=30_000
    )  # the loop paged ann
    row = page.locator("table.pages tbody tr", has_text="ECC errors")
    row.locator("button", has_text="Acknowledge").click()
    page.wait_for_selector("table.pages tbody tr:has-text('acknowledged')")
    screenshot(page, "oncall")
    assert page.js_errors == []
    with portal.api() as api:
        view = api.get(f"/api/v1/oncall/pages/{page_id}").json()
    assert view["state"] == "acknowledged" and view["acked_by"] == "ann"
    assert [n["user"] for n in view["notifications"]] == ["ann"]  # root's step never ran
