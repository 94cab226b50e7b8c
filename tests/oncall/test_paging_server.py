"""Paging through a real server's `paging` loop (a subprocess, its shipped 1 s interval, woken when
a page starts) and a real SMTP server: with a step delay shortened to seconds, the primary is emailed,
nobody acks, the secondary is emailed; the link in the primary's email, opened against the
server, acknowledges; no third email ever comes."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.oncall.conftest import Smtp
from tests.server_harness import CorralServer, start_server

LINK = re.compile(r"(http://127\.0\.0\.1:\d+/api/v1/ack/\S+)")


@pytest.fixture
def server(tmp_path: Path, smtp: Smtp) -> Iterator[CorralServer]:
    home = tmp_path / "home"
    smtp.write_monitor_yml(home)
    srv = start_server(home, virtual_gpus=1)
    try:
        yield srv
    finally:
        srv.stop()


def test_real_loop_escalates_on_time_and_the_link_stops_it(server: CorralServer, smtp: Smtp) -> None:
    with server.client() as api:
        for name in ("primary", "secondary"):
            assert api.post("/api/v1/users", json={"name": name}).status_code == 201
            assert (
                api.put(f"/api/v1/users/{name}/email", json={"email": f"{name}@example.org"}).status_code
                == 200
            )
        layer = {"rotation": "weekly", "start_date": "2026-01-05", "members": ["primary"]}
        assert api.put("/api/v1/oncall/schedules/first", json={"layers": [layer]}).status_code == 201
        # Without an ack, round 2 would email the primary again 4 s after the secondary.
        steps = [{"schedule": "first", "wait_minutes": 2 / 60}, {"user": "secondary", "wait_minutes": 4 / 60}]
        assert api.put("/api/v1/oncall/policies/gpu", json={"steps": steps, "repeat": 3}).status_code == 201
        started = time.time()
        made = api.post(
            "/api/v1/oncall/pages", json={"policy": "gpu", "subject": "ECC on GPU 0", "key": "inc:1"}
        )
        assert made.status_code == 201, made.text
        assert smtp.inbox.wait_for(1, 10), "the primary was not emailed"
        first_at = smtp.inbox.arrived[0] - started
        assert smtp.inbox.to() == ["primary@example.org"]
        assert smtp.inbox.wait_for(2, 15), "the secondary was not emailed after the step's delay"
        assert smtp.inbox.to() == ["primary@example.org", "secondary@example.org"]
        # Not before the step's delay, which runs from when the first step ran (at the page's
        # start: services/paging.py sets next_at = the step's run + wait_s), not from when its
        # email arrived: under load the first email can take a second to be sent, and the second
        # then lands less than 2 s after it (seen in a CI run: 1.02 s) though on time.
        assert smtp.inbox.arrived[1] - started >= 2.0, smtp.inbox.arrived[1] - started
        body = smtp.inbox.messages[0].get_payload(decode=True).decode()  # type: ignore[union-attr]
        link = LINK.search(body)
        assert link is not None, body
    acked = httpx.post(link.group(1), timeout=10)  # no token: the link is the credential
    assert acked.status_code == 200, acked.text
    assert acked.json()["acked_by"] == "primary"
    seen = len(smtp.inbox.messages)
    time.sleep(7)  # round 2 would have emailed the primary by now
    assert len(smtp.inbox.messages) == seen
    with server.client() as api:
        page = api.get(f"/api/v1/oncall/pages/{made.json()['id']}").json()
    assert page["state"] == "acknowledged"
    assert first_at < 5.0, f"page start -> first email took {first_at:.2f} s"
