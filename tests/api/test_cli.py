"""The `corral` CLI (through the SDK) against a real uvicorn server on a free loopback port."""

from __future__ import annotations

import json
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from corral.cli import common
from corral.cli.main import app as cli
from corral.cli.nodes import memory_text
from corral.db.models import Attempt, Job
from corral.diagnosis.exitspec import Facts, load_exit_spec
from corral.diagnosis.record import record, retry_rule
from corral.monitor.models import GpuReading
from corral.sdk import Client, load_cli_config, write_cli_config
from corral.server.finish import end_attempt
from corral.services.lifecycle import AttemptState, settle_failure
from tests.api.conftest import ALICE_PASSWORD, World
from tests.api.helpers import add_node, make_running
from tests.support import free_port, served


@pytest.fixture
def server_url(world: World) -> Iterator[str]:
    with served(world.client.app) as url:
        yield url


def run(world: World, url: str, user: str, *args: str, token: str | None = None) -> tuple[int, str]:
    token = token or world.as_(user)["Authorization"].split()[1]
    result = CliRunner().invoke(cli, list(args), env={"CORRAL_URL": url, "CORRAL_TOKEN": token})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


def test_cli_job_commands(world: World, server_url: str, tmp_path: Path) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        add_node(db, "cpu1", gpus=0)
        db.commit()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: cli-job\ncommand: echo hi\nresources: {memory: 256MiB}\n")
    code, out = run(world, server_url, "alice", "submit", str(spec), "-o", "json")
    assert code == 0, out
    job = json.loads(out)
    assert job["state"] == "queued" and job["attempts"] == [] and isinstance(job["id"], int)
    code, out = run(world, server_url, "alice", "ls", "-o", "json")
    listing = json.loads(out)
    assert listing["total"] == 1 and listing["items"][0]["id"] == job["id"]
    code, out = run(world, server_url, "alice", "ls")
    assert "cli-job" in out and "1 of 1 job\n" in out  # not "1 of 1 jobs"
    code, out = run(world, server_url, "alice", "show", str(job["id"]))
    assert code == 0 and "queued" in out and "no attempts yet" in out
    said = " ".join(out.split())  # (the line wraps at 80 columns, between words)
    assert (
        "no failure yet (no retry allowed), no platform loss yet (3 requeues allowed), no preemption" in said
    )
    code, out = run(world, server_url, "alice", "show", str(job["id"]), "-o", "json")
    shown = json.loads(out)
    assert shown["events"][0]["to_state"] == "queued"
    assert (shown["own_failures"], shown["platform_losses"], shown["lost_requeue_budget"]) == (0, 0, 3)
    with world.session_factory() as db:  # as the lifecycle rules leave a job requeued after a loss
        row = db.get(Job, job["id"])
        assert row is not None
        row.own_failures, row.platform_losses, row.preemptions = 1, 2, 1
        row.reason = "node lost: attempt 3 (node n1 is down); requeued (platform loss 2 of 3)"
        db.commit()
    code, out = run(world, server_url, "alice", "show", str(job["id"]))
    # in words: it read "failures 1 of 0 retries  platform losses 2 of 3 requeues  preemptions 1"
    said = " ".join(out.split())
    assert "1 failure (no retry allowed), 2 platform losses (3 requeues allowed), 1 preemption" in said
    assert "requeued (platform loss 2 of 3)" in out
    code, out = run(world, server_url, "carol", "show", str(job["id"]))
    assert code == 1 and f"no job with id {job['id']}" in out, out  # as a missing job
    code, out = run(world, server_url, "alice", "logs", str(job["id"]))
    assert code == 0 and f"job {job['id']} is queued" in out
    code, out = run(world, server_url, "alice", "cancel", str(job["id"]))
    assert code == 0 and "cancelled" in out
    assert run(world, server_url, "alice", "submit", str(spec))[0] == 0
    code, out = run(world, server_url, "alice", "ls")
    assert code == 0 and "2 of 2 jobs\n" in out, out
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ncommand: y\nresources: {memory: lots}\n")
    code, out = run(world, server_url, "alice", "submit", str(bad))
    assert code == 1 and "tasks.main.resources.memory" in out and "is not a size" in out
    code, out = run(world, server_url, "alice", "submit", str(tmp_path / "missing.yaml"))
    assert code == 1 and "cannot read" in out


def test_show_counts_a_launch_failure_against_the_cap_the_server_applies(
    world: World, server_url: str, tmp_path: Path
) -> None:
    """A launch failure is requeued on the platform-loss budget AND the exit-spec's launch_failed
    cap (2), the lower wins (services.lifecycle.settle_failure): the header counted it against
    the budget (3) while the reason line said 2. Settled as the dispatch loop settles it."""
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: launch-fails\ncommand: echo hi\nresources: {memory: 256MiB}\n")
    code, out = run(world, server_url, "alice", "submit", str(spec), "-o", "json")
    job_id = json.loads(out)["id"]
    with world.session_factory() as db:
        attempt = make_running(db, job_id)
        db.expire_all()  # the placement read back as the loops see it
        job = db.get(Job, job_id)
        assert job is not None
        now = time.time()
        verdict = load_exit_spec().classify(Facts(frozenset({"launch_failed"}), log_tail="no such image"))
        assert verdict.reason == "launch_failed"
        settle_failure(
            db, job, why="launch failed: no such image", now=now, rule=retry_rule(verdict), budget=3
        )
        record(db, job, attempt, verdict, "n1", now, retried=True)
        end_attempt(
            db, job, attempt, AttemptState.FAILED, now, reason=verdict.reason, message="no such image"
        )
        db.commit()
    code, out = run(world, server_url, "alice", "show", str(job_id))
    assert code == 0, out
    assert "requeued (platform loss 1 of 2)" in out
    said = " ".join(out.split())
    assert "no failure yet (no retry allowed), 1 platform loss (2 requeues allowed), no preemption" in said
    shown = json.loads(run(world, server_url, "alice", "show", str(job_id), "-o", "json")[1])
    assert (shown["platform_loss_cap"], shown["lost_requeue_budget"]) == (2, 3)


def test_show_at_80_columns_splits_no_time_across_lines(
    world: World, server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempts' table (eight columns, two of them full times) wrapped its STARTED and ENDED
    values onto two lines at 80 columns: each time shows whole on one line."""
    monkeypatch.setattr(common.out, "_width", 80)
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: eighty\ncommand: echo hi\nresources: {gpus: 2, memory: 256MiB}\n")
    job_id = json.loads(run(world, server_url, "alice", "submit", str(spec), "-o", "json")[1])["id"]
    with world.session_factory() as db:
        attempt = make_running(db, job_id, "n1", (0, 1))
        db.expire_all()  # the placement read back as the loops see it
        job = db.get(Job, job_id)
        assert job is not None
        end_attempt(db, job, attempt, AttemptState.FAILED, time.time(), reason="exit", message="exit code 3")
        db.commit()
    code, out = run(world, server_url, "alice", "show", str(job_id))
    assert code == 0, out
    shown = json.loads(run(world, server_url, "alice", "show", str(job_id), "-o", "json")[1])
    (a,) = shown["attempts"]
    times = [common.when(t) for t in (shown["created_at"], a["started_at"], a["ended_at"])]
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80, out
    for text in times:
        assert any(text in line for line in lines), (text, out)  # whole, on one line
    assert f"  started {times[1]}  ended {times[2]}" in lines, out
    assert "  nodes n1  GPUs n1:0,n1:1" in lines and "  reason: exit: exit code 3" in lines, out


def test_cli_admin_commands(world: World, server_url: str) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    code, out = run(world, server_url, "admin", "node", "ls", "-o", "json")
    assert json.loads(out)[0]["name"] == "n1"
    code, out = run(world, server_url, "admin", "node", "cordon", "n1")
    assert code == 0 and "cordoned" in out
    code, out = run(world, server_url, "alice", "node", "drain", "n1")
    assert code == 1 and "only an administrator" in out
    assert run(world, server_url, "admin", "group", "create", "speech")[0] == 0
    code, out = run(
        world, server_url, "admin", "group", "quota", "speech", "--gpus", "4", "--model", "A100", "--max", "8"
    )
    assert code == 0, out
    code, out = run(world, server_url, "admin", "group", "ls", "-o", "json")
    speech = next(g for g in json.loads(out) if g["name"] == "speech")
    assert speech["quotas"] == [{"gpu_model": "A100", "guaranteed": 4, "max": 8}]
    code, out = run(world, server_url, "admin", "user", "create", "dave", "-g", "speech", "--token")
    assert code == 0 and "API token (shown once): crl_" in out
    dave_token = out.split("shown once): ")[1].strip()
    assert run(world, server_url, "admin", "user", "add-to-group", "dave", "nlp")[0] == 0
    code, out = run(world, server_url, "admin", "user", "ls", "-o", "json")
    dave = next(u for u in json.loads(out) if u["name"] == "dave")
    assert dave["default_group"] == "speech" and len(dave["groups"]) == 2
    code, out = run(world, server_url, "dave", "token", "create", "-o", "json", token=dave_token)
    assert json.loads(out)["user"] == "dave"
    assert run(world, server_url, "admin", "node", "uncordon", "n1")[0] == 0
    code, out = run(world, server_url, "admin", "node", "remove", "n1")
    assert code == 1 and "node 'n1' is ready: only a cordoned, drained or down node can be removed" in out
    assert run(world, server_url, "admin", "node", "cordon", "n1")[0] == 0
    code, out = run(world, server_url, "admin", "node", "remove", "n1")
    assert code == 0 and "node n1: removed" in out, out
    assert json.loads(run(world, server_url, "admin", "node", "ls", "-o", "json")[1]) == []


def test_cli_node_ls_shows_gpus_out_of_service(world: World, server_url: str) -> None:
    """docs/operations.md's walk-through: after a fault `corral node ls` shows the GPU
    quarantined; the table said nothing of a GPU's health (only `-o json` did)."""
    with world.session_factory() as db:
        add_node(db, "n1", gpus=4)
        db.commit()
    code, out = run(world, server_url, "admin", "node", "ls")
    assert code == 0 and "quarantined" not in out
    assert " 64GiB " in out, out  # add_node's 65536 MiB
    assert [memory_text(m) for m in (4000, 4095, 4096, 1536)] == ["3.9GiB", "3.9GiB", "4GiB", "1.5GiB"]
    code, out = run(world, server_url, "admin", "node", "gpu", "n1", "2", "quarantine")
    assert code == 0 and "node n1 GPU 2: quarantined" in out
    code, out = run(world, server_url, "admin", "node", "ls")
    assert code == 0 and "2:quarantined" in out, out
    assert run(world, server_url, "admin", "node", "gpu", "n1", "2", "return")[0] == 0
    code, out = run(world, server_url, "admin", "node", "ls")
    assert code == 0 and "quarantined" not in out, out


def test_cli_node_gpus_shows_readings_and_only_the_holders_the_caller_may_see(
    world: World, server_url: str
) -> None:
    """`corral node gpus` (GET /api/v1/gpus): utilization and memory of every GPU; alice's job is
    named to alice and bob (vision's admin), only "a job" to carol, who is not in vision."""
    with world.session_factory() as db:
        add_node(db, "n1", gpus=3)
        db.commit()
    job = world.client.post(
        "/api/v1/jobs",
        json={"name": "t", "command": "x", "resources": {"gpus": 1, "memory": "1GiB"}},
        headers=world.as_("alice"),
    ).json()
    with world.session_factory() as db:
        make_running(db, job["id"], "n1", (1,))
        now = time.time()
        for index, util in ((0, 12.0), (1, 87.4)):  # GPU 2 never sampled
            db.add(
                GpuReading(
                    node="n1", gpu_index=index, uuid=f"GPU-n1-{index}", present=True,
                    utilization_percent=util, memory_used_mib=2048.0, memory_total_mib=40960.0,
                    sampled_at=now,
                )
            )  # fmt: skip
        db.commit()

    def rows(user: str) -> dict[str, list[str]]:
        code, out = run(world, server_url, user, "node", "gpus")
        assert code == 0, out
        cells = [line.split() for line in out.splitlines()[1:]]
        return {row[1]: row for row in cells if row and row[0] == "n1"}

    for user in ("alice", "bob"):
        held = rows(user)["1"]
        assert held[3:8] == ["87%", "2GiB", "job", str(job["id"]), "vision"], held
    carol = rows("carol")
    assert carol["1"][3:7] == ["87%", "2GiB", "a", "job"] and "vision" not in carol["1"], carol
    assert carol["0"][3:6] == ["12%", "2GiB", "-"] and carol["2"][3:5] == ["-", "-"], carol
    code, out = run(world, server_url, "carol", "node", "gpus", "-o", "json")
    assert code == 0, out
    shown = json.loads(out)["gpus"][1]
    assert (shown["allocated"], shown["job_id"], shown["group"]) == (True, None, None)


def test_cli_clear_errors(world: World, server_url: str) -> None:
    code, out = run(world, server_url, "alice", "ls", token="crl_wrong")
    assert code == 1 and "authentication failed" in out and "Traceback" not in out
    code, out = run(world, f"http://127.0.0.1:{free_port()}", "alice", "ls")
    assert code == 1 and "cannot reach the Corral server" in out and "Traceback" not in out


def test_ls_with_an_unknown_state_lists_the_states(world: World, server_url: str) -> None:
    """`corral ls --state bogus` printed the API's regex ("does not match pattern ^\\s*(queued|...");
    the 422 now names the unknown state and the states there are, for the CLI, SDK and portal."""
    code, out = run(world, server_url, "alice", "ls", "--state", "running, bogus")
    assert code == 1 and "Traceback" not in out, out
    assert "unknown job state 'bogus': states are queued, scheduled, starting, running" in out, out
    assert "pattern" not in out and "\\s" not in out, out
    r = world.client.get(
        "/api/v1/jobs", params={"state": ["queued", "running,bogus"]}, headers=world.as_("alice")
    )
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["query", "state", 1], r.text
    assert run(world, server_url, "alice", "ls", "--state", " queued , ,running")[0] == 0


def test_cli_model_register_bad_card_and_metric_name_the_option(
    world: World, server_url: str, tmp_path: Path
) -> None:
    # A missing --card file was a FileNotFoundError traceback, and a --metric without '=' was
    # reported as a bad `--set`, an option `model register` does not have.
    register = ("model", "register", "digits", "--job", "1")
    code, out = run(world, server_url, "alice", *register, "--card", str(tmp_path / "missing.md"))
    # click's error box wraps a long path over lines (and a worker's tmp path is long): read it flat
    flat = re.sub(r"[\s│╭╮╰╯─]", "", out)
    assert code != 0 and "--card" in flat and str(tmp_path / "missing.md") in flat and "Traceback" not in out
    code, out = run(world, server_url, "alice", *register, "--metric", "f1")
    assert code == 1 and "--metric 'f1': write NAME=VALUE" in out and "--set" not in out


def test_cli_config_file(tmp_path: Path, world: World, server_url: str) -> None:
    path = write_cli_config(server_url, world.as_("bob")["Authorization"].split()[1], home=tmp_path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    cfg = load_cli_config(tmp_path, env={})
    with Client(cfg.url, cfg.token) as client:
        assert client.me()["name"] == "bob"
    assert load_cli_config(tmp_path, env={"CORRAL_TOKEN": "other"}).token == "other"
    assert load_cli_config(tmp_path, env={"CORRAL_URL": "http://x:1/"}).url == "http://x:1"


def test_burst_of_concurrent_requests_does_not_exhaust_the_pool(world: World, server_url: str) -> None:
    """Hundreds of requests at once must all be answered. Regression guard: requests that held a
    pooled connection while waiting for a worker thread once deadlocked the pool in such bursts
    (fixed by releasing the connection after auth, async session teardown and admission control)."""
    import asyncio

    import httpx

    with world.session_factory() as db:
        add_node(db, "cpu1", gpus=0)
        db.commit()
    spec = {"name": "burst", "command": "true", "resources": {"memory": "64MiB"}}

    async def burst() -> list[int]:
        limits = httpx.Limits(max_connections=300)
        async with httpx.AsyncClient(
            base_url=server_url, headers=world.as_("alice"), limits=limits, timeout=60
        ) as client:
            submits = [client.post("/api/v1/jobs", json=spec) for _ in range(150)]
            reads = [client.get("/api/v1/jobs", params={"limit": 20}) for _ in range(100)]
            responses = await asyncio.gather(*submits, *reads)
        return [r.status_code for r in responses]

    start = time.monotonic()
    codes = asyncio.run(burst())
    assert codes.count(201) == 150 and codes.count(200) == 100
    assert time.monotonic() - start < 30  # the pool's checkout timeout; a deadlock waits that long


def test_cli_group_quotas_usage_warnings_and_clearing_limits(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(common.out, "_width", 200)  # one line per table row
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2, model="A100")  # 16 CPUs, 64 GiB
        db.commit()
    code, out = run(
        world,
        server_url,
        "admin",
        *("group", "quota", "vision", "--gpus", "2", "--model", "A100", "--max", "3", "--user-max", "2"),
        *("--cpus", "20", "--cpus-max", "24", "--memory", "8GiB", "--memory-max", "16GiB"),
    )
    assert code == 0, out
    assert "warning: guaranteed CPUs of all groups add up to 20; the cluster has 16" in out
    code, out = run(
        world, server_url, "admin", "group", "quota", "vision", "--user-max", "none", "-o", "json"
    )
    vision = json.loads(out)
    assert vision["user_max_gpus"] is None and vision["cpus_max"] == 24
    assert vision["quotas"] == [{"gpu_model": "A100", "guaranteed": 2, "max": 3}]
    code, out = run(
        world, server_url, "admin", "group", "quota", "vision", "--model", "A100", "--max", "none"
    )
    assert code == 0, out
    code, out = run(
        world, server_url, "admin", "group", "quota", "vision", "--cpus-max", "none", "-o", "json"
    )
    vision = json.loads(out)
    assert (
        vision["quotas"] == [{"gpu_model": "A100", "guaranteed": 2, "max": None}]
        and vision["cpus_max"] is None
    )
    job = world.client.post(
        "/api/v1/jobs",
        json={"name": "t", "command": "x", "resources": {"gpus": 1, "cpus": 2, "memory": "1GiB"}},
        headers=world.as_("alice"),
    ).json()
    with world.session_factory() as db:
        make_running(db, job["id"], "n1", (0,))
        db.execute(sa.update(Attempt).values(borrowed=True))
        db.commit()
    code, out = run(world, server_url, "admin", "group", "ls")
    assert code == 0, out
    row = next(line for line in out.splitlines() if line.strip().startswith("vision"))
    assert "A100: 1/2/- (1 borrowed)" in row and "1/20/-" in row and "0.2G/8G/16G" in row, out
    assert "warning: guaranteed CPUs of all groups add up to 20; the cluster has 16" in out
    code, out = run(world, server_url, "admin", "group", "quota", "vision", "--cpus-max", "lots")
    assert code == 2 and "--cpus-max: 'lots' is not a number of CPUs (or 'none')" in out
    # A bad option beside --storage: refused whole, the storage quota not set behind the error.
    code, out = run(
        world, server_url, "admin", "group", "quota", "vision", "--storage", "5GiB", "--user-max", "x"
    )
    assert code == 2 and "--user-max: 'x' is not a whole number (or 'none')" in out
    code, out = run(world, server_url, "admin", "storage", "usage", "-o", "json")
    assert code == 0 and [u["max_bytes"] for u in json.loads(out) if u["name"] == "vision"] in ([], [None])
    code, out = run(world, server_url, "admin", "group", "quota", "vision")
    assert code == 2 and "give at least one quota option" in out
    # ... nor behind the server's refusal of the rest (it was sent first, and stayed set)
    args = ("group", "quota", "vision", "--storage", "5GiB", "--model", "A100", "--gpus", "2", "--max", "1")
    code, out = run(world, server_url, "admin", *args)
    assert code == 1 and "max (1) must not be less than guaranteed (2)" in out, out
    code, out = run(world, server_url, "admin", "storage", "usage", "-o", "json")
    assert code == 0 and [u["max_bytes"] for u in json.loads(out) if u["name"] == "vision"] in ([], [None])
    code, out = run(world, server_url, "admin", "group", "quota", "vision", "--storage", "5GiB")
    assert code == 0 and out == "group vision: storage 0 B / 5.0 GiB, files 0 / -\n", out
    code, out = run(world, server_url, "admin", "storage", "usage", "-o", "json")
    assert [u["max_bytes"] for u in json.loads(out) if u["name"] == "vision"] == [5 << 30]


def test_cli_group_ls_fits_80_columns_without_cutting_a_word(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nine columns with headers such as "GPUS used/guaranteed/max" did not fit 80 columns: Rich
    cut headers and cells ("used/gu…", "(1 borrowe…", "0G/0G/…"). Every value is shown whole."""
    monkeypatch.setattr(common.out, "_width", 80)
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2, model="A100")
        db.commit()
    args = ("group", "quota", "vision", "--model", "A100", "--gpus", "1", "--max", "2", "--user-max", "2")
    args += ("--cpus-max", "64", "--memory-max", "256GiB", "--storage", "2TiB", "--files", "1000000")
    code, out = run(world, server_url, "admin", *args)
    assert code == 0, out
    job = world.client.post(
        "/api/v1/jobs",
        json={"name": "t", "command": "x", "resources": {"gpus": 2, "cpus": 2, "memory": "1GiB"}},
        headers=world.as_("alice"),
    ).json()
    with world.session_factory() as db:
        make_running(db, job["id"], "n1", (0, 1))
        db.execute(sa.update(Attempt).values(borrowed=True))
        db.commit()
    code, out = run(world, server_url, "admin", "group", "ls")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    headers = ["GROUP", "GPUS", "CPUS", "MEMORY", "STORAGE", "SETTINGS", "MEMBERS"]
    assert out.splitlines()[0].split() == headers
    cells = out.split("GPUS (per GPU model)")[0].split()
    for value in ("A100:", "2/1/2", "(2", "borrowed)", "1/0/64", "0.2G/0G/256G", "2.0", "TiB", "1000000"):
        assert value in cells, (value, out.splitlines())
    assert "2 GPUs/user" in out and "no borrowing" not in out
    assert "GPUS (per GPU model), CPUS, MEMORY: used/guaranteed/max" in out


def test_cli_group_quota_sets_weight_and_borrowing_and_clears_a_model_row(
    world: World, server_url: str
) -> None:
    """`corral group quota` could not change what `group create` set (weight, borrowing), which
    PUT /groups/{name}/quota can; and no way removed a per-model quota row, so a mistyped model's
    row kept its warning forever."""
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2, model="A100")
        db.commit()
    args = ("group", "quota", "vision", "--weight", "2.5", "--no-borrowing", "-o", "json")
    code, out = run(world, server_url, "admin", *args)
    assert code == 0, out
    vision = json.loads(out)
    assert (vision["weight"], vision["borrowing"]) == (2.5, False)
    code, out = run(world, server_url, "admin", "group", "quota", "vision", "--borrowing", "-o", "json")
    assert code == 0 and json.loads(out)["borrowing"] is True and json.loads(out)["weight"] == 2.5, out
    code, out = run(world, server_url, "admin", "group", "quota", "vision", "--model", "A10O", "--gpus", "2")
    assert code == 0 and "guaranteed A10O GPUs of all groups add up to 2; the cluster has 0" in out, out
    code, out = run(world, server_url, "admin", "group", "quota", "vision", "--model", "A10O", "--clear")
    assert code == 0 and "group vision: GPU quota of A10O removed" in out, out
    assert "warning" not in out  # the warning went with the row
    vision = world.client.get("/api/v1/groups/vision", headers=world.as_("admin")).json()
    assert all(q["gpu_model"] != "A10O" for q in vision["quotas"]) and vision["weight"] == 2.5
    code, out = run(world, server_url, "admin", "group", "quota", "vision", "--model", "A10O", "--clear")
    assert code == 1 and "group 'vision' has no quota for GPU model 'A10O'" in out, out
    code, out = run(world, server_url, "admin", "group", "quota", "vision", "--clear", "--gpus", "1")
    assert code == 2 and "--clear takes no other quota option than --model" in out, out
    code, out = run(world, server_url, "alice", "group", "quota", "vision", "--model", "A100", "--clear")
    assert code == 1, out


def test_cli_auth_lockouts_and_sessions(world: World, server_url: str) -> None:
    for _ in range(5):  # the default threshold
        r = world.client.post("/api/v1/auth/login", json={"username": "carol", "password": "guess"})
        assert r.status_code == 401
    r = world.client.post("/api/v1/auth/login", json={"username": "carol", "password": "x"})
    assert r.status_code == 429
    code, out = run(world, server_url, "alice", "auth", "lockouts")
    assert code == 1 and "only an administrator" in out
    code, out = run(world, server_url, "admin", "auth", "lockouts", "--locked", "-o", "json")
    rows = {(r["scope"], r["key"]): r for r in json.loads(out)}
    assert rows[("account", "carol")]["failures"] == 5 and rows[("account", "carol")]["locked"]
    code, out = run(world, server_url, "admin", "auth", "lockouts")
    assert code == 0 and "carol" in out and "account" in out
    for row in rows.values():
        code, out = run(world, server_url, "admin", "auth", "unlock", str(row["id"]))
        assert code == 0 and "lifted" in out, out
    code, out = run(world, server_url, "admin", "auth", "lockouts", "-o", "json")
    assert json.loads(out) == []
    # Sessions: alice logs in to the portal; an admin sees and ends that session.
    login = {"username": "alice", "password": ALICE_PASSWORD}
    assert world.client.post("/api/v1/auth/login", json=login).status_code == 200
    code, out = run(world, server_url, "admin", "auth", "sessions", "--user", "alice", "-o", "json")
    (session,) = json.loads(out)
    code, out = run(world, server_url, "alice", "auth", "sessions")
    assert code == 0 and session["id"] in out
    code, out = run(world, server_url, "admin", "auth", "end-session", session["id"])
    assert code == 0 and "ended" in out
    assert world.client.get("/api/v1/me").status_code == 401


def test_cli_why_says_held_or_a_start_with_its_range(world: World, server_url: str, tmp_path: Path) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: why-job\ncommand: hi\nmax_runtime: 2h\nresources: {gpus: 1, memory: 256MiB}\n")
    code, out = run(world, server_url, "alice", "submit", str(spec), "-o", "json")
    assert code == 0, out
    job_id = json.loads(out)["id"]
    cap = "waits for the per-user cap: alice may hold 1 GPU in group vision and holds 1; this job needs 1"
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        job.diagnosis = {
            "reasons": [{"code": "user_cap", "source": "quota:user", "message": cap}],
            "queue_position": 2,
            "estimated_start": None,
            "unschedulable": False,
        }
        db.commit()
    code, out = run(world, server_url, "alice", "why", str(job_id))
    assert code == 0, out
    assert cap in " ".join(out.split()) and "queue position: 2" in out
    assert "estimated start: none while it is held back" in out
    assert "assumed runtime: ~2 h (from its max_runtime; no history yet)" in out
    now = time.time()
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        job.diagnosis = {
            "reasons": [{"code": "insufficient_gpus", "source": "filter:gpu_free", "message": "needs 1"}],
            "queue_position": 1,
            "estimated_start": now + 7200,
            "unschedulable": False,
            "start_range": [now + 3600, now + 3 * 3600],
        }
        db.commit()
    code, out = run(world, server_url, "alice", "why", str(job_id))
    assert code == 0, out
    flat = " ".join(out.split())
    assert "estimated start:" in flat and "(in ~" in flat and "(likely " in flat and " to 3 h)" in flat


def test_cli_422_messages_name_their_field_once(world: World, server_url: str, tmp_path: Path) -> None:
    """A 422's message often names its field already ("field 'name' 'Bad Name' must ...", "since
    'soon' is not a time"): the SDK put the field in front again ("name: field 'name' ...")."""
    code, out = run(world, server_url, "admin", "group", "create", "Bad Name")
    assert code == 1 and "error: field 'name' 'Bad Name' " in out and "name: field" not in out, out
    assert out.count("name") == 1, out
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: x\ncommand: y\nresources: {memory: lots}\nretires: 2\n")
    code, out = run(world, server_url, "alice", "submit", str(spec))
    assert code == 1 and "unknown field 'retires'; check its spelling" in out, out
    assert "retires: unknown" not in out and out.count("retires") == 1, out
    assert "tasks.main.resources.memory" in out and out.count("memory") == 1, out


def test_describe_detail_names_each_field_once() -> None:
    from corral.sdk import describe_detail

    detail = [
        {"loc": ["query", "since"], "msg": "since 'soon' is not a time"},
        {"loc": ["body", "tasks", "main", "name"], "msg": "field 'name' 'A B' must be a name"},
        {"loc": ["body", "tasks", "main", "resources", "memory"], "msg": "memory 'lots' is not a size"},
        {"loc": ["body", "priority"], "msg": "must be low, normal or high"},
        {"loc": ["body", "names"], "msg": "name lists must not be empty"},  # 'names', not 'name'
    ]
    assert describe_detail(detail).splitlines() == [
        "since 'soon' is not a time",
        "tasks.main: field 'name' 'A B' must be a name",
        "tasks.main.resources.memory 'lots' is not a size",
        "priority: must be low, normal or high",
        "names: name lists must not be empty",
    ]


def test_cli_retry_resubmits_an_ended_job_and_refuses_a_live_one(
    world: World, server_url: str, tmp_path: Path
) -> None:
    """`corral retry JOB` (Slurm's `scontrol requeue`, OpenPAI's clone): a copy of an ended job,
    as `submit --from-job` submits it; a job still queued or running is refused, naming its state."""
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    spec = tmp_path / "job.yaml"
    spec.write_text("name: again\ncommand: echo hi\nretries: 2\nresources: {memory: 256MiB}\n")
    first = json.loads(run(world, server_url, "alice", "submit", str(spec), "-o", "json")[1])
    code, out = run(world, server_url, "alice", "retry", str(first["id"]))
    assert code == 1 and f"job {first['id']} is queued, not ended: only a succeeded, failed or" in out, out
    with world.session_factory() as db:
        make_running(db, first["id"])
        db.commit()
    code, out = run(world, server_url, "alice", "retry", str(first["id"]))
    assert code == 1 and f"job {first['id']} is running, not ended" in out, out
    assert run(world, server_url, "alice", "cancel", str(first["id"]))[0] == 0
    with world.session_factory() as db:  # as the loops end a cancelled job
        job = db.get(Job, first["id"])
        assert job is not None
        job.state = "cancelled"
        db.commit()
    code, out = run(world, server_url, "alice", "retry", str(first["id"]))
    assert code == 0, out
    match = re.fullmatch(rf"job (\d+) \(again\) queued in group vision, a copy of job {first['id']}\n", out)
    assert match is not None, out
    copy = json.loads(run(world, server_url, "alice", "show", match.group(1), "-o", "json")[1])
    assert copy["id"] != first["id"] and copy["spec"] == first["spec"] and copy["state"] == "queued"
    code, out = run(world, server_url, "alice", "retry", str(first["id"]), "--hold", "-o", "json")
    held = json.loads(out)
    assert code == 0 and held["hold"] and held["spec"] == first["spec"], out
    code, out = run(world, server_url, "carol", "retry", str(first["id"]))
    assert code == 1 and f"no job with id {first['id']}" in out, out  # as a missing job
    assert world.client.get("/api/v1/jobs", headers=world.as_("alice")).json()["total"] == 3
