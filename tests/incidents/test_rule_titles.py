"""The shipped gpu-fault rule's incident title is the fault's summary, which names the GPU and
node already: the title template "GPU {gpu} on {node}: {summary}" read "GPU 0 on vm: GPU 0 on vm
has 1 uncorrectable ECC error(s) since its last reset" in `corral incident ls`, the page's
subject and the portal."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from corral.db.incident_models import Incident
from corral.services import remediation
from tests.incidents.test_rules import make_world

# Each signal the rule matches, with the summary its producer writes: the health check
# (corral.monitor.health._check_gpu), the diagnosis watch (corral.diagnosis.watch._act_on_fault)
# and the shipped Prometheus rule (deploy/prometheus/rules/corral-hardware.yml) through Alertmanager.
SIGNALS = [
    ("CorralGpuEccErrors", "corral", "GPU 0 on n1 has 1 uncorrectable ECC error since its last reset"),
    ("CorralGpuLost", "corral", "GPU 0 on n1 fell off the bus"),
    ("GpuFault", "event", "GPU 0 on n1: Xid 79"),
    ("CorralGpuEccErrors", "alertmanager", "GPU 0 on n1 has 2 uncorrectable ECC error(s)"),
]


@pytest.mark.parametrize(("name", "source", "summary"), SIGNALS)
def test_a_gpu_fault_incident_is_titled_by_its_summary_alone(
    tmp_path: Path, name: str, source: str, summary: str
) -> None:
    world = make_world(tmp_path)
    labels = {"node": "n1", "gpu": "0", "severity": "critical"}
    with world.ctx.session_factory() as session:
        signal = remediation.Signal(name, labels, source=source, summary=summary)
        remediation.on_signal(session, signal, time.time())
        session.commit()
        # (from Alertmanager the shipped `alertmanager` rule opens an incident of its own as well)
        (incident,) = session.scalars(select(Incident).where(Incident.fingerprint == "gpu/n1/0")).all()
    assert incident.title == summary
