"""Admin actions on nodes and GPUs through the API: clear answers for what does not exist."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy import select

from corral.db.audit_models import AuditRecord
from corral.db.models import Attempt, Gpu, GpuClaim, Job, Node
from tests.api.conftest import SIMPLE_JOB, World
from tests.api.helpers import add_node, make_running

API = "/api/v1"


def test_gpu_action_names_the_unknown_node_or_the_gpus_the_node_has(world: World) -> None:
    """An unknown node was answered "node 'nope' has no GPU 0", as if the node existed; a bad
    index did not say which GPUs the node has (as `corral chaos gpu` does for the same mistake)."""
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2)
        add_node(db, "cpu1", gpus=0)
        db.commit()
    admin = world.as_("admin")
    r = world.client.post(f"{API}/nodes/nope/gpus/0/quarantine", headers=admin)
    assert r.status_code == 404 and r.json()["detail"] == "no node named 'nope'", r.text
    r = world.client.post(f"{API}/nodes/n1/gpus/7/return", headers=admin)
    assert r.status_code == 404, r.text
    assert r.json()["detail"] == "node 'n1' has no GPU 7 (it has GPUs 0, 1)"
    r = world.client.post(f"{API}/nodes/cpu1/gpus/0/quarantine", headers=admin)
    assert r.status_code == 404 and r.json()["detail"] == "node 'cpu1' has no GPU 0 (it has no GPUs)"
    r = world.client.post(f"{API}/nodes/n1/gpus/1/quarantine", headers=admin)
    assert r.status_code == 200 and r.json()["gpus"][1]["health"] == "quarantined", r.text


def test_a_decommissioned_node_can_be_removed_and_its_jobs_history_still_names_it(world: World) -> None:
    """Nodes were never deleted: a node taken out of the cluster stayed listed (down) for ever.
    DELETE /nodes/{name} removes one that is cordoned, drained or down with no job on it, and
    says why not otherwise; the jobs that ran there keep its name."""
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2)
        add_node(db, "n2", gpus=2)
        db.commit()
    admin = world.as_("admin")
    r = world.client.post(f"{API}/jobs", json=SIMPLE_JOB, headers=world.as_("alice"))
    assert r.status_code == 201, r.text
    job_id = int(r.json()["id"])
    with world.session_factory() as db:
        make_running(db, job_id, "n1", (1,))
    assert world.client.delete(f"{API}/nodes/n1", headers=world.as_("alice")).status_code == 403
    r = world.client.delete(f"{API}/nodes/nope", headers=admin)
    assert r.status_code == 404 and r.json()["detail"] == "no node named 'nope'"
    r = world.client.delete(f"{API}/nodes/n1", headers=admin)
    assert r.status_code == 409, r.text
    assert r.json()["detail"] == (
        "node 'n1' is ready: only a cordoned, drained or down node can be removed (cordon or drain it first)"
    )
    assert world.client.post(f"{API}/nodes/n1/drain", headers=admin).status_code == 200
    r = world.client.delete(f"{API}/nodes/n1", headers=admin)
    assert r.status_code == 409 and f"node 'n1' still has job {job_id} placed on it" in r.json()["detail"]
    assert world.client.post(f"{API}/jobs/{job_id}/cancel", headers=admin).status_code == 200
    with world.session_factory() as db:  # the job ended, as the reconcile loop would record it
        db.execute(sa.delete(GpuClaim))
        db.execute(sa.update(Attempt).values(state="cancelled"))
        db.execute(sa.update(Job).values(state="cancelled"))
        db.commit()
    r = world.client.delete(f"{API}/nodes/n1", headers=admin)
    assert r.status_code == 204, r.text
    assert [n["name"] for n in world.client.get(f"{API}/nodes", headers=admin).json()] == ["n2"]
    with world.session_factory() as db:
        assert db.get(Node, "n1") is None and db.scalars(select(Gpu.node_name)).all() == ["n2", "n2"]
        record = db.scalars(select(AuditRecord).where(AuditRecord.action == "node.remove")).one()
        assert record.target_id == "n1" and record.before == {"state": "draining", "admin_state": "draining"}
    r = world.client.get(f"{API}/jobs/{job_id}", headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    assert r.json()["attempts"][0]["placement"][0]["node"] == "n1"
