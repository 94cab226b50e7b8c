"""Rough edges found by trying the platform as a new user and an admin, on a real server with the
real local engine: multi-role rendezvous variables, deleting jobs with their logs, retention."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from tests.server.test_e2e import TERMINAL, logs
from tests.server_fixture import CorralServer, start_server, submit_spec, wait_for, wait_state


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = start_server(tmp_path_factory.mktemp("rough") / "home")
    try:
        yield srv
    finally:
        srv.stop()


# Every instance listens on its own CORRAL_PORT, connects to every other instance of every role
# through CORRAL_ROLE_<ROLE>_ADDRS and says who it is; it ends once it heard from all the others.
PEERS = """
import os, socket, threading, time
e = os.environ
me = "%s-%s" % (e["CORRAL_TASK_ROLE"], e["CORRAL_TASK_INDEX"])
roles = e["CORRAL_ROLES"].split(",")
peers = {}
for role in roles:
    key = "CORRAL_ROLE_%s" % role.upper()
    addrs = e[key + "_ADDRS"].split(",")
    assert len(addrs) == int(e[key + "_COUNT"]) == len(e[key + "_HOSTS"].split(","))
    for i, a in enumerate(addrs):
        peers["%s-%d" % (role, i)] = (a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1]))
print("ME", me, "ROLES", ",".join(roles), "PEERS", sorted(peers), flush=True)
assert peers[me] == (e["CORRAL_HOST"], int(e["CORRAL_PORT"]))
server = socket.create_server((e["CORRAL_HOST"], int(e["CORRAL_PORT"]))); server.settimeout(30)
heard = []
def listen():
    for _ in range(len(peers) - 1):
        conn, _ = server.accept(); heard.append(conn.recv(64).decode()); conn.close()
t = threading.Thread(target=listen); t.start()
for name, addr in peers.items():
    if name == me:
        continue
    for _ in range(400):
        try:
            c = socket.create_connection(addr, timeout=1); break
        except OSError:
            time.sleep(0.05)
    c.sendall(me.encode()); c.close()
t.join()
print("HEARD", ",".join(sorted(heard)), flush=True)
"""


def test_multi_role_processes_reach_every_role_through_the_rendezvous_variables(server: CorralServer) -> None:
    command = f"{sys.executable} -c '{PEERS}'"
    resources = {"cpus": 0.5, "memory": "256MiB"}
    spec = {
        "name": "ps-worker",
        "tasks": {
            "ps": {"instances": 1, "command": command, "resources": resources},
            "worker": {"instances": 2, "command": command, "resources": resources},
        },
    }
    with server.client() as c:
        job_id = submit_spec(c, spec)
        done = wait_state(c, job_id, TERMINAL, timeout_s=60)
        outs = [logs(c, job_id, rank=r) for r in range(3)]
        assert done["state"] == "succeeded", (done, outs)
    everyone = {"ps-0", "worker-0", "worker-1"}
    for out in outs:
        me = out.split("ME ")[1].split()[0]
        assert "ROLES ps,worker" in out and "PEERS ['ps-0', 'worker-0', 'worker-1']" in out
        assert f"HEARD {','.join(sorted(everyone - {me}))}" in out, out


def attempt_dirs(server: CorralServer, job_id: int) -> list[Path]:
    return sorted((server.home / "engine" / "attempts").glob(f"{job_id}.*"))


def test_rm_deletes_a_finished_job_and_its_logs(server: CorralServer) -> None:
    with server.client() as c:
        job_id = submit_spec(c, {"name": "to-delete", "command": "echo some output"})
        running = submit_spec(c, {"name": "running", "command": "sleep 30"})
        assert wait_state(c, job_id, TERMINAL)["state"] == "succeeded"
        assert logs(c, job_id) == "some output\n" and attempt_dirs(server, job_id)
        wait_state(c, running, ("running",))
        env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.token}
        result = CliRunner().invoke(cli, ["rm", str(job_id), str(running)], env=env)
        assert result.exit_code == 1, result.output
        assert f"job {job_id} deleted" in result.stdout
        assert f"error: job {running} is running; only finished jobs" in result.stderr  # the id once
        assert c.get(f"/api/v1/jobs/{job_id}").status_code == 404
        assert attempt_dirs(server, job_id) == []  # the logs went with it
        assert c.get(f"/api/v1/jobs/{running}").json()["state"] == "running"
        assert attempt_dirs(server, running)
        c.post(f"/api/v1/jobs/{running}/cancel")


def test_retention_deletes_finished_jobs_once_they_are_old_enough(tmp_path: Path) -> None:
    retention_days = 6 / 86400  # six seconds
    env = {"CORRAL_JOB_RETENTION_DAYS": str(retention_days), "CORRAL_JOB_RETENTION_CHECK_S": "0.5"}
    with start_server(tmp_path / "home", extra_env=env) as srv, srv.client() as c:
        job_id = submit_spec(c, {"name": "short-lived", "command": "echo bye"})
        done = wait_state(c, job_id, TERMINAL)
        assert done["state"] == "succeeded" and attempt_dirs(srv, job_id)
        assert c.get(f"/api/v1/jobs/{job_id}").status_code == 200  # younger than the retention
        wait_for(lambda: c.get(f"/api/v1/jobs/{job_id}").status_code == 404, 20, what="retention")
        assert time.time() - done["finished_at"] >= 6
        assert attempt_dirs(srv, job_id) == []
        assert "retention: deleted 1 job " in srv.log_text()


def test_logs_of_a_queued_job_say_why_it_waits_on_a_real_server(server: CorralServer) -> None:
    hog = {"name": "hog", "command": "sleep 60", "resources": {"gpus": 4}}
    with server.client() as c:
        first = submit_spec(c, hog)
        wait_state(c, first, ("running",))
        second = submit_spec(c, {**hog, "name": "waiter"})
        try:
            waiting = wait_for(
                lambda: (w := c.get(f"/api/v1/jobs/{second}/logs").json()["waiting"]) and w["reasons"] and w,
                20,
                what="the scheduler's diagnosis of the waiting job",
            )
            assert waiting["state"] == "queued" and waiting["queue_position"] == 1
            assert waiting["message"].startswith(f"job {second} is queued: ")
            env = {"CORRAL_URL": server.url, "CORRAL_TOKEN": server.token}
            result = CliRunner().invoke(cli, ["logs", str(second)], env=env)
            assert result.exit_code == 0 and result.stdout == ""  # no output: it has not run
            assert f"job {second} is queued: " in result.stderr and "position 1 in the queue" in result.stderr
        finally:
            for job_id in (first, second):
                c.post(f"/api/v1/jobs/{job_id}/cancel")
