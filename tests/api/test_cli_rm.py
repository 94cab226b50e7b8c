"""`corral rm` with an id given twice, and the errors it prints."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import World
from tests.api.test_catalog import finished_job
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture


def test_rm_of_a_repeated_id_deletes_it_once_and_succeeds(
    world: World, server_url: str, settings: Any
) -> None:
    """`corral rm 5 5` deleted job 5, then said "job 5: ... not found" and exited 1."""
    job = finished_job(world, "alice", {}, settings.storage_path)
    code, out = run(world, server_url, "alice", "rm", str(job), str(job))
    assert code == 0 and out.count(f"job {job} deleted") == 1 and "error" not in out, out


def test_rm_names_each_refused_job_once(world: World, server_url: str, settings: Any) -> None:
    """The server's answers name the job already: "error: job 9999: no job with id 9999"."""
    job = finished_job(world, "alice", {}, settings.storage_path)
    code, out = run(world, server_url, "carol", "rm", "9999", str(job), "0")
    assert code == 1, out
    assert "error: no job with id 9999" in out, out
    # alice's job, which carol may not see, answers as a missing one (named once, too)
    assert f"error: no job with id {job}\n" in out and f"job {job}: " not in out, out
    assert "error: job 0: " in out, out  # a refusal that does not name it keeps the prefix
