"""Health checks without Prometheus: virtual GPU faults (injected by the real `corral chaos` CLI
into the fault file), lost nodes and job OOMs become alerts and job events."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from sqlalchemy import select, update

from corral.db.diag_models import AttemptFault
from corral.db.models import Attempt, GpuClaim, JobEvent, Node
from corral.monitor.config import HealthRules
from corral.monitor.gpu import GpuSampler, read_faults, update_fault
from corral.monitor.health import check_nodes, check_ooms, sample_and_check_gpus
from corral.monitor.models import Alert, GpuReading
from tests.monitor.conftest import Mon
from tests.monitor.test_metrics import one, scrape

RULES = HealthRules(xid_alert_hold=60.0)


def corral_cli(mon: Mon, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_HOME": str(mon.home)}
    return subprocess.run(
        [sys.executable, "-m", "corral.cli.main", *args], capture_output=True, text=True, env=env, timeout=60
    )


def alerts(mon: Mon, name: str) -> list[Alert]:
    with mon.factory() as db:
        return list(db.scalars(select(Alert).where(Alert.name == name, Alert.source == "corral")))


def events(mon: Mon, job_id: int) -> list[str]:
    with mon.factory() as db:
        return list(
            db.scalars(select(JobEvent.message).where(JobEvent.job_id == job_id, JobEvent.kind == "health"))
        )


def held_gpu(mon: Mon) -> tuple[str, int, int]:
    with mon.factory() as db:
        claim = db.scalars(select(GpuClaim).order_by(GpuClaim.node, GpuClaim.gpu_index)).first()
        assert claim is not None
        return claim.node, claim.gpu_index, claim.job_id


def tick(mon: Mon, now: float | None = None) -> None:
    sampler = GpuSampler(mon.home, "not-this-machine")
    with mon.factory() as db:
        sample_and_check_gpus(db, sampler, time.time() if now is None else now, ["ops"], RULES)


def test_ecc_injected_by_the_cli_fires_and_clears(mon: Mon) -> None:
    node, index, job_id = held_gpu(mon)
    tick(mon)
    assert alerts(mon, "CorralGpuEccErrors") == []

    result = corral_cli(mon, "chaos", "gpu", "ecc", node, str(index), "--count", "3", "--home", str(mon.home))
    assert result.returncode == 0, result.stderr
    assert read_faults(mon.home)[f"{node}/{index}"]["ecc_volatile_uncorrected"] == 3
    tick(mon)
    (alert,) = alerts(mon, "CorralGpuEccErrors")
    assert alert.status == "firing" and alert.labels["node"] == node and alert.labels["gpu"] == str(index)
    assert any("3 new uncorrectable ECC errors" in e for e in events(mon, job_id))
    with mon.app_client() as client:
        m = scrape(client.get("/metrics").text)
    assert (
        one(m, "corral_gpu_ecc_errors", node=node, gpu=str(index), counter="volatile", type="uncorrected")
        == 3
    )
    assert (
        one(m, "corral_gpu_ecc_errors", node=node, gpu=str(index), counter="aggregate", type="uncorrected")
        == 3
    )

    tick(mon)  # still firing: no second event, no second row
    assert len(events(mon, job_id)) == 1 and len(alerts(mon, "CorralGpuEccErrors")) == 1

    assert corral_cli(mon, "chaos", "gpu", "clear", node, str(index), "--home", str(mon.home)).returncode == 0
    tick(mon)
    (alert,) = alerts(mon, "CorralGpuEccErrors")
    assert alert.status == "resolved"
    with mon.factory() as db:
        reading = db.get(GpuReading, (node, index))
        assert reading is not None
        assert (
            reading.ecc_volatile_uncorrected == 0 and reading.ecc_aggregate_uncorrected == 3
        )  # lifetime stays


def test_lost_gpu_hot_gpu_and_xid(mon: Mon) -> None:
    node, index, job_id = held_gpu(mon)
    now = time.time()
    update_fault(mon.home, node, index, lost=True)
    update_fault(mon.home, node, index + 1, temperature_c=97)
    update_fault(mon.home, node, index + 1, xid=48)
    tick(mon, now)
    (lost,) = alerts(mon, "CorralGpuLost")
    assert lost.status == "firing" and lost.severity == "critical"
    assert alerts(mon, "CorralGpuOverheating")[0].status == "firing"
    (xid,) = alerts(mon, "CorralGpuXid")
    assert xid.status == "firing" and "Xid 48" in xid.annotations["summary"]
    assert any("was lost" in e for e in events(mon, job_id))
    with mon.app_client() as client:
        m = scrape(client.get("/metrics").text)
    assert one(m, "corral_gpu_present", node=node, gpu=str(index)) == 0
    assert not [
        lab
        for lab, _ in m["corral_gpu_utilization_percent"]
        if lab["node"] == node and lab["gpu"] == str(index)
    ]
    assert one(m, "corral_gpu_last_xid", node=node, gpu=str(index + 1)) == 48
    assert one(m, "corral_gpu_xid_events_total", node=node, gpu=str(index + 1)) == 1

    update_fault(mon.home, node, index, lost=None)
    tick(mon, now + 10)
    assert alerts(mon, "CorralGpuLost")[0].status == "resolved"
    assert alerts(mon, "CorralGpuXid")[0].status == "firing"  # held for xid_alert_hold after the event
    tick(mon, now + 80)
    assert alerts(mon, "CorralGpuXid")[0].status == "resolved"


def test_node_lost_by_heartbeat(mon: Mon) -> None:
    node, _index, job_id = held_gpu(mon)
    now = time.time()
    with mon.factory() as db:
        # silent for 5 minutes: the node loop marked it down after its heartbeat timeout
        db.execute(update(Node).where(Node.name == node).values(last_heartbeat=now - 300, state="down"))
        db.commit()
        assert check_nodes(db, now, ["ops"], RULES) == [node]
        assert check_nodes(db, now + 1, ["ops"], RULES) == [node]
    (alert,) = alerts(mon, "CorralNodeLost")
    assert alert.status == "firing" and alert.labels["node"] == node
    assert [e for e in events(mon, job_id) if f"node {node} lost" in e] != []
    assert len(events(mon, job_id)) == 1  # an edge, not a level
    with mon.factory() as db:
        db.execute(update(Node).where(Node.name == node).values(last_heartbeat=now + 2, state="ready"))
        db.commit()
        assert check_nodes(db, now + 3, ["ops"], RULES) == []
    assert alerts(mon, "CorralNodeLost")[0].status == "resolved"


def test_stale_heartbeats_of_nodes_the_node_loop_has_not_seen_yet_are_not_lost(mon: Mon) -> None:
    """A server started after a few minutes down finds every node's last heartbeat old, and its
    health loop may look before the node loop's first pass refreshes them: that must not declare
    every node lost (the node-lost rule would stop all their jobs as hardware faults and page). A
    node is lost once the node loop has marked it down (it does within its 6 s timeout) and its
    heartbeat is older than `node_lost_after`; `unknown`, what an engine outage leaves every node
    in, is not a loss (nothing is failed because of an outage)."""
    node, _index, job_id = held_gpu(mon)
    now = time.time()
    with mon.factory() as db:
        db.execute(update(Node).values(last_heartbeat=now - 300))  # the server was down 5 minutes
        db.commit()
        assert check_nodes(db, now, ["ops"], RULES) == []
        assert db.scalars(select(AttemptFault)).all() == []
    assert alerts(mon, "CorralNodeLost") == []
    assert events(mon, job_id) == []
    with mon.factory() as db:  # the engine unreachable for minutes: every node unknown
        db.execute(update(Node).values(state="unknown"))
        db.commit()
        assert check_nodes(db, now + 1, ["ops"], RULES) == []
    assert alerts(mon, "CorralNodeLost") == [] and events(mon, job_id) == []
    with mon.factory() as db:
        db.execute(update(Node).where(Node.name == node).values(state="down"))  # the node loop's verdict
        db.commit()
        assert check_nodes(db, now + 1, ["ops"], RULES) == [node]
    assert [a.labels["node"] for a in alerts(mon, "CorralNodeLost")] == [node]


def test_job_oom_becomes_an_event_and_an_alert_once(mon: Mon) -> None:
    _node, _index, job_id = held_gpu(mon)
    now = time.time()
    with mon.factory() as db:
        db.execute(
            update(Attempt)
            .where(Attempt.job_id == job_id)
            .values(state="failed", reason="oom", ended_at=now, message="memory limit 1 GiB")
        )
        db.commit()
        assert check_ooms(db, now, ["ops"], RULES) == 1
        assert check_ooms(db, now + 1, ["ops"], RULES) == 0  # already seen
    (alert,) = alerts(mon, "CorralJobOOM")
    assert alert.status == "firing" and alert.labels["job_id"] == str(job_id)
    assert any("ran out of host memory" in e for e in events(mon, job_id))
    with mon.factory() as db:
        check_ooms(db, now + RULES.oom_alert_hold + 1, ["ops"], RULES)
    assert alerts(mon, "CorralJobOOM")[0].status == "resolved"


def test_chaos_cli_rejects_bad_input(mon: Mon) -> None:
    result = corral_cli(mon, "chaos", "gpu", "util", "node0000", "0", "150", "--home", str(mon.home))
    assert result.returncode != 0
    assert "less than or equal to 100" in result.stderr
    assert read_faults(mon.home) == {}  # nothing written


def test_admin_chaos_endpoint(mon: Mon) -> None:
    from corral.db.models import User
    from corral.services import auth

    with mon.factory() as db:
        user = db.scalars(select(User).where(User.name == "user0")).one()
        _row, secret = auth.create_token(db, user, "t")
        db.commit()
    url = "/api/v1/chaos/gpus/node0001/2"
    with mon.app_client() as client:
        assert (
            client.post(
                url, json={"ecc_uncorrected": 1}, headers={"Authorization": f"Bearer {secret}"}
            ).status_code
            == 403
        )
        bad = client.post(url, json={"temperature_c": "hot"}, headers=mon.admin)
        assert bad.status_code == 422
        assert client.post(url, json={"bogus": 1}, headers=mon.admin).status_code == 422
        # a GPU the cluster does not have: refused by name, nothing written (it was "injected")
        no_node = client.post("/api/v1/chaos/gpus/nope/0", json={"ecc_uncorrected": 1}, headers=mon.admin)
        assert no_node.status_code == 404 and "no node named 'nope'" in no_node.text, no_node.text
        no_gpu = client.post("/api/v1/chaos/gpus/node0001/99", json={"ecc_uncorrected": 1}, headers=mon.admin)
        assert no_gpu.status_code == 404 and "node 'node0001' has no GPU 99 (it has GPUs 0, 1" in no_gpu.text
        assert read_faults(mon.home) == {}
        stale = client.post("/api/v1/chaos/gpus/nope/0", json={"clear": True}, headers=mon.admin)
        assert stale.status_code == 200, stale.text  # clearing a removed node's stale entry stays possible
        ok = client.post(url, json={"ecc_uncorrected": 2, "xid": 31, "temperature_c": 91}, headers=mon.admin)
        assert ok.status_code == 200, ok.text
    fault = read_faults(mon.home)["node0001/2"]
    assert (
        fault["ecc_volatile_uncorrected"] == 2
        and fault["temperature_c"] == 91
        and fault["xids"][0]["xid"] == 31
    )


def test_readings_of_removed_gpus_are_dropped(mon: Mon) -> None:
    from corral.db.models import Gpu

    tick(mon)
    with mon.factory() as db:
        assert db.get(GpuReading, ("node0001", 3)) is not None
        db.execute(Gpu.__table__.delete().where(Gpu.node_name == "node0001", Gpu.index == 3))
        db.commit()
    tick(mon)
    with mon.factory() as db:
        assert db.get(GpuReading, ("node0001", 3)) is None
        assert db.get(GpuReading, ("node0001", 2)) is not None


def test_alerts_of_a_removed_gpu_resolve(mon: Mon) -> None:
    """Readings of a GPU the cluster no longer has are dropped; its firing alerts were left
    firing for ever (nothing samples it to resolve them): now they resolve with it."""
    from corral.db.models import Gpu

    update_fault(mon.home, "node0001", 3, temperature_c=97)
    update_fault(mon.home, "node0001", 2, temperature_c=97)
    tick(mon)
    assert sorted(a.labels["gpu"] for a in alerts(mon, "CorralGpuOverheating") if a.status == "firing") == [
        "2",
        "3",
    ]
    with mon.factory() as db:
        db.execute(Gpu.__table__.delete().where(Gpu.node_name == "node0001", Gpu.index == 3))
        db.commit()
    tick(mon)
    status = {a.labels["gpu"]: a.status for a in alerts(mon, "CorralGpuOverheating")}
    assert status == {"2": "firing", "3": "resolved"}
