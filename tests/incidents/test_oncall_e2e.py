"""From fault to page on one real server (local engine, virtual GPUs, the shipped rules and the
shipped loop intervals) with a real SMTP server (aiosmtpd): `corral chaos gpu ecc` under a running
job opens one SEV2 incident, which pages the on-call of the `incidents` policy; nobody acks
within the (shortened) step delay, so the secondary is emailed; the remedy quarantined the GPU
and the job runs again on another GPU; the link in the primary's email acknowledges the
incident and stops the escalation; clearing the fault resolves the incident."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from email.message import Message
from pathlib import Path

import httpx
import pytest

from tests.incidents.test_live import TERMINAL, corral, incidents, running_gpu
from tests.oncall.conftest import Inbox, Smtp
from tests.server_fixture import CorralServer, start_server, submit_spec, wait_for, wait_state

LINK = re.compile(r"(http://127\.0\.0\.1:\d+/api/v1/ack/\S+)")
STEP_S = 3.0  # the primary's step: the secondary is emailed this long after the primary
REPEAT_S = 5.0  # the secondary's step: round 2 would email the primary again this long after


def pages(inbox: Inbox) -> list[tuple[float, Message]]:
    """(arrival, message) of the page emails; the channel's own alert emails to ops@ also arrive."""
    return [(at, m) for at, m in zip(inbox.arrived, inbox.messages, strict=True) if m["X-Corral-Page"]]


def wait_pages(inbox: Inbox, count: int, timeout: float) -> list[tuple[float, Message]]:
    with inbox.changed:
        inbox.changed.wait_for(lambda: len(pages(inbox)) >= count, timeout)
        return pages(inbox)


@pytest.fixture
def server(tmp_path: Path, smtp: Smtp) -> Iterator[CorralServer]:
    home = tmp_path / "home"
    smtp.write_monitor_yml(home)
    srv = start_server(home)
    try:
        yield srv
    finally:
        srv.stop()


def on_call_setup(c: httpx.Client) -> None:
    """primary and secondary, each on a schedule of their own; the `incidents` policy pages the
    primary's schedule, then the secondary's, and repeats."""
    for name in ("primary", "secondary"):
        assert c.post("/api/v1/users", json={"name": name}).status_code == 201
        r = c.put(f"/api/v1/users/{name}/email", json={"email": f"{name}@example.org"})
        assert r.status_code == 200, r.text
        layer = {"rotation": "weekly", "start_date": "2026-01-05", "members": [name]}
        r = c.put(f"/api/v1/oncall/schedules/{name}-rota", json={"layers": [layer]})
        assert r.status_code == 201, r.text
    steps = [
        {"schedule": "primary-rota", "wait_minutes": STEP_S / 60},
        {"schedule": "secondary-rota", "wait_minutes": REPEAT_S / 60},
    ]
    r = c.put("/api/v1/oncall/policies/incidents", json={"steps": steps, "repeat": 2})
    assert r.status_code == 201, r.text


def test_an_ecc_fault_pages_escalates_is_acked_by_link_and_resolves(server: CorralServer, smtp: Smtp) -> None:
    with server.client() as c:
        on_call_setup(c)
        task = {"command": "sleep 120", "resources": {"gpus": 1}}
        job_id = submit_spec(c, {"name": "ecc", "tasks": {"main": task}})
        bad = running_gpu(c, job_id, 1)
        corral(server, "chaos", "gpu", "ecc", "local", str(bad), "--home", str(server.home))
        fault_at = time.time()  # the fault is in place once the command returns (its start-up not counted)
        (incident,) = wait_for(lambda: incidents(c) or None, 30, what="an incident")
        to_incident = incident["opened_at"] - fault_at
        assert incident["severity"] == "SEV2", incident

        mails = wait_pages(smtp.inbox, 1, 30)
        assert mails, "the primary was not paged"
        to_email = mails[0][0] - fault_at
        print(f"\nfault -> incident {to_incident:.2f} s; fault -> first page email {to_email:.2f} s")
        first = mails[0][1]
        assert first["To"] == "primary@example.org"
        subject = " ".join(str(first["Subject"]).split())  # a long header arrives folded
        assert subject == " ".join(f"[Corral page] [SEV2] {incident['title']}".split()), subject
        assert first["X-Corral-Page"] == f"incident:{incident['id']}"
        body = first.get_payload(decode=True).decode()  # type: ignore[union-attr]
        assert f"/incidents/{incident['id']}" in body and f"local/{bad}" in body, body
        link = LINK.search(body)
        assert link is not None, body

        mails = wait_pages(smtp.inbox, 2, 30)
        assert [str(m["To"]) for _, m in mails] == ["primary@example.org", "secondary@example.org"]
        assert mails[1][0] - mails[0][0] >= STEP_S - 0.5  # not before the step's delay

        again = running_gpu(c, job_id, 2)
        assert again != bad
        (node,) = c.get("/api/v1/nodes").json()
        assert node["gpus"][bad]["health"] == "quarantined"

        acked = httpx.post(link.group(1), timeout=10)  # no token: the link is the credential
        assert acked.status_code == 200, acked.text
        seen = len(pages(smtp.inbox))
        shown = c.get(f"/api/v1/incidents/{incident['id']}").json()
        assert shown["state"] == "acknowledged" and shown["acknowledged_by"] == "primary", shown
        timeline = " | ".join(e["text"] for e in shown["timeline"])
        assert "paged via policy incidents" in timeline and "acknowledged by primary" in timeline, timeline
        assert len(incidents(c)) == 1  # one incident for the fault, whatever else fired
        time.sleep(REPEAT_S + 2)  # round 2 would have emailed the primary by now
        assert len(pages(smtp.inbox)) == seen, smtp.inbox.to()

        corral(server, "chaos", "gpu", "clear", "local", str(bad), "--home", str(server.home))
        wait_for(lambda: incidents(c, state="resolved") or None, 30, what="the incident resolved")
        key = f"incident:{incident['id']}"
        (page,) = [p for p in c.get("/api/v1/oncall/pages").json() if p["key"] == key]
        assert page["state"] == "acknowledged" and page["acked_by"] == "primary", page
        c.post(f"/api/v1/jobs/{job_id}/cancel")
        wait_state(c, job_id, TERMINAL)
