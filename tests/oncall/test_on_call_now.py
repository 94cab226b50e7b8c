"""`GET /oncall/now` and `corral oncall now`: "until" is when the current shift hands over. A
shift that runs past the 14 days looked at (a layer of one member) gave the end of that window,
"2026-12-14 05:56 UTC", which read as a handoff at this minute two weeks on; it is null now."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from tests.oncall.conftest import Env


def now_of(env: Env, schedule: str) -> dict[str, object]:
    response = env.client.get("/api/v1/oncall/now", params={"schedule": schedule}, headers=env.admin)
    assert response.status_code == 200, response.text
    (row,) = response.json()
    return row


def test_a_shift_past_the_horizon_has_no_until_and_a_rotation_ends_at_its_handoff(env: Env) -> None:
    start = (datetime.now(UTC) - timedelta(days=7)).date().isoformat()
    alone = {
        "name": "solo",
        "rotation": "weekly",
        "start_date": start,
        "handoff": "09:00",
        "members": ["alice"],
    }
    env.put("/oncall/schedules/solo", {"time_zone": "UTC", "layers": [alone]})
    assert now_of(env, "solo") == {
        "schedule": "solo",
        "user": "alice",
        "source": "layer solo",
        "until": None,
        "next": None,
    }

    daily = {
        "name": "day",
        "rotation": "daily",
        "start_date": start,
        "handoff": "09:00",
        "members": ["alice", "bob"],
    }
    env.put("/oncall/schedules/pair", {"time_zone": "UTC", "layers": [daily]})
    row = now_of(env, "pair")
    handoff = datetime.now(UTC).replace(hour=9, minute=0, second=0, microsecond=0)
    if handoff.timestamp() <= time.time():
        handoff += timedelta(days=1)
    assert row["until"] == handoff.timestamp() and row["next"] is not None


def test_an_override_that_has_already_ended_is_refused(env: Env) -> None:
    """The documented example (a night in November) was accepted after that night, silently: an
    override that changes nothing, which the admin took for a swapped shift."""
    layer = {"name": "day", "rotation": "daily", "start_date": "2026-01-05", "members": ["alice"]}
    env.put("/oncall/schedules/primary", {"time_zone": "UTC", "layers": [layer]})
    now = time.time()
    ended = {"user": "bob", "start": now - 7200, "end": now - 3600}
    response = env.client.post("/api/v1/oncall/schedules/primary/overrides", json=ended, headers=env.admin)
    assert response.status_code == 422, response.text
    [(loc, msg)] = [(e["loc"], e["msg"]) for e in response.json()["detail"]]
    assert loc == ["body", "end"] and msg.startswith("the override ended at ") and "before now" in msg
    assert env.client.get("/api/v1/oncall/schedules/primary", headers=env.admin).json()["overrides"] == []
    going = {"user": "bob", "start": now - 3600, "end": now + 3600}  # begun, not ended: takes over now
    made = env.client.post("/api/v1/oncall/schedules/primary/overrides", json=going, headers=env.admin)
    assert made.status_code == 201, made.text
    assert now_of(env, "primary")["user"] == "bob"


def test_every_gap_of_the_next_14_days_is_warned(env: Env) -> None:
    """docs/operations.md: the answer names every gap of the next 14 days; it named the first 10,
    so an office-hours schedule's nights from the eleventh on went unsaid (and `schedule ls`
    counted 10)."""
    office = {"name": "office", "rotation": "daily", "start_date": "2026-01-05", "members": ["alice"],
              "restrict_from": "09:00", "restrict_to": "17:00"}  # fmt: skip
    view = env.put("/oncall/schedules/office", {"time_zone": "UTC", "layers": [office]})
    nights = [w for w in view["warnings"] if w.startswith("gap: nobody on call ")]
    assert len(nights) == len(view["warnings"]) and len(nights) in (14, 15), view["warnings"]
    assert all(w.split(" - ")[1].split()[1] == "09:00" for w in nights[1:-1]), (
        nights
    )  # the last ends at the horizon
