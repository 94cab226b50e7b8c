"""A job's reported metrics over the API (GET /jobs/{id}/metrics): the lines the job appends to
$CORRAL_OUTPUTS/metrics.jsonl, written here where the job's /outputs is on the storage root;
points in order with each name's latest value, a line still being written left out, bad lines
skipped and counted, the tail of a long file, no file yet, and only for jobs the caller sees."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from corral.config import Settings
from corral.services import job_metrics
from corral.storage.layout import outputs_dir
from tests.api.conftest import SIMPLE_JOB, World

JOBS = "/api/v1/jobs"


def submitted(world: World, user: str = "alice") -> int:
    r = world.client.post(JOBS, json=SIMPLE_JOB, headers=world.as_(user))
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def metrics_file(settings: Settings, job_id: int) -> Path:
    top = outputs_dir(settings.storage_path, job_id)
    top.mkdir(parents=True, exist_ok=True)
    return top / "metrics.jsonl"


def read(world: World, job_id: int, user: str = "alice") -> dict[str, object]:
    r = world.client.get(f"{JOBS}/{job_id}/metrics", headers=world.as_(user))
    assert r.status_code == 200, r.text
    body: dict[str, object] = r.json()
    return body


def test_points_in_order_with_the_latest_of_each_name(world: World, settings: Settings) -> None:
    job = submitted(world)
    metrics_file(settings, job).write_text(
        '{"step": 1, "loss": 0.9, "accuracy": 0.5}\n'
        '{"step": 2, "loss": 0.7}\n'
        "epoch 2 done\n"  # a stray print: skipped, counted
        '{"step": 3, "loss": true}\n'  # a boolean is no number
        '{"loss": 0.6, "lr": 1e-3}\n'
        '{"step": 4, "loss": 0.5'  # still being written: no newline yet
    )
    body = read(world, job)
    assert body["points"] == [
        {"step": 1, "values": {"loss": 0.9, "accuracy": 0.5}},
        {"step": 2, "values": {"loss": 0.7}},
        {"step": None, "values": {"loss": 0.6, "lr": 0.001}},
    ]
    assert body["latest"] == {"loss": 0.6, "accuracy": 0.5, "lr": 0.001}
    assert body["skipped"] == 2 and body["truncated"] is False
    with metrics_file(settings, job).open("a") as fh:
        fh.write("}\n")  # the line is complete now
    assert read(world, job)["latest"] == {"loss": 0.5, "accuracy": 0.5, "lr": 0.001}


def test_a_whole_number_no_float_holds_is_skipped_not_a_server_error(
    world: World, settings: Settings
) -> None:
    """JSON's integers have no bound: math.isfinite(10**400) raised OverflowError, and one such
    line failed the job's metrics and every page of GET /jobs/metrics it was on (review108 #1)."""
    job = submitted(world)
    metrics_file(settings, job).write_text(
        '{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 1' + "0" * 400 + "}\n"
    )
    body = read(world, job)
    assert body["points"] == [{"step": 1, "values": {"loss": 0.5}}] and body["skipped"] == 1
    r = world.client.get(f"{JOBS}/metrics", params={"id": str(job)}, headers=world.as_("alice"))
    assert r.status_code == 200 and r.json()["items"][0]["latest"] == {"loss": 0.5}, r.text


def test_no_file_yet_is_no_points(world: World) -> None:
    job = submitted(world)
    body = read(world, job)
    assert body == {
        "job_id": job,
        "file": "metrics.jsonl",
        "points": [],
        "latest": {},
        "skipped": 0,
        "truncated": False,
        "error": None,
    }


def test_a_long_file_gives_its_latest_points(world: World, settings: Settings) -> None:
    job = submitted(world)
    line_count = 0
    with metrics_file(settings, job).open("w") as fh:
        while fh.tell() <= job_metrics.MAX_READ_BYTES + 1000:
            fh.write(json.dumps({"step": line_count, "loss": 1.0 / (line_count + 1)}) + "\n")
            line_count += 1
    body = read(world, job)
    points = body["points"]
    assert isinstance(points, list) and body["truncated"] is True and body["skipped"] == 0
    assert len(points) == job_metrics.MAX_POINTS
    assert points[-1]["step"] == line_count - 1
    assert [p["step"] for p in points] == list(range(line_count - len(points), line_count))


def test_a_link_is_not_followed_and_others_jobs_are_not_read(world: World, settings: Settings) -> None:
    job = submitted(world)
    secret = settings.storage_path / "server-only.txt"
    metrics_file(settings, job)  # makes the storage root
    secret.write_text('{"leaked": 1}\n')
    os.symlink(secret, metrics_file(settings, job))
    assert read(world, job)["points"] == []
    carols = submitted(world, "carol")
    metrics_file(settings, carols).write_text('{"loss": 1}\n')
    r = world.client.get(f"{JOBS}/{carols}/metrics", headers=world.as_("alice"))
    assert r.status_code == 404 and f"no job with id {carols}" in r.text
    assert read(world, carols, "carol")["latest"] == {"loss": 1.0}


def test_many_jobs_metrics_by_label_in_one_request(world: World, settings: Settings) -> None:
    def trial(n: int, user: str = "alice") -> int:
        spec = {**SIMPLE_JOB, "labels": {"experiment": "e1", "trial": n}}
        r = world.client.post(JOBS, json=spec, headers=world.as_(user))
        assert r.status_code == 201, r.text
        return int(r.json()["id"])

    first, second, quiet = trial(0), trial(1), trial(2)
    carols = trial(3, "carol")
    for job, losses in ((first, [0.9, 0.8, 0.7]), (second, [0.5]), (carols, [0.1])):
        lines = [json.dumps({"step": i + 1, "loss": loss}) for i, loss in enumerate(losses)]
        metrics_file(settings, job).write_text("\n".join(lines) + "\n")
    r = world.client.get(
        f"{JOBS}/metrics", params={"label": "experiment=e1", "tail": 2}, headers=world.as_("alice")
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["total"] == 3 and [i["job_id"] for i in body["items"]] == [first, second, quiet]
    by_id = {i["job_id"]: i for i in body["items"]}
    assert by_id[first]["points"] == [
        {"step": 2, "values": {"loss": 0.8}},
        {"step": 3, "values": {"loss": 0.7}},
    ]
    assert by_id[first]["truncated"] is True and by_id[first]["latest"] == {"loss": 0.7}
    assert by_id[second]["latest"] == {"loss": 0.5} and by_id[quiet]["points"] == []
    assert by_id[first]["state"] == "queued" and by_id[first]["labels"] == {"experiment": "e1", "trial": "0"}
    paged = world.client.get(
        f"{JOBS}/metrics",
        params={"id": f"{first},{second},{quiet}", "limit": 1, "offset": 1},
        headers=world.as_("alice"),
    ).json()
    assert paged["total"] == 3 and [i["job_id"] for i in paged["items"]] == [second]


def test_many_jobs_metrics_without_a_filter_pages_the_visible_jobs(world: World) -> None:
    mine = [submitted(world) for _ in range(3)]
    submitted(world, "carol")
    r = world.client.get(f"{JOBS}/metrics", params={"limit": 2}, headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    assert r.json()["total"] == 3 and [i["job_id"] for i in r.json()["items"]] == mine[:2]
    r = world.client.get(f"{JOBS}/metrics", params={"limit": 501}, headers=world.as_("alice"))
    assert r.status_code == 422, r.text


def test_a_window_starting_at_a_line_start_keeps_that_line(world: World, settings: Settings) -> None:
    job = submitted(world)
    lines = [json.dumps({"step": i, "loss": 0.5}).ljust(28) + "\n" for i in range(10)]
    assert {len(line) for line in lines} == {29}
    metrics_file(settings, job).write_text("".join(lines))
    with world.session_factory() as db:
        from corral.db.models import Job

        row = db.get(Job, job)
        assert row is not None
        view = job_metrics.read_metrics(settings, row, window=4 * 29)  # four whole lines
        assert [p["step"] for p in view["points"]] == [6, 7, 8, 9] and view["truncated"] is True
        view = job_metrics.read_metrics(settings, row, window=4 * 29 - 1)  # the first one cut
        assert [p["step"] for p in view["points"]] == [7, 8, 9]


def test_a_read_costs_what_tail_asks_not_what_the_file_holds(
    world: World, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = submitted(world)
    with metrics_file(settings, job).open("w") as fh:
        for step in range(200_000):  # ~5 MiB
            fh.write(f'{{"step": {step}, "loss": 0.5}}\n')
    parsed: list[bytes] = []
    parse = job_metrics.parse_point
    monkeypatch.setattr(job_metrics, "parse_point", lambda line: parsed.append(line) or parse(line))
    r = world.client.get(f"{JOBS}/metrics", params={"id": job, "tail": 3}, headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    (item,) = r.json()["items"]
    assert [p["step"] for p in item["points"]] == [199_997, 199_998, 199_999] and item["truncated"]
    assert len(parsed) == job_metrics.LATEST_POINTS  # not every line of the window
    parsed.clear()
    assert read(world, job)["points"][-1]["step"] == 199_999
    assert len(parsed) == job_metrics.MAX_POINTS


def test_lines_that_are_no_points_are_read_past_only_so_far(world: World, settings: Settings) -> None:
    job = submitted(world)
    with metrics_file(settings, job).open("w") as fh:
        fh.write('{"step": 1, "loss": 0.5}\n')
        fh.write("{}\n" * 1_000_000)  # junk on purpose, 2 MB: a parse each was seconds
        fh.write("x" * (job_metrics.MAX_LINE_BYTES + 1) + "\n")  # longer than any point
        fh.write('{"step": 2, "loss": 0.25}\n')
    body = read(world, job)
    assert body["points"] == [{"step": 2, "values": {"loss": 0.25}}]
    assert body["skipped"] == job_metrics.SKIP_LINES + 1 and body["truncated"] is True


def test_tail_times_limit_is_bounded(world: World) -> None:
    submitted(world)
    r = world.client.get(f"{JOBS}/metrics", params={"tail": 1000, "limit": 101}, headers=world.as_("alice"))
    assert r.status_code == 422 and "tail 1000 x limit 101 is 101000 points; at most 100000" in r.text
    r = world.client.get(f"{JOBS}/metrics", params={"tail": 1000, "limit": 100}, headers=world.as_("alice"))
    assert r.status_code == 200, r.text


def test_an_unreadable_outputs_dir_is_that_jobs_error_not_the_pages(world: World, settings: Settings) -> None:
    broken, fine = submitted(world), submitted(world)
    metrics_file(settings, fine).write_text('{"loss": 0.5}\n')
    top = outputs_dir(settings.storage_path, broken)
    top.parent.mkdir(parents=True, exist_ok=True)
    top.write_text("not a directory")  # as EACCES or a stale NFS handle: an OSError, not ENOENT
    r = world.client.get(f"{JOBS}/metrics", params={"id": f"{broken},{fine}"}, headers=world.as_("alice"))
    assert r.status_code == 200, r.text
    items = {i["job_id"]: i for i in r.json()["items"]}
    assert (
        items[broken]["points"] == [] and "outputs are unreadable: Not a directory" in items[broken]["error"]
    )
    assert items[fine]["latest"] == {"loss": 0.5} and items[fine]["error"] is None
    body = read(world, broken)
    assert body["points"] == [] and "Not a directory" in str(body["error"])


def test_many_metrics_of_one_user(world: World, settings: Settings) -> None:
    bobs = submitted(world, "bob")
    alices = submitted(world, "alice")
    r = world.client.get(f"{JOBS}/metrics", params={"user": "alice"}, headers=world.as_("bob"))
    assert r.status_code == 200 and [i["job_id"] for i in r.json()["items"]] == [alices], r.text
    r = world.client.get(f"{JOBS}/metrics", headers=world.as_("bob"))
    assert [i["job_id"] for i in r.json()["items"]] == [bobs, alices]
