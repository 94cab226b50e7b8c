"""The Alertmanager webhook: authentication, validation, fingerprint deduplication, listing."""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import func, select

from corral.db.incident_models import RemediationRun
from corral.monitor.alerts import fingerprint_of, record_alert
from corral.monitor.models import Alert, AlertNotification
from tests.monitor.conftest import WEBHOOK_TOKEN, Mon

URL = "/api/v1/alerts/webhook"
AUTH = {"Authorization": f"Bearer {WEBHOOK_TOKEN}"}


def payload(
    status: str = "firing", starts: str = "2026-11-21T06:00:00.123456789Z", **labels: str
) -> dict[str, Any]:
    alert_labels = {
        "alertname": "CorralGpuEccErrors",
        "severity": "critical",
        "node": "n1",
        "gpu": "0",
        **labels,
    }
    return {
        "version": "4",
        "status": status,
        "receiver": "corral",
        "groupKey": '{}:{alertname="CorralGpuEccErrors"}',
        "alerts": [
            {
                "status": status,
                "labels": alert_labels,
                "annotations": {"summary": "GPU 0 on n1 has 3 uncorrectable ECC error(s)"},
                "startsAt": starts,
                "endsAt": "0001-01-01T00:00:00Z" if status == "firing" else "2026-11-21T06:05:00Z",
                "generatorURL": "http://prometheus/graph",
                "fingerprint": "f00dfeed" + labels.get("gpu", "0"),
            }
        ],
    }


def counts(mon: Mon) -> tuple[int, int]:
    with mon.factory() as db:
        return (
            db.scalar(select(func.count()).select_from(Alert)) or 0,
            db.scalar(select(func.count()).select_from(AlertNotification)) or 0,
        )


@pytest.mark.parametrize(
    ("headers", "reason"),
    [
        ({}, "missing or wrong bearer token"),
        ({"Authorization": "Bearer not-the-secret"}, "missing or wrong bearer token"),
        ({"Authorization": f"Basic {WEBHOOK_TOKEN}"}, "missing or wrong bearer token"),
    ],
)
def test_unauthenticated_is_401_and_changes_nothing(mon: Mon, headers: dict[str, str], reason: str) -> None:
    with mon.app_client() as client:
        response = client.post(URL, json=payload(), headers=headers)
    assert response.status_code == 401
    assert reason in response.json()["detail"]
    assert counts(mon) == (0, 0)


def test_no_token_configured_refuses_everyone(mon: Mon, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CORRAL_MONITOR_WEBHOOK_TOKEN")
    with mon.app_client() as client:
        response = client.post(URL, json=payload(), headers=AUTH)
        assert response.status_code == 401
        assert "no token configured" in response.json()["detail"]
        assert "alert_webhook_token in CORRAL_HOME" in response.json()["detail"]  # where it may be put
        # The token file under CORRAL_HOME works as well (Alertmanager's credentials_file).
        (mon.home / "alert_webhook_token").write_text("from-file\n")
        assert (
            client.post(URL, json=payload(), headers={"Authorization": "Bearer from-file"}).status_code == 200
        )


def _broken(kind: str) -> Any:
    body = payload()
    if kind == "no_alerts":
        body["alerts"] = []
    elif kind == "bad_status":
        body["alerts"][0]["status"] = "exploded"
    elif kind == "no_labels":
        body["alerts"][0]["labels"] = {}
    elif kind == "bad_time":
        body["alerts"][0]["startsAt"] = "yesterday"
    elif kind == "missing_starts":
        del body["alerts"][0]["startsAt"]
    return body


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("no_alerts", "alerts"),
        ("bad_status", "alerts.0.status"),
        ("no_labels", "alerts.0.labels"),
        ("bad_time", "not an RFC 3339 time: 'yesterday'"),
        ("missing_starts", "alerts.0.startsAt"),
    ],
)
def test_malformed_payload_is_400_with_the_reason(mon: Mon, kind: str, reason: str) -> None:
    with mon.app_client() as client:
        response = client.post(URL, json=_broken(kind), headers=AUTH)
    assert response.status_code == 400, response.text
    assert reason in response.json()["detail"]
    assert counts(mon) == (0, 0)


def test_not_json_is_400(mon: Mon) -> None:
    with mon.app_client() as client:
        response = client.post(URL, content=b"{nope", headers={**AUTH, "Content-Type": "application/json"})
    assert response.status_code == 400
    assert "not JSON" in response.json()["detail"]
    assert counts(mon) == (0, 0)


def test_alerts_are_stored_deduplicated_and_resolved(mon: Mon) -> None:
    (mon.home / "monitor.yml").write_text(
        "channels:\n  - {name: ops, type: webhook, url: 'http://127.0.0.1:9/hook'}\n"
    )
    with mon.app_client() as client:
        first = client.post(URL, json=payload(), headers=AUTH)
        assert first.status_code == 200 and first.json() == {"received": 1, "changed": 1}
        # Alertmanager re-sends the same firing alert every group_interval: one row, no new notice.
        again = client.post(URL, json=copy.deepcopy(payload()), headers=AUTH)
        assert again.json() == {"received": 1, "changed": 0}
        assert counts(mon) == (1, 1)
        other = client.post(URL, json=payload(gpu="1"), headers=AUTH)
        assert other.json()["changed"] == 1
        resolved = client.post(URL, json=payload("resolved"), headers=AUTH)
        assert resolved.json()["changed"] == 1
        # A late resolve of an older episode of the same alert changes nothing.
        stale = client.post(URL, json=payload("resolved", starts="2026-11-20T06:00:00Z"), headers=AUTH)
        assert stale.json()["changed"] == 0

        listing = client.get("/api/v1/alerts", headers=mon.admin).json()
        firing = client.get("/api/v1/alerts", params={"status": "firing"}, headers=mon.admin).json()
        assert client.get("/api/v1/alerts").status_code == 401
    assert listing["total"] == 2
    by_fp = {a["fingerprint"]: a for a in listing["items"]}
    gpu0 = by_fp["f00dfeed0"]
    assert gpu0["status"] == "resolved" and gpu0["receive_count"] == 4 and gpu0["source"] == "alertmanager"
    assert gpu0["labels"]["node"] == "n1" and gpu0["severity"] == "critical"
    assert gpu0["ends_at"] is not None and gpu0["starts_at"] == pytest.approx(1795240800.123456, abs=1e-3)
    assert [a["fingerprint"] for a in firing["items"]] == ["f00dfeed1"]
    with mon.factory() as db:
        notes = db.execute(select(AlertNotification.alert_status, AlertNotification.state)).all()
    # One notification per status change per channel: gpu0 firing, gpu1 firing, gpu0 resolved.
    assert sorted(notes) == [("firing", "pending"), ("firing", "pending"), ("resolved", "pending")]


@contextlib.contextmanager
def _delivered_meanwhile(mon: Mon, other: Callable[[], None]) -> Iterator[None]:
    """Run `other` (another delivery, committed) right after this transaction's first read of the
    alerts table, i.e. between its read and its write."""
    done: list[bool] = []

    def after(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if not done and statement.lstrip().upper().startswith("SELECT") and " alerts" in statement:
            done.append(True)
            other()

    sa.event.listen(mon.engine, "after_cursor_execute", after)
    try:
        yield
    finally:
        sa.event.remove(mon.engine, "after_cursor_execute", after)
    assert done, "the other delivery did not run"


@pytest.mark.parametrize("first", ["resolved", None])  # a stored alert changing, or a new one
def test_one_change_delivered_twice_at_once_is_one_change(mon: Mon, first: str | None) -> None:
    """An Alertmanager HA pair delivers the same change twice; two servers (or one's threads) may
    record both at once. One change: one notification per channel, one remediation run."""
    labels = {"alertname": "CorralGpuEccErrors", "severity": "critical", "node": "n1", "gpu": "0"}

    def deliver(status: str) -> bool:
        with mon.factory() as db:
            change = record_alert(
                db, labels=labels, status=status, now=time.time(), channels=["ops"], source="x"
            )
            db.commit()
            return change.changed

    if first is not None:
        assert deliver(first)
    with mon.factory() as db:
        runs_before = len(db.scalars(select(RemediationRun.signal)).all())
    changes: list[bool] = []
    with _delivered_meanwhile(mon, lambda: changes.append(deliver("firing"))):
        changes.append(deliver("firing"))
    assert changes == [True, False]
    with mon.factory() as db:
        notes = db.scalars(select(AlertNotification.alert_status)).all()
        runs = db.scalars(select(RemediationRun.signal)).all()
    assert sorted(notes) == sorted([*([first] if first else []), "firing"])
    assert runs.count("CorralGpuEccErrors") == runs_before + 1  # the ECC rule ran once for the firing


@pytest.mark.parametrize("bad", ["abc\ndef", "abc\rdef", "tab\there", "nel\x85x", "ls\u2028x"])
def test_a_fingerprint_with_a_control_character_is_replaced_by_its_labels_own(mon: Mon, bad: str) -> None:
    """review113 #2: a fingerprint is the dedup key and an email header's value; one holding a
    line break was stored, and every email notification of its alert then failed. review114 #8:
    refusing it (400) dropped the whole batch, the good alerts too, and Alertmanager does not
    retry a 4xx: the alert is stored under its labels' fingerprint, the others as sent."""
    body = payload()
    good = copy.deepcopy(body["alerts"][0])
    good["labels"]["gpu"], good["fingerprint"] = "1", "f00dfeed1"
    body["alerts"][0]["fingerprint"] = bad
    body["alerts"].append(good)
    with mon.app_client() as client:
        response = client.post(URL, json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    with mon.factory() as db:
        stored = {a.fingerprint: a.labels for a in db.scalars(select(Alert))}
    assert stored == {
        fingerprint_of(body["alerts"][0]["labels"]): body["alerts"][0]["labels"],
        "f00dfeed1": good["labels"],
    }
