"""Incidents end to end on a real server (local engine, virtual GPUs, the shipped rules): an ECC
fault injected with `corral chaos gpu ecc` under a running job gives one SEV2 incident, the GPU
quarantined and the job running again on another GPU; clearing the fault resolves the incident;
the CLI shows, acknowledges and refuses to close it without a postmortem; a bad rules file is
refused over the API with its line."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server_fixture import CorralServer, start_server, submit_spec, wait_for, wait_state
from tests.server_fixture import get_job as job

TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    base = tmp_path_factory.mktemp("incidents")
    env = {"CORRAL_MONITOR_SAMPLE_INTERVAL_S": "0.3", "CORRAL_DIAG_INTERVAL_S": "0.3"}
    srv = start_server(base / "home", extra_env=env)
    try:
        yield srv
    finally:
        srv.stop()


def corral(server: CorralServer, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_URL": server.url, "CORRAL_TOKEN": server.token, "COLUMNS": "200"}
    exe = Path(sys.executable).parent / "corral"
    return subprocess.run([str(exe), *args], env=env, capture_output=True, text=True, timeout=60, check=check)


def running_gpu(c: httpx.Client, job_id: int, attempt: int) -> int:
    def placed() -> list[int] | None:  # a list: GPU 0 is falsy
        tries = [a for a in job(c, job_id)["attempts"] if a["number"] == attempt and a["state"] == "running"]
        return [g["index"] for g in tries[0]["gpus"]] if tries else None

    (index,) = wait_for(placed, 60, what=f"attempt {attempt} running")
    return int(index)


def incidents(c: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    r = c.get("/api/v1/incidents", params=params)
    assert r.status_code == 200, r.text
    return list(r.json()["items"])


def test_an_ecc_fault_under_a_job_is_one_sev2_incident_remedied_and_resolved_by_the_clear(
    server: CorralServer,
) -> None:
    with server.client() as c:
        task = {"command": "sleep 120", "resources": {"gpus": 1}}
        job_id = submit_spec(c, {"name": "ecc", "tasks": {"main": task}})
        bad = running_gpu(c, job_id, 1)
        corral(server, "chaos", "gpu", "ecc", "local", str(bad), "--home", str(server.home))
        (incident,) = wait_for(lambda: incidents(c) or None, 15, what="an incident")
        assert incident["severity"] == "SEV2" and incident["state"] == "triggered", incident
        assert incident["links"]["gpus"] == [f"local/{bad}"], incident
        again = running_gpu(c, job_id, 2)
        assert again != bad
        (node,) = c.get("/api/v1/nodes").json()
        assert node["gpus"][bad]["health"] == "quarantined"
        assert len(incidents(c, open=False)) == 1  # the watch's event joined it: still one
        shown = corral(server, "incident", "show", str(incident["id"])).stdout
        assert f"GPU {bad} on local quarantined" in shown and "remedy gpu-fault" in shown, shown
        assert "ack" in corral(server, "incident", "ack", str(incident["id"])).stdout

        corral(server, "chaos", "gpu", "clear", "local", str(bad), "--home", str(server.home))
        wait_for(lambda: incidents(c, state="resolved") or None, 15, what="the incident resolved")
        refused = corral(server, "incident", "close", str(incident["id"]), check=False)
        assert refused.returncode != 0 and "write its postmortem" in refused.stderr + refused.stdout
        c.post(f"/api/v1/jobs/{job_id}/cancel")
        wait_state(c, job_id, TERMINAL)


def test_a_bad_rules_file_is_refused_with_its_line_and_the_defaults_stay(server: CorralServer) -> None:
    with server.client() as c:
        bad = "version: 1\nrules:\n  - name: x\n    match: {name: A}\n    actions: [reboot]\n"
        r = c.put("/api/v1/remediation/rules", json={"text": bad})
        assert r.status_code == 422, r.text
        assert "line 5" in r.text and "unknown action 'reboot'" in r.text
        assert c.get("/api/v1/remediation/rules").json()["version"] == 0


def test_chaos_job_oom_ends_the_attempt_as_oom_never_retried_with_its_alert(server: CorralServer) -> None:
    with server.client() as c:
        task = {"command": "sleep 120", "resources": {"gpus": 1}}
        job_id = submit_spec(c, {"name": "oom", "tasks": {"main": task}, "retries": 2})
        running_gpu(c, job_id, 1)
        assert "OOM-killed" in corral(server, "chaos", "job", "oom", str(job_id)).stdout
        done = wait_state(c, job_id, TERMINAL)
        assert done["state"] == "failed", done
        (attempt,) = job(c, job_id)["attempts"]
        assert attempt["reason"] == "oom" and attempt["failure"]["category"] == "user", attempt

        def oom_alert() -> list[dict[str, Any]]:
            items = c.get("/api/v1/alerts", params={"name": "CorralJobOOM"}).json()["items"]
            return [a for a in items if a["labels"]["job_id"] == str(job_id)]

        wait_for(oom_alert, 30, what="the CorralJobOOM alert")
        again = corral(server, "chaos", "job", "oom", str(job_id), check=False)
        assert again.returncode != 0 and "has no running attempt" in again.stderr + again.stdout
