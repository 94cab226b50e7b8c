"""One alert is one fault, so one incident: a CorralGpuEccErrors from Alertmanager matches the
shipped gpu-fault rule and the shipped alertmanager rule (every Alertmanager alert), and each
opened an incident of its own, both paged, for the same GPU. The later rule's incident action
now joins the incident the first one opened; an alert only the alertmanager rule matches still
opens its own."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select

from corral.db.incident_models import Incident, RemediationRun
from corral.monitor.alerts import record_alert
from corral.services import incidents
from tests.incidents.test_rules import apply, make_world


def test_an_alertmanager_gpu_alert_opens_one_incident_that_both_rules_act_in(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    labels = {"alertname": "CorralGpuEccErrors", "severity": "critical", "node": "n1", "gpu": "0"}
    now = time.time()
    with world.ctx.session_factory() as session:
        summary = {"summary": "GPU 0 on n1 has 1 uncorrectable ECC error(s)"}
        record_alert(session, labels=labels, status="firing", now=now, channels=[], source="alertmanager",
                     annotations=summary, fingerprint="am-ecc-n1-0")  # fmt: skip
        session.commit()
        (incident,) = session.scalars(select(Incident)).all()
        assert (incident.fingerprint, incident.severity) == ("gpu/n1/0", "SEV2")
        runs = {r.rule: r for r in session.scalars(select(RemediationRun))}
        assert set(runs) == {"gpu-fault", "alertmanager"}
        assert runs["gpu-fault"].incident_id == runs["alertmanager"].incident_id == incident.id
        joined = runs["alertmanager"].actions[0]["result"]
        assert joined == f"incident {incident.id} (SEV2), opened for this alert by rule gpu-fault"
        remedies = [
            e["text"]
            for e in incidents.detail(session, incident.id, now)["timeline"]
            if e["kind"] == "remedy"
        ]
        assert [t.split(" (rules")[0] for t in remedies] == ["remedy gpu-fault", "remedy alertmanager"]

        record_alert(session, labels=labels, status="resolved", now=now + 5, channels=[],
                     source="alertmanager", fingerprint="am-ecc-n1-0")  # fmt: skip
        session.commit()
        session.refresh(incident)
        assert incident.state == "resolved"


def test_an_alert_only_the_alertmanager_rule_matches_still_opens_its_own(tmp_path: Path) -> None:
    world = make_world(tmp_path)
    with world.ctx.session_factory() as session:
        for name, fingerprint in (("CorralGpuEccErrors", "am-ecc"), ("DiskFull", "am-disk")):
            labels = {"alertname": name, "severity": "warning", "node": "n1", "gpu": "1"}
            summary = {"summary": name}
            record_alert(session, labels=labels, status="firing", now=time.time(), channels=[],
                         source="alertmanager", annotations=summary, fingerprint=fingerprint)  # fmt: skip
        session.commit()
        titles = sorted(i.title for i in session.scalars(select(Incident)))
    assert titles == ["CorralGpuEccErrors", "DiskFull"]


SEV3_THEN_SEV1 = """version: 1
rules:
  - name: ecc-note
    match: {name: [CorralGpuEccErrors]}
    actions:
      - incident: {severity: SEV3, key: "gpu/{node}/{gpu}", title: "{summary}"}
  - name: critical-alerts
    match: {source: alertmanager}
    actions:
      - incident: {severity: SEV1}
"""


def test_a_later_rule_that_asks_for_a_more_severe_incident_raises_the_joined_one(tmp_path: Path) -> None:
    """The joined incident keeps the first rule's key, but not a lower severity: a SEV1 rule that
    matched the alert after a SEV3 one gave a SEV3 incident (an hour's ack SLA, no postmortem)."""
    world = make_world(tmp_path)
    apply(world, SEV3_THEN_SEV1)
    labels = {"alertname": "CorralGpuEccErrors", "severity": "critical", "node": "n1", "gpu": "0"}
    now = time.time()
    with world.ctx.session_factory() as session:
        record_alert(session, labels=labels, status="firing", now=now, channels=[], source="alertmanager",
                     annotations={"summary": "ecc on n1/0"}, fingerprint="fp1")  # fmt: skip
        session.commit()
        (incident,) = session.scalars(select(Incident)).all()
        assert (incident.fingerprint, incident.severity) == ("gpu/n1/0", "SEV1")
        raised = [
            e["text"]
            for e in incidents.detail(session, incident.id, now)["timeline"]
            if e["kind"] == "severity"
        ]
        assert raised == ["raised SEV3 -> SEV1: rule critical-alerts: ecc on n1/0"]
