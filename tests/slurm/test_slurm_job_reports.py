"""What a job reports, end to end on Slurm: a REAL Corral server subprocess (`CORRAL_ENGINE=slurm`)
over the session's REAL Slurm cluster, a real webhook receiver. A job with labels and
`notify: {on: [end, failed], to: [webhook]}` that appends points to `$CORRAL_OUTPUTS/metrics.jsonl`
(written on the node, as the job's own Unix account) is found by `GET /jobs?label=`, its points come
back from `GET /jobs/{id}/metrics`, and its end is posted to the webhook once, with the event,
as `GET /jobs/{id}/notifications` says."""

from __future__ import annotations

import pwd
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.storage.layout import outputs_dir
from tests.notify.conftest import LOOPBACK
from tests.server_fixture import CorralServer, start_server, submit_spec, wait_for, wait_state
from tests.slurm.conftest import cleanup_cluster
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster
from tests.slurm.helpers import TERMINAL, gang_spec, server_env
from tests.webhook_server import WebhookServer, serve_webhook

pytestmark = pytest.mark.slurm

# Two points in the format corral.sdk.report_metrics writes (one JSON object a line,
# services/job_metrics.py) and a stray line between them, which the reading skips and counts.
REPORT = (
    'echo \'{"step": 1, "loss": 0.5}\' >> "$CORRAL_OUTPUTS/metrics.jsonl"; '
    'echo "not a point" >> "$CORRAL_OUTPUTS/metrics.jsonl"; '
    'echo \'{"step": 2, "loss": 0.25, "accuracy": 0.9}\' >> "$CORRAL_OUTPUTS/metrics.jsonl"'
)


@pytest.fixture
def storage(slurm_cluster: SlurmCluster) -> Path:
    """The server's storage root (the nodes share it; made by the server)."""
    return slurm_cluster.new_state_dir() / "storage"


@pytest.fixture
def hook() -> Iterator[WebhookServer]:
    yield from serve_webhook()


@pytest.fixture
def server(slurm_cluster: SlurmCluster, storage: Path, tmp_path: Path) -> Iterator[CorralServer]:
    cleanup_cluster(slurm_cluster)  # the cluster is shared with the engine tests of the session
    env = {
        **server_env(slurm_cluster, slurm_cluster.new_state_dir(), storage_root=storage),
        "CORRAL_WEBHOOK_ALLOW_NETWORKS": LOOPBACK,
        "CORRAL_PUBLIC_URL": "http://corral.test",
    }
    srv = start_server(tmp_path / "home", extra_env=env)
    try:
        yield srv
    finally:
        srv.stop()
        cleanup_cluster(slurm_cluster)


def test_labels_metrics_and_the_end_notification_of_a_slurm_job(
    server: CorralServer, storage: Path, hook: WebhookServer
) -> None:
    with server.client() as api:
        added = api.post("/api/v1/users/admin/contacts", json={"kind": "webhook", "address": hook.url})
        assert added.status_code == 201, added.text
        spec = gang_spec(
            "trial",
            REPORT,
            instances=1,
            gpus=1,
            labels={"experiment": "slurm-e1", "lr": "0.1"},
            notify={"on": ["end", "failed"], "to": ["webhook"]},
        )
        job_id = submit_spec(api, spec)
        other = submit_spec(api, gang_spec("other", "true", instances=1, gpus=1, labels={"experiment": "e2"}))
        done = wait_state(api, job_id, TERMINAL, timeout_s=60)
        assert done["state"] == "succeeded", done
        wait_state(api, other, TERMINAL, timeout_s=60)

        found = api.get("/api/v1/jobs", params=[("label", "experiment=slurm-e1"), ("label", "lr")])
        assert found.status_code == 200, found.text
        assert [item["id"] for item in found.json()["items"]] == [job_id]
        assert found.json()["items"][0]["labels"] == {"experiment": "slurm-e1", "lr": "0.1"}

        metrics = api.get(f"/api/v1/jobs/{job_id}/metrics")
        assert metrics.status_code == 200, metrics.text
        view = metrics.json()
        assert view["error"] is None, view
        assert view["points"] == [
            {"step": 1, "values": {"loss": 0.5}},
            {"step": 2, "values": {"loss": 0.25, "accuracy": 0.9}},
        ]
        assert (view["latest"], view["skipped"]) == ({"loss": 0.25, "accuracy": 0.9}, 1)
        # written on the node by the job's own account, in its outputs dir on the storage root
        written = outputs_dir(storage, job_id) / "metrics.jsonl"
        assert written.stat().st_uid == pwd.getpwnam(TEST_ACCOUNTS["admin"]).pw_uid

        wait_for(lambda: hook.posts, 30, what="the webhook's POST")
        notes = wait_for(
            lambda: (
                (n := api.get(f"/api/v1/jobs/{job_id}/notifications").json())
                and all(d["state"] == "sent" for d in n[0]["deliveries"])
                and n
            ),
            30,
            what="the webhook delivery to be sent",
        )
        assert [(n["event"], [d["kind"] for d in n["deliveries"]]) for n in notes] == [
            ("succeeded", ["webhook"])
        ]
    ((_, posted),) = hook.posts
    assert [(i["job_id"], i["event"]) for i in posted["notifications"]] == [(job_id, "succeeded")]
