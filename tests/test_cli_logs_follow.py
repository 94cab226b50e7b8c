"""`corral logs JOB -f --attempt N` follows attempt N (its help: "attempt number (default:
newest)"), not the newest one; without --attempt it still moves on to a retry's attempt. The
server is a mock transport: attempt 1 has ended, attempt 2 runs and ends."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import jobs as cli_jobs
from corral.cli.main import app
from corral.sdk import Client

LOGS = {1: "first attempt\n", 2: "second attempt\n"}


def fake_server() -> tuple[httpx.MockTransport, list[str]]:
    asked: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/logs"):
            attempt = int(request.url.params.get("attempt", 2))  # the newest by default
            asked.append(f"attempt {attempt}")
            offset = int(request.url.params["offset"])
            data = LOGS[attempt][offset:]
            body = {"data": data, "next_offset": offset + len(data), "eof": True, "attempt": attempt}
            return httpx.Response(200, json={**body, "rank": 0, "waiting": None})
        attempts = [{"number": n, "ended_at": 100.0 + n} for n in (1, 2)]
        return httpx.Response(200, json={"id": 5, "state": "failed", "attempts": attempts})

    return httpx.MockTransport(answer), asked


@pytest.mark.parametrize(
    ("args", "printed"), [(["--attempt", "1"], "first attempt\n"), ([], "second attempt\n")]
)
def test_logs_follow_reads_the_attempt_asked_for(
    monkeypatch: pytest.MonkeyPatch, args: list[str], printed: str
) -> None:
    transport, asked = fake_server()

    def client() -> Any:
        return Client("http://corral.test", "token", transport=transport)

    monkeypatch.setattr(cli_jobs, "client", client)
    result = CliRunner().invoke(app, ["logs", "5", "-f", *args])
    assert result.exit_code == 0, result.output
    assert result.output == printed
    if args:
        assert set(asked) == {"attempt 1"}
