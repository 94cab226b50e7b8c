"""The chaos soak, short: real servers (PostgreSQL with two on one database; the SQLite
configuration runs in bench/chaos_soak.py) run 20 mixed jobs while servers, supervisors
and job processes are SIGKILLed, the node's heartbeats stop and GPUs fault; no invariant of
bench/chaos_soak.py may break. Also `corral chaos node down|up`, which the soak uses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.chaos_soak import FAULTS, INVARIANTS, SoakConfig, run_soak
from bench.soak_records import Snapshot, held_placements
from tests.pg import PostgresServer
from tests.server_fixture import get_job, start_server, submit_spec, wait_for

# Every kind of fault once, in this order: the two that need a running attempt first (the chaos
# driver tries an opening fault again every 0.2 s until it finds something to hit, so they land
# as soon as the first jobs run), the server kill last (its restart takes seconds on a loaded
# machine; the other server carries the work meanwhile). No random faults after the opening.
OPENING = (
    "supervisor_kill",
    "job_kill",
    "gpu_ecc",
    "node_down",
    "gpu_lose",
    "gpu_xid",
    "server_kill",
)


def short_soak(seed: int) -> SoakConfig:
    """20 short jobs (5 of them fail by design) and the opening's faults, then the work drains:
    40-50 s of soak on the 2-core machine at load 12 (110 s at load 14 beside a fuzz run). The
    bound is what a loaded machine needs with room to spare, not what the soak usually takes."""
    return SoakConfig(
        jobs=20,
        seed=seed,
        chaos_every_s=0.7,
        duration_s=150.0,
        sleep_s=(0.5, 2.0),
        submitters=4,  # a submit takes seconds on a loaded machine: all 20 queued within a few
        node_down_s=(3.5, 4.5),
        opening=OPENING,
        chaos_faults=len(OPENING),
    )


def assert_clean(result: dict[str, Any]) -> None:
    print(json.dumps(result))  # shown with the failure: faults, examples of violations, states
    assert result["submitted"] == result["jobs"], result
    assert result["violations"] == dict.fromkeys(INVARIANTS, 0), result
    assert all(result["faults"][kind] >= OPENING.count(kind) for kind in FAULTS), result["faults"]
    assert result["unfinished"] == 0, result  # drained well within the bound
    # the soak's own jobs: most succeed (exit 0), some fail by design (exit 1, 3, 42)
    assert result["final_states"].get("succeeded", 0) >= result["jobs"] // 2, result
    assert result["final_states"].get("failed", 0) >= 1, result


@pytest.mark.postgres
@pytest.mark.timeout(300)
def test_chaos_soak_postgres_two_servers(postgres_server: PostgresServer) -> None:
    cfg = short_soak(seed=12)
    cfg.servers = 2
    assert_clean(run_soak(cfg, postgres_server.create_database))


def chaos_cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CORRAL_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "chaos", "node", *args, "--home", str(home)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def node_state(c: Any) -> str:
    (node,) = c.get("/api/v1/nodes").json()
    return str(node["state"])


def test_chaos_node_down_stops_heartbeats_and_up_brings_the_node_back(tmp_path: Path) -> None:
    env = {"CORRAL_NODE_HEARTBEAT_TIMEOUT_S": "1.5"}
    with start_server(tmp_path / "home", extra_env=env) as srv, srv.client() as c:
        spec = {"name": "long", "tasks": {"main": {"command": "sleep 60", "resources": {"gpus": 1}}}}
        job_id = submit_spec(c, spec)
        wait_for(lambda: get_job(c, job_id)["state"] == "running", 20, what="the job running")
        r = c.post("/api/v1/chaos/nodes/nosuchnode/down")
        assert r.status_code == 404 and "nosuchnode" in r.json()["detail"], r.text
        r = c.post("/api/v1/chaos/nodes/local/down")
        assert r.status_code == 200 and r.json() == {"node": "local", "heartbeats": "stopped"}, r.text
        wait_for(lambda: node_state(c) == "down", 15, what="the silenced node marked down")
        lost = wait_for(lambda: (j := get_job(c, job_id))["attempts"][0]["state"] == "lost" and j, 10)
        assert lost["state"] == "queued", lost  # requeued within the platform-loss budget
        assert node_state(c) == "down"  # stays down while silenced: nothing is placed on it
        result = chaos_cli(srv.home, "up", "local")
        assert result.returncode == 0 and "heartbeats of local: flowing" in result.stdout, result
        wait_for(lambda: node_state(c) == "ready", 10, what="the node back")
        wait_for(lambda: len(get_job(c, job_id)["attempts"]) == 2, 20, what="a second attempt")
        # placed again on the node that came back (a moment SCHEDULED, then launched)
        wait_for(
            lambda: get_job(c, job_id)["attempts"][1]["state"] in ("starting", "running"),
            20,
            what="the second attempt running",
        )
        assert c.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
        bad = chaos_cli(srv.home, "down", "x" * 200)
        assert bad.returncode != 0 and "1 to 128 characters" in bad.stdout + bad.stderr, bad


def test_held_placed_finds_an_attempt_created_between_hold_and_release() -> None:
    """The soak's held_placed invariant: an attempt created while its job was held (after a hold
    event, before the release that ended it, or with none yet) is found; one created before the
    hold or after the release is not."""
    holds = {
        1: [(10.0, "hold"), (20.0, "release")],
        2: [(10.0, "hold"), (20.0, "release"), (30.0, "hold")],
        3: [(10.0, "hold"), (20.0, "release")],
    }
    created = {(1, 1): 5.0, (1, 2): 15.0, (2, 1): 25.0, (2, 2): 35.0, (3, 1): 21.0, (4, 1): 15.0}
    snap = Snapshot({}, [], [], {}, created, holds)
    assert sorted(held_placements(snap)) == [(1, 2, 10.0, 20.0), (2, 2, 30.0, float("inf"))]
