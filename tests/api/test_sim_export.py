"""What-if on the live cluster: `GET /admin/sim-export` turns the jobs that ran into a simulator
trace with the current nodes and quotas (times, sizes and groups as they were; pseudonyms on
request; admins only; audited), and `corral sim --from-cluster` replays it under the current
quotas and changed ones. Jobs are submitted through the API and given the attempts the control
loops would have written, at chosen times, so that every figure can be checked exactly. The export's
tests run on SQLite and PostgreSQL (tests/api/conftest.py); the CLI's on SQLite."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from corral.db.audit_models import AuditRecord
from corral.db.models import Attempt, Job
from tests.api.conftest import World
from tests.api.helpers import add_node
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]

API = "/api/v1"
HOUR = 3600.0


def submit(world: World, user: str, gpus: int, name: str = "train", **extra: Any) -> int:
    body = {"name": name, "command": "true", "resources": {"gpus": gpus, "cpus": 2, "memory": "512MiB"}}
    r = world.client.post(f"{API}/jobs", json=body | extra, headers=world.as_(user))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def ran(
    world: World, job_id: int, submitted: float, spans: list[tuple[float, float | None]], state: str
) -> None:
    """Give a job the attempts the loops would have written: one per (start, end) span."""
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        job.submitted_at, job.state, job.attempt_count = submitted, state, len(spans)
        job.finished_at = spans[-1][1] if spans and state in ("succeeded", "failed", "cancelled") else None
        for number, (start, end) in enumerate(spans, 1):
            attempt_state = "running" if end is None else ("preempted" if number < len(spans) else state)
            db.add(
                Attempt(
                    job_id=job_id,
                    number=number,
                    state=attempt_state,
                    created_at=start,
                    started_at=start,
                    ended_at=end,
                    message="",
                    placement=[],
                )
            )
        db.commit()


def history(world: World) -> dict[str, int]:
    """Two groups on one node of 2 A100s: nlp (guaranteed 1) filled the node with four 10-minute
    jobs; vision (no guarantee) came 10 s later and waited. Plus jobs that must not be exported
    or only as censored: one cancelled while queued, one still running, one 40 days old."""
    now = time.time()
    with world.session_factory() as db:
        add_node(db, "n1", gpus=2, model="A100")
        db.commit()
    r = world.client.put(
        f"{API}/groups/nlp/quota", json={"gpu_model": "*", "guaranteed": 1}, headers=world.as_("admin")
    )
    assert r.status_code == 200, r.text
    t0 = now - 2 * HOUR
    ids: dict[str, int] = {}
    for i in range(4):  # two ran at once, two after them
        ids[f"nlp{i}"] = submit(world, "carol", 1, name="sweep")
        start = t0 + i if i < 2 else t0 + 600 + (i - 2)
        ran(world, ids[f"nlp{i}"], t0 + i, [(start, start + 600)], "succeeded")
    # vision: 2 GPUs as 2 instances of 1 GPU; preempted once after 100 s, then ran 200 s more
    ids["vision"] = submit(world, "alice", 1, name="resnet", instances=2, max_runtime="1h")
    ran(world, ids["vision"], t0 + 10, [(t0 + 1200, t0 + 1300), (t0 + 1350, t0 + 1550)], "failed")
    # a CPU-only job: the local engine runs those on GPU nodes, and so must the replay
    ids["cpu"] = submit(world, "carol", 0, name="prep")
    ran(world, ids["cpu"], t0 + 5, [(t0 + 5, t0 + 65)], "succeeded")
    ids["never"] = submit(world, "alice", 1)
    ran(world, ids["never"], t0 + 20, [], "cancelled")
    ids["running"] = submit(world, "bob", 1)
    ran(world, ids["running"], now - 300, [(now - 240, None)], "running")
    ids["old"] = submit(world, "bob", 1)
    ran(world, ids["old"], now - 40 * 24 * HOUR, [(now - 40 * 24 * HOUR, now - 39 * 24 * HOUR)], "succeeded")
    return ids


def export(world: World, user: str = "admin", **params: Any) -> Any:
    return world.client.get(f"{API}/admin/sim-export", params=params, headers=world.as_(user))


def test_export_has_the_jobs_that_ran_with_their_sizes_groups_and_times(world: World) -> None:
    ids = history(world)
    r = export(world)
    assert r.status_code == 200, r.text
    data = r.json()
    jobs = {j["job_id"]: j for j in data["jobs"]}
    # finished jobs of the last 30 days only: not the running one, the old one or the never-started
    assert set(jobs) == {f"job-{ids[k]}" for k in ("nlp0", "nlp1", "nlp2", "nlp3", "vision", "cpu")}
    assert jobs[f"job-{ids['cpu']}"]["num_gpus"] == 0
    first = jobs[f"job-{ids['nlp0']}"]
    assert first["submit_time"] == 0.0 and first["duration"] == 600.0 and first["wait_s"] == 0.0
    assert (first["group"], first["user"], first["name"], first["num_gpus"]) == ("nlp", "carol", "sweep", 1)
    assert jobs[f"job-{ids['nlp2']}"]["wait_s"] == 598.0  # submitted at 2 s, started at 600 s
    vision = jobs[f"job-{ids['vision']}"]
    assert (vision["num_gpus"], vision["instances"], vision["group"]) == (2, 2, "vision")
    assert vision["submit_time"] == 10.0 and vision["max_runtime_s"] == 3600.0
    assert vision["duration"] == 300.0  # 100 s + 200 s: the time it actually ran
    assert vision["first_wait_s"] == 1190.0 and vision["wait_s"] == 1190.0 + 50.0  # every wait
    assert (vision["cpus"], vision["memory_mib"], vision["attempts"]) == (2.0, 512, 2)
    assert data["policy"] == "default" and data["counts"]["never_ran"] == 1
    assert "1 job that ended without ever starting (cancelled, refused) left out" in data["notes"]
    assert data["policy_knobs"] == {"cpu_jobs_on_gpu_nodes": True}  # the local engine's rule
    cluster = data["cluster"]
    assert cluster["pools"] == [
        {"name": "a100x2", "count": 1, "gpus_per_node": 2, "gpu_model": "A100", "cpus": 16.0}
        | {"memory_mib": 65536}
    ]
    nlp = next(g for g in cluster["groups"] if g["name"] == "nlp")
    assert nlp["guaranteed"] == 1 and nlp["borrowing"] is True
    # with --unfinished the running job comes too, censored at its run time so far
    data = export(world, unfinished=True).json()
    running = next(j for j in data["jobs"] if j["job_id"] == f"job-{ids['running']}")
    assert running["censored"] is True and 239.0 <= running["duration"] <= 260.0
    assert data["counts"]["censored"] == 1
    assert any(note.startswith("1 job still running or waiting:") for note in data["notes"])


def test_the_exports_rows_written_as_a_csv_replay_without_a_note(world: World, tmp_path: Path) -> None:
    """A trace's columns the format does not have are named in its notes (7bd7305), the export's
    observed ones known: every column of its rows was, but `mixed_tasks`, so a CSV of the rows
    (every key a column) said 'column(s) not read: mixed_tasks', as if misspelt."""
    from corral.sim.trace import load_generic_csv

    history(world)
    rows = export(world, unfinished=True).json()["jobs"]
    path = tmp_path / "export.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)
    assert load_generic_csv(path).notes == ()


def test_since_filters_and_a_bad_since_is_a_422_naming_it(world: World) -> None:
    history(world)
    assert len(export(world, since="45d").json()["jobs"]) == 7  # the 40-day-old job comes too
    assert export(world, since="1h").json()["jobs"] == []  # all submitted ~2 h ago
    for bad in ("yesterday", "1e999", "-5d"):
        r = export(world, since=bad)
        assert r.status_code == 422, (bad, r.text)
        assert "since" in r.text and bad in r.text
    r = export(world, since=str(time.time() + 3600))
    assert r.status_code == 422 and "not in the past" in r.text


def test_anonymised_export_has_no_real_names(world: World) -> None:
    history(world)
    r = export(world, anonymise=True, since="45d")
    assert r.status_code == 200, r.text
    text = r.text
    for real in ("alice", "bob", "carol", "vision", "nlp", "sweep", "resnet"):
        assert real not in text, real
    jobs = r.json()["jobs"]
    groups = {j["group"] for j in jobs}
    assert groups == {"group-1", "group-2"}
    # stable within the export: carol's four runs are one user, one group, one job name
    sweeps = [j for j in jobs if j["num_gpus"] == 1 and j["duration"] == 600.0]
    assert len({(j["user"], j["group"], j["name"]) for j in sweeps}) == 1 and len(sweeps) >= 4
    names = {g["name"] for g in r.json()["cluster"]["groups"]}
    assert groups <= names and not names & {"vision", "nlp"}


def test_only_admins_may_export_and_every_export_is_audited(world: World) -> None:
    history(world)
    for user in ("alice", "bob"):  # a member, a group admin
        r = export(world, user)
        assert r.status_code == 403, r.text
    assert export(world, anonymise=True).status_code == 200
    with world.session_factory() as db:
        rows = list(db.scalars(sa.select(AuditRecord).where(AuditRecord.action == "cluster.history.export")))
    assert len(rows) == 1
    assert rows[0].actor == "admin" and rows[0].after is not None
    assert rows[0].after["anonymised"] is True and rows[0].after["jobs"] == 6


# The CLI's part does not depend on the database (the export's is tested on both above): SQLite only.
SQLITE_ONLY = pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)


@SQLITE_ONLY
def test_cli_replays_the_history_and_shows_a_quota_change_per_group(
    world: World, server_url: str, tmp_path: Path
) -> None:
    history(world)
    out = tmp_path / "whatif"
    code, text = run(
        world,
        server_url,
        "admin",
        "sim",
        "--from-cluster",
        "--quota",
        "vision=2",
        "--out",
        str(out),
        "-o",
        "json",
    )
    assert code == 0, text
    report = json.loads(text.strip().splitlines()[-1])
    groups = {g["group"]: g for g in report["groups"]}
    assert report["changes"] == ["vision: guaranteed 2"]
    # vision (no guarantee) waited for nlp's borrowed GPUs; guaranteed 2, it takes them back
    vision, nlp = groups["vision"], groups["nlp"]
    assert vision["avg_queue_s_changed"] < vision["avg_queue_s_current"] - 300
    assert nlp["avg_queue_s_changed"] >= nlp["avg_queue_s_current"]  # nlp pays for it
    assert nlp["jobs"] == 5 and nlp["rejected_current"] == nlp["rejected_changed"] == 0  # the CPU job ran
    assert vision["live_avg_queue_s"] == 1240.0
    for name in ("trace.csv", "cluster.yaml", "whatif.json", "queue_cdf.png", "gpu_alloc.png"):
        assert (out / name).stat().st_size > 0, name
    # the table: one row per group with both columns and the change
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--quota", "vision=2:2")
    assert code == 0, text
    assert "changes: vision: guaranteed 2 max 2" in text and "per group" in text
    vision_row = next(line for line in text.splitlines() if line.startswith("│ vision"))
    assert "1,240" in vision_row and "+" not in vision_row  # live wait; nothing longer for vision


@SQLITE_ONLY
def test_cli_errors_are_clear(world: World, server_url: str, tmp_path: Path) -> None:
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--since", "1h")
    assert code == 2 and "no finished jobs since" in text
    history(world)
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--quota", "physics=4")
    assert code == 2 and "unknown group 'physics'" in text and "nlp" in text
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--quota", "vision=lots")
    assert code == 2 and "GROUP=GUARANTEED[:MAX]" in text
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--quota", "vision=4:2")
    assert code == 2 and "below the guarantee" in text
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--quota", "vision@h100=1")
    assert code == 2 and "no 'h100' GPUs; its models: A100" in text
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--quota", "vision@a100=1:none")
    assert code == 0 and "vision: guaranteed 1 of A100 max none" in text
    code, text = run(world, server_url, "alice", "sim", "--from-cluster")
    assert code == 1 and "administrator" in text
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--since", "soon")
    assert code == 1 and "since 'soon' is not a time" in text
    saved = tmp_path / "live.csv"
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--save-trace", str(saved))
    assert code == 0, text
    assert len(saved.read_text().splitlines()) == 1 + 6  # header and the six finished jobs
    assert "gpus_per_node: 2" in saved.with_suffix(".cluster.yaml").read_text()
    code, text = run(world, server_url, "admin", "sim", "--trace", "x.csv", "--quota", "a=1")
    assert code == 2 and "go with --from-cluster" in text


@SQLITE_ONLY
def test_a_failed_from_cluster_run_leaves_no_out_folder_behind(
    world: World, server_url: str, tmp_path: Path
) -> None:
    """`--out DIR` was made before the export was asked for, so no jobs, a bad --since or a
    refusal by the server left an empty DIR behind; a DIR that was there before is kept."""
    out = tmp_path / "whatif"
    code, text = run(world, server_url, "admin", "sim", "--from-cluster", "--since", "1h", "--out", str(out))
    assert code == 2 and "no finished jobs since" in text
    assert not out.exists()
    history(world)
    code, text = run(
        world, server_url, "admin", "sim", "--from-cluster", "--since", "soon", "--out", str(out)
    )
    assert code == 1 and "since 'soon' is not a time" in text
    assert not out.exists()
    code, text = run(world, server_url, "alice", "sim", "--from-cluster", "--out", str(out / "deeper"))
    assert code == 1 and "administrator" in text
    assert not out.exists()
    saved = tmp_path / "traces" / "live.csv"
    code, text = run(world, server_url, "alice", "sim", "--from-cluster", "--save-trace", str(saved))
    assert code == 1 and not saved.parent.exists()
    out.mkdir()
    code, text = run(world, server_url, "alice", "sim", "--from-cluster", "--out", str(out))
    assert code == 1 and out.is_dir()  # there before: kept
    code, text = run(
        world, server_url, "admin", "sim", "--from-cluster", "--out", str(out / "run1"), "-o", "json"
    )
    assert code == 0 and (out / "run1" / "whatif.json").is_file(), text
