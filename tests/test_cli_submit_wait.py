"""`corral submit --wait` of a job that fails says why, as `corral show` does. The server is a
mock transport: the job is queued at submit and has failed at the first poll."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import jobs as cli_jobs
from corral.cli.main import app
from corral.sdk import Client

REASON = "attempt 3 failed (exit_code: exit code 3)"


def answer(request: httpx.Request) -> httpx.Response:
    job = {"id": 5, "name": "flaky", "group": "vision", "state": "queued", "reason": None}
    if request.method == "GET":
        job |= {"state": "failed", "reason": REASON}
    return httpx.Response(201 if request.method == "POST" else 200, json=job)


@pytest.mark.parametrize("output", ["table", "json"])
def test_submit_wait_of_a_failed_job_says_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, output: str
) -> None:
    """It printed "job 5 (flaky) failed in group vision" and exit 1, and nothing of why."""

    def client() -> Any:
        return Client("http://corral.test", "token", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli_jobs, "client", client)
    spec = tmp_path / "flaky.yaml"
    spec.write_text("name: flaky\ntasks: {m: {command: 'exit 3'}}\n")
    result = CliRunner().invoke(app, ["submit", str(spec), "--wait", "-o", output])
    assert result.exit_code == 1, result.output
    if output == "table":
        assert "job 5 (flaky) failed in group vision" in result.output
        assert f"reason: {REASON}" in result.output, result.output
    else:  # the JSON alone, which holds the reason
        assert json.loads(result.stdout)["reason"] == REASON
