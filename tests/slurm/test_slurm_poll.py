"""Less CPU per Slurm job (docs/slurm.md, eighth round). The poll's squeue asks only for the live
attempts' jobs (by id), not for every job of their accounts that Slurm still holds within
MinJobAge: in a burst that was hundreds of ended jobs' lines, printed by squeue and parsed in
Python at every poll. The rank script starts no program at its end."""

from __future__ import annotations

import pytest

from corral.engine.base import AttemptPhase
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.cli import looks_unreachable
from tests.slurm.helpers import FINISHED, attempt, instance, wait_for

pytestmark = pytest.mark.slurm


def test_the_poll_lists_only_the_live_attempts_jobs(
    engine: SlurmEngine, squeue_calls: list[tuple[str, ...]]
) -> None:
    """Two attempts of one account end; a third is polled alone: squeue is asked for its job by id
    and prints its line only, not the two ended jobs the account still has in Slurm."""
    for aid in ("130.1", "131.1"):
        engine.launch(attempt(aid, instance("node1", "true")))
    for aid in ("130.1", "131.1"):
        assert wait_for(engine, aid, FINISHED).phase is AttemptPhase.SUCCEEDED
    ref = engine.launch(attempt("132.1", instance("node2", "echo polled")))
    squeue_calls.clear()
    assert wait_for(engine, "132.1", FINISHED).phase is AttemptPhase.SUCCEEDED
    assert squeue_calls, "the poll ran no squeue"
    for call in squeue_calls:
        assert f"--jobs={ref}" in call and not any(a.startswith("--users") for a in call), call
        printed = {line.split("|", 1)[0] for line in call[-1].splitlines() if line.strip()}
        assert printed <= {ref}, f"squeue printed other jobs' lines: {printed}"


def test_a_job_slurm_no_longer_knows_is_judged_not_an_outage(engine: SlurmEngine) -> None:
    """Asked for one job id it does not know, squeue says "slurm_load_jobs error: Invalid job id
    specified" and exits 1: that is Slurm's answer (the job was purged), so the attempt is judged
    from its exit files (here none: LOST), and the poll does not raise EngineUnavailable."""
    engine.adopt({"134.1": "99999999"})  # an id Slurm never gave: as if purged after MinJobAge
    status = engine.poll(["134.1"])["134.1"]
    assert status.phase is AttemptPhase.LOST, status
    assert "no longer knows job 99999999" in status.message


def test_slurms_unknown_job_answer_is_not_taken_for_unreachable() -> None:
    assert not looks_unreachable("slurm_load_jobs error: Invalid job id specified")
    assert looks_unreachable("slurm_load_jobs error: Unable to contact slurm controller (connect failure)")


def test_the_rank_script_needs_no_program_from_the_jobs_path(engine: SlurmEngine) -> None:
    """A job whose own PATH has none of the system's programs: the rank script's bookkeeping at
    the end (its sandbox's pid and environment for `corral exec` emptied) starts no program found
    on PATH, so it neither fails there nor leaves a pid that `corral exec` would try to enter."""
    engine.launch(attempt("136.1", instance("node2", "/bin/echo done", env={"PATH": "/nonexistent"})))
    status = wait_for(engine, "136.1", FINISHED)
    assert status.phase is AttemptPhase.SUCCEEDED, status
    log = engine.logs("136.1").data.decode()
    assert log == "done\n", log
    job_dir = engine.store.job_dir("136.1")
    for name in ("rank-0.pid", "rank-0.env"):
        path = job_dir / name
        assert not path.exists() or path.stat().st_size == 0, f"{name} left with {path.read_text()!r}"


def test_a_poll_of_live_jobs_and_one_slurm_no_longer_knows_reads_each_alone(
    engine: SlurmEngine, squeue_calls: list[tuple[str, ...]]
) -> None:
    """The usual case in production: live jobs polled by id beside one Slurm has purged. Asked for
    several ids, squeue leaves the unknown one out (no error): the live ones keep their phase
    from its lines, the purged one is judged from its exit files (none: LOST)."""
    refs = [engine.launch(attempt(aid, instance("node1", "sleep 30"))) for aid in ("137.1", "138.1")]
    for aid in ("137.1", "138.1"):
        wait_for(engine, aid, {AttemptPhase.RUNNING})
    engine.adopt({"139.1": "99999998"})  # an id Slurm never gave: as if purged after MinJobAge
    squeue_calls.clear()
    found = engine.poll(["137.1", "138.1", "139.1"])
    assert found["137.1"].phase is AttemptPhase.RUNNING and found["138.1"].phase is AttemptPhase.RUNNING
    assert found["139.1"].phase is AttemptPhase.LOST, found["139.1"]
    asked = [a for call in squeue_calls for a in call if a.startswith("--jobs=")]
    assert asked and set(asked[-1].removeprefix("--jobs=").split(",")) == {*refs, "99999998"}, asked
    for aid in ("137.1", "138.1"):
        engine.stop(aid, grace_s=0)
