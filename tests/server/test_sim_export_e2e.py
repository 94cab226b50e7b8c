"""What-if on a live cluster, end to end: a real server with the local engine runs jobs (one fills
its 4 virtual GPUs, the next waits for them), `GET /admin/sim-export` gives back exactly the
times the platform recorded, and `corral sim --from-cluster` replays that history."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from tests.server_fixture import CorralServer, start_server, submit_spec, wait_state


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = start_server(tmp_path_factory.mktemp("simexport") / "home")
    try:
        yield srv
    finally:
        srv.stop()


def test_the_export_has_what_the_platform_recorded_and_replays(server: CorralServer, tmp_path: Path) -> None:
    with server.client() as c:
        spec = {"name": "fill", "command": "sleep 1", "resources": {"gpus": 4}}
        full = submit_spec(c, spec)
        wait_state(c, full, ("running",))
        later = submit_spec(c, spec | {"name": "later", "command": "sleep 0.2", "resources": {"gpus": 2}})
        jobs = {j: wait_state(c, j, ("succeeded",)) for j in (full, later)}
        r = c.get("/api/v1/admin/sim-export", params={"since": "1h"})
        assert r.status_code == 200, r.text
        export = r.json()
    rows = {row["job_id"]: row for row in export["jobs"]}
    assert set(rows) == {f"job-{full}", f"job-{later}"}
    origin = jobs[full]["created_at"]
    for job_id, job in jobs.items():
        row, (attempt,) = rows[f"job-{job_id}"], job["attempts"]
        assert row["submit_time"] == pytest.approx(job["created_at"] - origin, abs=2e-3)
        assert row["duration"] == pytest.approx(attempt["ended_at"] - attempt["started_at"], abs=2e-3)
        assert row["wait_s"] == pytest.approx(attempt["started_at"] - job["created_at"], abs=2e-3)
        assert row["num_gpus"] == job["spec"]["tasks"]["main"]["resources"]["gpus"]
    assert rows[f"job-{full}"]["duration"] >= 1.0
    # the 2-GPU job could start only when the 4-GPU one had ended
    assert (
        rows[f"job-{later}"]["wait_s"]
        >= jobs[full]["attempts"][0]["ended_at"] - jobs[later]["created_at"] - 2e-3
    )
    assert export["cluster"]["pools"][0]["gpus_per_node"] == 4
    env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.token}
    result = CliRunner().invoke(
        cli, ["sim", "--from-cluster", "--since", "1h", "--policy", "fifo", "-o", "json"], env=env
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output.strip().splitlines()[-1])
    assert report["changes"] == ["policy fifo"]
    (group,) = report["groups"]
    assert group["jobs"] == 2 and group["avg_queue_s_current"] > 0  # the replay made it wait too
