"""Job notifications end to end: a real server subprocess (its shipped `job-notify` loop, the local
engine running the job), a real SMTP server and a real webhook receiver. A job that fails mails
and posts its owner once each, with the reason and the last lines of its real log; `corral show`
says what was sent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from tests.notify.conftest import LOOPBACK
from tests.oncall.conftest import Smtp
from tests.server_fixture import submit_spec, wait_for, wait_state
from tests.server_harness import CorralServer, start_server
from tests.webhook_server import WebhookServer


@pytest.fixture
def server(tmp_path: Path, smtp: Smtp) -> Iterator[CorralServer]:
    home = tmp_path / "home"
    smtp.write_monitor_yml(home)
    env = {"CORRAL_WEBHOOK_ALLOW_NETWORKS": LOOPBACK, "CORRAL_PUBLIC_URL": "http://corral.test"}
    srv = start_server(home, virtual_gpus=1, extra_env=env)
    try:
        yield srv
    finally:
        srv.stop()


def test_a_failing_job_mails_and_posts_its_owner_once(
    server: CorralServer, smtp: Smtp, hook: WebhookServer
) -> None:
    with server.client() as api:
        assert api.put("/api/v1/users/admin/email", json={"email": "admin@example.org"}).status_code == 200
        added = api.post("/api/v1/users/admin/contacts", json={"kind": "webhook", "address": hook.url})
        assert added.status_code == 201, added.text
        spec = {
            "name": "doomed",
            "command": "for i in $(seq 1 40); do echo line $i; done; echo 'boom: bad input'; exit 3",
            "notify": {"on": ["failed", "succeeded"]},
        }
        job_id = submit_spec(api, spec)
        assert wait_state(api, job_id, ("failed", "succeeded", "cancelled"))["state"] == "failed"
        assert smtp.inbox.wait_for(1, 20), "no mail came"
        wait_for(lambda: hook.posts, 20, what="the webhook's POST")
        notes = wait_for(
            lambda: (
                (n := api.get(f"/api/v1/jobs/{job_id}/notifications").json())
                and all(d["state"] == "sent" for d in n[0]["deliveries"])
                and n
            ),
            20,
            what="both deliveries to be sent",
        )
    assert smtp.inbox.to() == ["admin@example.org"]
    body = smtp.inbox.messages[0].get_payload(decode=True).decode()  # type: ignore[union-attr]
    assert f"Job {job_id} (doomed) failed" in body and "exit code 3" in body, body
    assert body.rstrip().endswith("boom: bad input") and "line 40" in body and "line 5\n" not in body, body
    assert f"http://corral.test/jobs/{job_id}" in body
    ((_, posted),) = hook.posts
    assert [(i["job_id"], i["event"]) for i in posted["notifications"]] == [(job_id, "failed")]
    assert sorted(d["kind"] for d in notes[0]["deliveries"]) == ["email", "webhook"]
    shown = CliRunner().invoke(
        cli, ["show", str(job_id)], env={"CORRAL_URL": server.url, "CORRAL_TOKEN": server.token}
    )
    assert shown.exit_code == 0, shown.output
    assert "notify: succeeded, failed to all your contacts" in shown.output
    assert "failed" in shown.output and "email sent; webhook sent" in shown.output, shown.output
    assert len(smtp.inbox.messages) == 1 and len(hook.posts) == 1  # once each, whatever passes ran since
