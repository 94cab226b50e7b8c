"""Admin actions on nodes and GPUs through the API: clear answers for what does not exist."""

from __future__ import annotations

from tests.api.conftest import World
from tests.api.helpers import add_node

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
