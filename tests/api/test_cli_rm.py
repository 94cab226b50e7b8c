"""`corral rm` with an id given twice."""

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
