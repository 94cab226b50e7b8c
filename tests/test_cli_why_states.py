"""`corral why` of a job that does not wait: one being preempted goes back to the queue (it said
"job 7 is preempted: it is not waiting"), one that ended says so ("job 3 is succeeded"). The
server is a mock transport answering GET /jobs/{id}."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import jobs as cli_jobs
from corral.cli.main import app
from corral.sdk import Client

REASON = "reclaimed by group nlp for job 14: this job ran on borrowed quota"


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ("preempted", f"job 7 is being preempted ({REASON}): it goes back to the queue once it has stopped"),
        ("succeeded", "job 7 has ended (succeeded): it is not waiting"),
        ("running", "job 7 is running: it is not waiting"),
    ],
)
def test_why_of_a_job_that_does_not_wait(monkeypatch: pytest.MonkeyPatch, state: str, said: str) -> None:
    job = {"id": 7, "name": "low", "state": state, "reason": REASON, "diagnosis": None}
    assert said in why(monkeypatch, job)


def test_why_of_a_preempted_job_whose_cancel_was_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job being stopped for a preemption and a cancel at once ends CANCELLED, not back in the
    queue (settle rule 2 before rule 3), its reason the cancel's words (d0def6d): `corral why` said
    'job 7 is being preempted (cancel requested by alice): it goes back to the queue ...'."""
    job = {"id": 7, "name": "low", "state": "preempted", "diagnosis": None}
    job |= {"reason": "cancel requested by alice", "cancel_requested": True}
    said = why(monkeypatch, job)
    assert "job 7 is being stopped (cancel requested by alice): it ends cancelled once it has stopped" in said
    assert "back to the queue" not in said


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ("Slurm holds it pending: Resources", "placed on node1; Slurm holds it pending: Resources"),
        ("", "placed on node1; its processes are being started"),
    ],
)
def test_why_of_a_placed_job_says_where_and_what_the_engine_says(
    monkeypatch: pytest.MonkeyPatch, message: str, said: str
) -> None:
    """A starting job (Slurm may hold it pending for a long time): it said "the scheduler has not
    looked at it yet" of a job the scheduler had placed, and nothing of Slurm's reason."""
    attempt = {"number": 1, "nodes": ["node1"], "message": message}
    out = why(
        monkeypatch, {"id": 7, "name": "next", "state": "starting", "diagnosis": None, "attempts": [attempt]}
    )
    assert said in out and "has not looked" not in out, out


def why(monkeypatch: pytest.MonkeyPatch, job: dict[str, Any]) -> str:
    """What `corral why 7` prints, as one line (Rich wraps), the server answering `job`."""

    def client() -> Any:
        return Client(
            "http://corral.test",
            "token",
            transport=httpx.MockTransport(lambda r: httpx.Response(200, json=job)),
        )

    monkeypatch.setattr(cli_jobs, "client", client)
    result = CliRunner().invoke(app, ["why", "7"])
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())
