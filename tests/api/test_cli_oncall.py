"""`corral oncall` against a real uvicorn server: a schedule from YAML (a gap warned), who is
on call now, an override that swaps the shift, a policy from --step options, a page by hand that
the paged person acknowledges, the iCal feed, and bad input named."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import World
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_cli_schedule_policy_page_and_ack(world: World, server_url: str, tmp_path: Path) -> None:
    spec = tmp_path / "primary.yaml"
    spec.write_text(
        "time_zone: Europe/Berlin\n"
        "layers:\n"
        "  - {name: day, rotation: daily, start_date: '2026-01-05', handoff: '09:00',\n"
        "     members: [alice, bob], restrict_from: '00:00', restrict_to: '23:00'}\n"
    )
    code, out = run(world, server_url, "admin", "oncall", "schedule", "set", "primary", "-f", str(spec))
    assert code == 0, out
    assert "warning: gap: nobody on call" in out and "23:00" in out  # 23:00-24:00 every night
    code, out = run(world, server_url, "alice", "oncall", "schedule", "set", "primary", "-f", str(spec))
    assert code == 1 and "only admins may define on-call schedules" in out
    code, out = run(world, server_url, "alice", "oncall", "now", "primary", "-o", "json")
    assert code == 0, out
    [now] = json.loads(out)
    assert now["schedule"] == "primary" and now["source"] in ("layer day", "gap")
    start, end = time.time() - 60, time.time() + 3600
    code, out = run(
        world, server_url, "admin", "oncall", "schedule", "override", "primary", "carol", str(start), str(end)
    )
    assert code == 0, out
    code, out = run(world, server_url, "alice", "oncall", "now", "primary", "-o", "json")
    assert json.loads(out)[0]["user"] == "carol" and json.loads(out)[0]["source"] == "override"
    code, out = run(world, server_url, "alice", "oncall", "now")
    assert code == 0 and "carol" in out and "override" in out
    code, out = run(world, server_url, "alice", "oncall", "schedule", "ical", "primary")
    assert code == 0 and out.startswith("BEGIN:VCALENDAR") and "SUMMARY:carol on call (primary)" in out

    code, out = run(
        world,
        server_url,
        "admin",
        "oncall",
        "policy",
        "set",
        "gpu",
        "--step",
        "schedule:primary:5",
        "--step",
        "user:bob:10",
        "--repeat",
        "1",
    )
    assert code == 0 and "policy gpu: 2 steps, repeat 1" in out, out
    code, out = run(world, server_url, "admin", "oncall", "policy", "set", "bad", "--step", "schedule:nosuch")
    assert code == 1 and "no on-call schedule named 'nosuch'" in out
    code, out = run(world, server_url, "admin", "oncall", "policy", "set", "bad", "--step", "team:x")
    assert code == 1 and "schedule:NAME[:WAIT_MINUTES]" in out
    code, out = run(world, server_url, "carol", "oncall", "contact", "email", "carol", "carol@example.org")
    assert code == 0, out
    code, out = run(world, server_url, "carol", "oncall", "contact", "email", "bob", "x@example.org")
    assert code == 1 and "only bob and admins" in out
    code, out = run(world, server_url, "admin", "oncall", "page", "gpu", "test page")
    assert code == 0 and "page 1 started" in out, out
    with world.session_factory() as db:  # the paging loop's step, as the server would run it
        from corral.services.paging import escalate_due

        escalate_due(db, time.time())
    code, out = run(world, server_url, "carol", "oncall", "pages", "-o", "json")
    assert [p["id"] for p in json.loads(out)] == [1]  # carol is on call (override): she was paged
    code, out = run(world, server_url, "alice", "oncall", "ack", "1")
    assert code == 1 and "no page 1" in out  # alice was not paged for it
    code, out = run(world, server_url, "carol", "oncall", "ack", "1")
    assert code == 0 and "acknowledged by carol" in out, out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_schedule_show_lists_overrides_by_the_id_rm_override_takes(
    world: World, server_url: str, tmp_path: Path
) -> None:
    """`corral oncall schedule rm-override NAME ID` takes an override's id, but `schedule show`
    printed overrides only as shifts ("override" in SOURCE), without it (only -o json had it)."""
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "time_zone: UTC\nlayers:\n  - {name: d, rotation: daily, start_date: '2026-01-05', handoff: '09:00',"
        " members: [alice]}\n"
    )
    assert run(world, server_url, "admin", "oncall", "schedule", "set", "s", "-f", str(spec))[0] == 0
    start, end = time.time() + 3600, time.time() + 7200
    code, out = run(
        world, server_url, "admin", "oncall", "schedule", "override", "s", "bob", str(start), str(end)
    )
    assert code == 0 and out.startswith("override "), out
    made = int(out.split()[1].rstrip(":"))
    code, out = run(world, server_url, "alice", "oncall", "schedule", "show", "s")
    assert code == 0 and f"override {made}: bob " in out, out
    code, out = run(world, server_url, "admin", "oncall", "schedule", "rm-override", "s", str(made))
    assert code == 0 and f"override {made} removed" in out
    assert (
        "override "
        not in run(world, server_url, "alice", "oncall", "schedule", "show", "s")[1].split("FROM")[0]
    )


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_schedule_show_prints_the_calendar_url_whole_on_one_line(
    world: World, server_url: str, tmp_path: Path
) -> None:
    """At 80 columns Rich folded the subscription URL after its first 80 characters, so what a
    user copied from the terminal was two pieces of it."""
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "time_zone: UTC\nlayers:\n  - {name: d, rotation: daily, start_date: '2026-01-05', handoff: '09:00',"
        " members: [alice]}\n"
    )
    assert (
        run(world, server_url, "admin", "oncall", "schedule", "set", "primary-schedule", "-f", str(spec))[0]
        == 0
    )
    code, out = run(
        world, server_url, "alice", "oncall", "schedule", "show", "primary-schedule", "-o", "json"
    )
    assert code == 0, out
    url = server_url + json.loads(out)["ical_feed"]
    code, out = run(world, server_url, "alice", "oncall", "schedule", "show", "primary-schedule")
    line = f"calendar (no login): {url}"
    assert code == 0 and len(line) > 80 and line in out.splitlines(), out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_feed_rotate_prints_a_new_url_and_the_old_one_stops_working(
    world: World, server_url: str, tmp_path: Path
) -> None:
    spec = tmp_path / "s.yaml"
    spec.write_text(
        "time_zone: UTC\nlayers:\n"
        "  - {name: d, rotation: daily, start_date: '2026-01-05', members: [alice]}\n"
    )
    assert run(world, server_url, "admin", "oncall", "schedule", "set", "primary", "-f", str(spec))[0] == 0
    code, out = run(world, server_url, "alice", "oncall", "schedule", "show", "primary", "-o", "json")
    old = server_url + json.loads(out)["ical_feed"]
    code, out = run(world, server_url, "carol", "oncall", "schedule", "show", "primary")
    assert code == 0 and "calendar (no login)" not in out, out  # not one of the schedule's people
    code, out = run(world, server_url, "alice", "oncall", "feed", "rotate", "primary")
    assert code == 1 and "only admins" in out, out
    code, out = run(world, server_url, "admin", "oncall", "feed", "rotate", "primary")
    assert code == 0 and "the old calendar URL is revoked" in out, out
    new = out.split("calendar (no login): ")[1].split()[0]
    assert new.startswith(f"{server_url}/api/v1/oncall/feeds/primary.") and new != old
    with httpx.Client() as http:
        assert http.get(old).status_code == 403
        assert http.get(new).status_code == 200
