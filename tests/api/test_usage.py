"""Usage accounting: GPU-hours and CPU-hours per user and group from the attempts' own records,
clipped to the period, running attempts counted up to now; who sees what; CLI table and CSV."""

from __future__ import annotations

import csv
import io
import json
import time

import pytest

from corral.db.models import Attempt, Job
from corral.services.usage import AttemptRecord, UsageBy, summarize
from tests.api.conftest import SIMPLE_JOB, World
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]
API = "/api/v1"
H = 3600.0


def test_summarize_clips_to_the_period_and_counts_running_attempts_up_to_now() -> None:
    records = [
        AttemptRecord(1, "alice", "vision", started_at=0.0, ended_at=4 * H, gpus=2, cpus=8.0),  # 2 h inside
        AttemptRecord(1, "alice", "vision", started_at=5 * H, ended_at=6 * H, gpus=2, cpus=8.0),  # 1 h
        AttemptRecord(2, "bob", "vision", started_at=7 * H, ended_at=None, gpus=1, cpus=1.0),  # running: 1 h
        AttemptRecord(3, "carol", "nlp", started_at=0.0, ended_at=H, gpus=8, cpus=8.0),  # before: nothing
    ]
    report = summarize(records, UsageBy.USER, since=2 * H, until=10 * H, now=8 * H)
    by_name = {r.name: r for r in report.rows}
    assert set(by_name) == {"alice", "bob"}
    assert by_name["alice"].gpu_hours == pytest.approx(6.0) and by_name["alice"].cpu_hours == pytest.approx(
        24.0
    )
    assert by_name["alice"].jobs == 1 and by_name["alice"].attempts == 2
    assert by_name["bob"].gpu_hours == pytest.approx(1.0) and by_name["bob"].cpu_hours == pytest.approx(1.0)
    assert report.total.gpu_hours == pytest.approx(7.0) and report.total.jobs == 2
    groups = summarize(records, UsageBy.GROUP, since=2 * H, until=10 * H, now=8 * H)
    assert [(r.name, round(r.gpu_hours, 6)) for r in groups.rows] == [("vision", 7.0)]
    # a job that ran under a second by Slurm's whole-second clock (started == ended) still ran
    instant = AttemptRecord(4, "carol", "nlp", started_at=3 * H, ended_at=3 * H, gpus=1, cpus=1.0)
    report = summarize([*records, instant], UsageBy.USER, since=2 * H, until=10 * H, now=8 * H)
    carol = {r.name: r for r in report.rows}["carol"]
    assert (carol.gpu_hours, carol.jobs, carol.attempts, report.total.jobs) == (0.0, 1, 1, 3)


def add_attempt(world: World, user: str, *, start: float, end: float | None, gpus: int, cpus: float) -> int:
    """A job of `user` with one attempt as the loops record it: placed GPUs/CPUs, start and end."""
    r = world.client.post(f"{API}/jobs", json=SIMPLE_JOB, headers=world.as_(user))
    assert r.status_code == 201, r.text
    job_id = int(r.json()["id"])
    with world.session_factory() as db:
        job = db.get(Job, job_id)
        assert job is not None
        job.state = "running" if end is None else "succeeded"
        db.add(
            Attempt(
                job_id=job_id,
                number=1,
                state="running" if end is None else "succeeded",
                created_at=start,
                started_at=start,
                ended_at=end,
                message="",
                placement=[
                    {
                        "role": "main",
                        "index": 0,
                        "rank": 0,
                        "node": "n1",
                        "gpu_indices": list(range(gpus)),
                        "gpu_uuids": [f"n1-gpu{i}" for i in range(gpus)],
                        "cpus": cpus,
                        "memory_mib": 1024,
                    }
                ],
            )
        )
        db.commit()
    return job_id


def rows(world: World, user: str, **query: object) -> dict[str, dict[str, float]]:
    r = world.client.get(f"{API}/usage", params=query, headers=world.as_(user))
    assert r.status_code == 200, r.text
    return {row["name"]: row for row in r.json()["rows"]}


def test_usage_api_by_user_and_group_with_visibility(world: World) -> None:
    now = time.time()
    add_attempt(world, "alice", start=now - 3 * H, end=now - H, gpus=2, cpus=4)  # 4 GPU-h
    add_attempt(world, "bob", start=now - H, end=None, gpus=1, cpus=2)  # running: ~1 GPU-h so far
    add_attempt(world, "carol", start=now - 2 * H, end=now, gpus=4, cpus=1)  # 8 GPU-h
    add_attempt(world, "carol", start=now - 60 * 86400, end=now - 50 * 86400, gpus=8, cpus=1)  # before
    everyone = rows(world, "admin")
    assert set(everyone) == {"alice", "bob", "carol"}
    assert everyone["alice"]["gpu_hours"] == pytest.approx(4.0) and everyone["alice"][
        "cpu_hours"
    ] == pytest.approx(8.0)
    assert everyone["bob"]["gpu_hours"] == pytest.approx(1.0, abs=0.01)
    assert everyone["carol"]["gpu_hours"] == pytest.approx(8.0) and everyone["carol"]["jobs"] == 1
    assert set(rows(world, "alice")) == {"alice"}  # a member: their own
    assert set(rows(world, "bob")) == {"alice", "bob"}  # vision's admin: the group's
    assert set(rows(world, "carol")) == {"carol"}
    groups = rows(world, "admin", by="group")
    assert groups["vision"]["gpu_hours"] == pytest.approx(5.0, abs=0.01) and groups["nlp"]["jobs"] == 1
    clipped = rows(world, "admin", since=now - 2 * H, until=now - H)  # one hour of each
    assert clipped["alice"]["gpu_hours"] == pytest.approx(2.0) and clipped["carol"][
        "gpu_hours"
    ] == pytest.approx(4.0)
    assert "bob" not in clipped  # started at the period's end
    old = rows(world, "admin", since=now - 61 * 86400, until=now - 49 * 86400)
    assert old["carol"]["gpu_hours"] == pytest.approx(8 * 240.0)


def test_usage_api_refuses_bad_periods_and_groupings(world: World) -> None:
    r = world.client.get(f"{API}/usage", params={"by": "node"}, headers=world.as_("alice"))
    assert r.status_code == 422 and "'user' or 'group'" in r.json()["detail"][0]["msg"]  # the schema's enum
    r = world.client.get(f"{API}/usage", params={"since": 200, "until": 100}, headers=world.as_("alice"))
    assert r.status_code == 422 and "must be before" in r.json()["detail"][0]["msg"]
    # the times as dates, not the unix seconds the CLI made of '--since 2026-12-01'
    assert "'since' (1970-01-01 00:03:20 UTC) must be before 'until' (1970-01-01 00:01:40 UTC)" in r.text


def test_usage_api_takes_the_time_forms_audit_takes(world: World) -> None:
    """`since`/`until` as ages ('7d', '12h', '30m'), unix seconds or ISO times, as for /audit."""
    now = time.time()
    add_attempt(world, "alice", start=now - 3 * H, end=now - H, gpus=2, cpus=4)  # 2 GPUs for 2 h
    for since, until, hours in (("7d", None, 4.0), ("150m", "1h", 3.0), ("2h", "90m", 1.0)):
        params = {"since": since} if until is None else {"since": since, "until": until}
        r = world.client.get(f"{API}/usage", params=params, headers=world.as_("alice"))
        assert r.status_code == 200, (since, until, r.text)
        assert r.json()["total"]["gpu_hours"] == pytest.approx(hours, abs=0.01), (since, until)
    body = world.client.get(f"{API}/usage", params={"since": "12h"}, headers=world.as_("alice")).json()
    assert body["since"] == pytest.approx(now - 12 * H, abs=60)
    iso = world.client.get(
        f"{API}/usage",
        params={"since": "2026-01-01T00:00Z", "until": "2026-01-02"},
        headers=world.as_("alice"),
    )
    assert iso.status_code == 200 and iso.json()["until"] == 1767312000.0  # 2026-01-02 00:00 UTC
    for field, bad, says in (
        ("since", "last week", "since 'last week' is not a time: give an age such as '7d'"),
        ("until", "soon", "until 'soon' is not a time"),
        ("since", "1e999", "since '1e999' is out of range"),
        ("until", "-5", "until '-5' is out of range"),
    ):
        r = world.client.get(f"{API}/usage", params={field: bad}, headers=world.as_("alice"))
        assert r.status_code == 422, (field, bad, r.text)
        detail = r.json()["detail"][0]
        assert detail["loc"] == ["query", field] and says in detail["msg"], detail
    spec = world.client.get("/openapi.json").json()["paths"][f"{API}/usage"]["get"]["parameters"]
    since_doc = next(p for p in spec if p["name"] == "since")["description"]
    assert "'7d', '12h' or '30m'" in since_doc and "unix seconds" in since_doc and "ISO" in since_doc


def test_cli_usage_table_csv_and_json(world: World, server_url: str) -> None:
    now = time.time()
    add_attempt(world, "alice", start=now - 3 * H, end=now - H, gpus=2, cpus=4)
    add_attempt(world, "carol", start=now - 2 * H, end=now, gpus=1, cpus=1)
    code, out = run(world, server_url, "admin", "usage", "--since", "1d", "--by", "group", "-o", "csv")
    assert code == 0, out
    table = list(csv.reader(io.StringIO(out)))
    assert table[0] == ["group", "gpu_hours", "cpu_hours", "jobs", "attempts"]
    assert {r[0]: float(r[1]) for r in table[1:]} == pytest.approx({"vision": 4.0, "nlp": 2.0})
    code, out = run(world, server_url, "admin", "usage")
    assert code == 0 and "GPU-HOURS" in out and "alice" in out and "4.00" in out and "total" in out
    code, out = run(world, server_url, "alice", "usage", "-o", "json")
    assert [r["name"] for r in json.loads(out)["rows"]] == ["alice"]
    code, out = run(world, server_url, "alice", "usage", "--since", "last week")
    assert code == 1 and "--since: cannot read 'last week' as a time" in out
    code, out = run(world, server_url, "alice", "usage", "--since", "7d", "--until", "soon")
    assert code == 1 and "--until: cannot read 'soon' as a time" in out  # which of the two
