"""`corral hold`, `corral release`, `corral submit --hold` and `corral events` against a real
server: their lines, exit codes, and what `ls`, `show`, `why` and `logs` say of a held job."""

from __future__ import annotations

import json
import re
from pathlib import Path

from corral.cli.jobs import start_line
from corral.sdk import Client
from tests.api.conftest import World
from tests.api.helpers import add_node, make_running
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture
SINCE = r"since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def submitted(world: World, url: str, spec: Path, *args: str) -> int:
    code, out = run(world, url, "alice", "submit", str(spec), *args, "-o", "json")
    assert code == 0, out
    return int(json.loads(out)["id"])


def spec_file(tmp_path: Path) -> Path:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: cli-job\ncommand: echo hi\nresources: {memory: 256MiB}\n")
    return spec


def test_submit_hold_and_what_ls_show_why_logs_say(world: World, server_url: str, tmp_path: Path) -> None:
    code, out = run(world, server_url, "alice", "submit", str(spec_file(tmp_path)), "--hold")
    assert code == 0, out
    job = int(re.search(r"job (\d+) ", out).group(1))  # type: ignore[union-attr]
    assert out.strip() == f"job {job} (cli-job) queued (held) in group vision"
    code, out = run(world, server_url, "alice", "ls")
    assert code == 0 and re.search(rf"^\s*{job}\s+cli-job\s+queued \(held\)\s+alice", out, re.M), out
    held = rf"held by alice {SINCE}: corral release {job}"
    for command in ("show", "why"):
        code, out = run(world, server_url, "alice", command, str(job))
        assert code == 0 and re.search(rf"why pending: {held}\s+\(on_hold, hold\)", out), out
        assert "estimated start: none while it is held (see why pending)" in out, out
        assert "queue position" not in out and "quota or cap" not in out, out
    code, out = run(world, server_url, "alice", "why", str(job), "-o", "json")
    assert code == 0 and json.loads(out)["diagnosis"]["held"] is True, out
    code, out = run(world, server_url, "alice", "logs", str(job))
    assert code == 0 and re.search(rf"job {job} is queued: {held}", out), out
    assert "estimated start" not in out
    code, out = run(world, server_url, "alice", "release", str(job))
    assert (code, out.strip()) == (0, f"job {job} released: it is queued again")
    code, out = run(world, server_url, "alice", "ls")
    assert "(held)" not in out and re.search(rf"^\s*{job}\s+cli-job\s+queued\s+alice", out, re.M), out


def test_hold_and_release_several_jobs_each_on_its_line(
    world: World, server_url: str, tmp_path: Path
) -> None:
    with world.session_factory() as db:
        add_node(db, "n1")
        db.commit()
    spec = spec_file(tmp_path)
    first, second, running = (submitted(world, server_url, spec) for _ in range(3))
    with world.session_factory() as db:
        make_running(db, running)
    code, out = run(world, server_url, "alice", "hold", str(first), str(first), str(second))
    assert code == 0, out
    lines = out.strip().splitlines()
    assert len(lines) == 2 and re.fullmatch(
        rf"job {first} held by alice {SINCE}: corral release {first}", lines[0]
    )
    assert re.fullmatch(rf"job {second} held by alice {SINCE}: corral release {second}", lines[1]), out
    code, out = run(world, server_url, "alice", "hold", str(first), str(running), "99999")
    assert code == 1, out
    lines = out.strip().splitlines()
    assert re.fullmatch(rf"job {first} was already held by alice {SINCE}: corral release {first}", lines[0])
    assert lines[1:] == [
        f"error: job {running} is running: only a queued job can be held; cancel it instead",
        "error: no job with id 99999",
    ], out
    code, out = run(world, server_url, "alice", "release", str(first), str(second), str(running))
    assert code == 0, out
    assert out.strip().splitlines() == [
        f"job {first} released: it is queued again",
        f"job {second} released: it is queued again",
        f"job {running} is not held",
    ]


def test_an_admin_hold_refuses_the_owners_release(world: World, server_url: str, tmp_path: Path) -> None:
    job = submitted(world, server_url, spec_file(tmp_path))
    code, out = run(world, server_url, "admin", "hold", str(job))
    assert code == 0 and out.startswith(f"job {job} held by admin since "), out
    code, out = run(world, server_url, "alice", "show", str(job))
    assert "held by an admin: only an admin can release it" in out, out
    code, out = run(world, server_url, "alice", "release", str(job))
    assert code == 1, out
    assert out.strip() == f"error: job {job} is held by admin as an admin: only an admin can release it"
    code, out = run(world, server_url, "admin", "release", str(job))
    assert (code, out.strip()) == (0, f"job {job} released: it is queued again")


def test_hold_and_release_by_label(world: World, server_url: str, tmp_path: Path) -> None:
    """`corral hold -l` / `release -l` (SDK hold_by_labels / release_by_labels): a line per job
    and the count; an admin's hold refused on stderr with exit 1, the others released."""
    spec = spec_file(tmp_path)
    trial, admins = (submitted(world, server_url, spec, "-l", "exp=e1") for _ in range(2))
    other = submitted(world, server_url, spec, "-l", "exp=e2")
    assert run(world, server_url, "admin", "hold", str(admins))[0] == 0
    code, out = run(world, server_url, "alice", "hold", "-l", "exp=e1")
    assert code == 0, out
    lines = out.strip().splitlines()
    assert re.fullmatch(rf"job {trial} held by alice {SINCE}: corral release {trial}", lines[0]), out
    assert lines[1].startswith(f"job {admins} was already held by admin ") and lines[2:] == [
        "2 queued jobs with exp=e1"
    ], out
    code, out = run(world, server_url, "alice", "release", "-l", "exp")
    assert code == 1, out
    assert out.strip().splitlines() == [
        f"job {trial} released: it is queued again",
        f"error: job {admins} is held by admin as an admin: only an admin can release it",
        f"job {other} is not held",
        "3 queued jobs with exp",
    ], out
    code, out = run(world, server_url, "alice", "hold", str(trial), "-l", "exp=e1")
    assert code == 1 and "give job ids or labels (-l NAME=VALUE), one of them" in out, out
    code, out = run(world, server_url, "alice", "release")
    assert code == 1 and "give job ids or labels" in out, out
    assert Client(server_url, world.as_("alice")["Authorization"].split()[1]).release_by_labels(
        {"exp": "e2"}
    )["items"] == [
        {
            "id": other,
            "outcome": "unchanged",
            "state": "queued",
            "held": False,
            "message": f"job {other} is not held",
        }
    ]


def test_events_lists_a_jobs_history(world: World, server_url: str, tmp_path: Path) -> None:
    job = submitted(world, server_url, spec_file(tmp_path), "--hold")
    run(world, server_url, "bob", "release", str(job))
    code, out = run(world, server_url, "alice", "events", str(job))
    assert code == 0, out
    lines = [line.strip() for line in out.strip().splitlines()]
    assert lines[0].split() == ["TIME", "KIND", "STATE", "MESSAGE"]
    assert re.search(r"transition\s+queued\s+submitted by alice to group vision$", lines[1]), out
    assert re.search(r"hold\s+queued\s+held by alice$", lines[2]), out
    assert re.search(r"release\s+queued\s+released by bob$", lines[3]), out
    assert lines[4] == "3 events"
    code, out = run(world, server_url, "alice", "events", str(job), "-o", "json")
    token = world.as_("alice")["Authorization"].split()[1]
    with Client(server_url, token) as client:
        assert code == 0 and json.loads(out) == {"events": client.events(job), "earlier_events": 0}
    assert [e["kind"] for e in json.loads(out)["events"]] == ["transition", "hold", "release"]
    code, out = run(world, server_url, "carol", "events", str(job))
    assert code == 1 and f"no job with id {job}" in out, out  # as a missing job


def test_the_start_line_tells_a_hold_from_a_quota_or_cap() -> None:
    """`held` is true for both (no time by design): the reason's code says which kind."""
    on_hold = {"held": True, "reasons": [{"code": "on_hold", "source": "hold", "message": "held by ann"}]}
    by_quota = {"held": True, "reasons": [{"code": "quota_max", "source": "quota", "message": "waits"}]}
    assert start_line(on_hold) == "none while it is held (see why pending)"
    assert start_line(by_quota) == "none while it is held back by its quota or cap (see why pending)"
    assert start_line({"held": False, "reasons": [], "estimated_start": None}) == "unknown"
