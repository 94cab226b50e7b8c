"""engine/slurm/unreadable.py's bookkeeping at scale, without Slurm (review: above 1,024 tracked
attempts every call walked all of them, 3.8 s a poll at 5,000, and the log's pace was cleared so
that every attempt logged at every poll). A clock of the test's own stands for time.monotonic."""

from __future__ import annotations

import logging
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from corral.engine.base import AttemptPhase, EngineUnavailable, FailureReason
from corral.engine.slurm import SlurmEngine, unreadable
from corral.engine.slurm.cli import CliResult, SlurmJob
from corral.engine.slurm.mapping import UNREADABLE_KILLED, stop_kind, terminal_status
from corral.engine.slurm.scripts import job_name
from corral.engine.slurm.state import AttemptRecord, StopRequest
from corral.engine.slurm.unreadable import FORGET_AFTER_S, LOG_EVERY_S, PRUNE_EVERY_S, UnreadableAttempts

MANY = 5000


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def raised_and_logged(attempts: UnreadableAttempts, aid: str) -> None:
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        attempts.log_error(aid)


def test_thousands_of_unreadable_attempts_are_walked_at_most_once_per_prune_interval() -> None:
    clock = Clock()
    attempts = UnreadableAttempts(600, clock=clock)
    for _poll in range(3):  # three polls of MANY unreadable attempts, a second apart
        for n in range(MANY):
            attempts.unreadable_for(f"{n}.1")
        clock.now += 1
    assert attempts.prunes == 0  # 15,000 calls within PRUNE_EVERY_S: not one walk of them all
    clock.now += PRUNE_EVERY_S
    for n in range(MANY):
        assert attempts.unreadable_for(f"{n}.1") == 3 + PRUNE_EVERY_S  # its clock kept
    assert attempts.prunes == 1  # once for the whole poll, not once per attempt


def test_an_attempt_no_longer_seen_unreadable_is_forgotten_and_one_still_seen_is_not() -> None:
    clock = Clock()
    attempts = UnreadableAttempts(600, clock=clock)
    for n in range(MANY):
        attempts.unreadable_for(f"{n}.1")
    for _ in range(int(FORGET_AFTER_S // PRUNE_EVERY_S) + 1):  # only 0.1 is still polled
        clock.now += PRUNE_EVERY_S
        attempts.unreadable_for("0.1")
    assert len(attempts._since) == 1
    assert attempts.unreadable_for("0.1") > FORGET_AFTER_S  # its clock was never restarted
    assert attempts.unreadable_for("1.1") == 0  # forgotten: starts again


def test_an_attempts_log_is_not_repeated_within_log_every_s_however_many_are_tracked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    attempts = UnreadableAttempts(600, clock=clock)
    caplog.set_level(logging.ERROR, logger=unreadable.__name__)
    for n in range(MANY):
        attempts.unreadable_for(f"{n}.1")
        raised_and_logged(attempts, f"{n}.1")
    assert len(caplog.records) == MANY  # each once
    caplog.clear()
    for _ in range(int(LOG_EVERY_S // PRUNE_EVERY_S) - 1):  # polls until just before LOG_EVERY_S
        clock.now += PRUNE_EVERY_S
        for n in range(0, MANY, 50):
            raised_and_logged(attempts, f"{n}.1")
    assert attempts.prunes >= 100  # pruned all along, and still
    assert caplog.records == []  # not one repeated
    clock.now += PRUNE_EVERY_S  # LOG_EVERY_S since they were logged
    raised_and_logged(attempts, "0.1")
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["Slurm attempt 0.1"]
    assert list(attempts._logged) == ["0.1"]  # the old logs were dropped (none held one back)


def test_an_end_not_recorded_is_logged_on_its_own_pace(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    attempts = UnreadableAttempts(600, clock=clock)
    caplog.set_level(logging.ERROR, logger=unreadable.__name__)
    raised_and_logged(attempts, "7.1")  # its read error, logged a moment before
    try:
        raise OSError(28, "No space left on device")
    except OSError:
        attempts.log_end_error("7.1")
        attempts.log_end_error("7.1")
    assert [r.getMessage() for r in caplog.records][1:] == [
        "Slurm attempt 7.1: its end (status_unreadable) could not be recorded; tried again at the "
        "next poll, logged again in 600 s if it persists"
    ]


def test_a_job_killed_for_its_unreadable_status_whose_end_is_read_later_is_not_its_own_exit() -> None:
    """engine.SlurmEngine._fail_unreadable marks the stop before its kill: should the end not be
    recorded then and be read at a later poll, the kill's 137 is Corral's, not the job's."""
    job: SlurmJob = {"job_id": 7, "job_state": "CANCELLED", "exit_code": 9, "end_time": 2000}
    stop = StopRequest(1990.0, 0.0, kind="status_unreadable", killed=True)
    status = terminal_status("9.1", job, {0: 137}, stop_kind(stop, job))
    assert (status.phase, status.reason, status.message) == (
        AttemptPhase.FAILED,
        FailureReason.STATUS_UNREADABLE,
        UNREADABLE_KILLED,
    )
    assert terminal_status("9.1", job, {0: 137}, None).reason is FailureReason.SIGNAL  # unmarked


def _engine_with_an_unreadable_running_attempt(
    tmp_path: Path, stop: StopRequest | None, job: dict[str, Any] | None = None
) -> tuple[Any, Clock, list]:
    """A SlurmEngine (no Slurm: its CLI answers here) with one attempt whose status cannot be read
    while squeue says its job runs; the scancels it sends are listed."""
    engine = SlurmEngine(tmp_path, unreadable_grace_s=1.0)
    clock = Clock()
    engine._unreadable = UnreadableAttempts(1.0, clock=clock)
    engine.store.save(AttemptRecord(AID, slurm_job_id="41", submitted_at=time.time(), n_ranks=1, stop=stop))
    scancels: list[tuple[str, ...]] = []

    def run(tool: str, *args: str, env: Any = None) -> CliResult:
        if tool == "scancel":
            scancels.append(args)
        return CliResult(0, "", "")

    def status(record: Any, jobs: Any) -> Any:
        raise OSError(28, "No space left on device", "attempt.json")

    engine.cli.run = run  # type: ignore[method-assign]
    squeue = job or {"job_id": "41", "job_state": "RUNNING", "name": job_name(AID)}
    engine._live_jobs = lambda live: {"41": squeue}  # type: ignore[method-assign]
    engine._status = status  # type: ignore[method-assign]
    return engine, clock, scancels


AID = "7.1"


def test_a_kill_whose_marker_the_state_dir_refuses_still_cancels_the_slurm_job(tmp_path: Path) -> None:
    """review121 #1: the kill marker was written first, and its OSError kept both scancels back:
    the job kept its GPUs for as long as the state dir refused writes."""
    engine, clock, scancels = _engine_with_an_unreadable_running_attempt(tmp_path, None)

    def refuse(attempt_id: str, marker: str) -> None:
        raise OSError(28, "No space left on device", marker)

    engine._mark = refuse  # type: ignore[method-assign]
    answers = []
    for _ in range(3):  # at 0, 1.5 and 3 s: past twice the grace (the job runs) at the last
        answers.append(engine.poll([AID]).get(AID))
        clock.now += 1.5
    assert answers[:2] == [None, None] and scancels == [("--signal=KILL", "--full", "41"), ("41",)], scancels
    ended = answers[2]
    assert ended is not None and (ended.phase, ended.reason) == (
        AttemptPhase.FAILED,
        FailureReason.STATUS_UNREADABLE,
    )


def test_an_attempt_stopped_for_its_max_runtime_whose_status_cannot_be_read_ends_as_a_timeout(
    tmp_path: Path,
) -> None:
    """review121 #5: it ended as status_unreadable, and the job was retried on the platform's
    budget instead of ending as a timeout, which is never retried."""
    stop = StopRequest(time.time(), 30.0, kind="timeout")
    engine, clock, scancels = _engine_with_an_unreadable_running_attempt(tmp_path, stop)
    assert engine.poll([AID]).get(AID) is None
    clock.now += 2.5  # past twice the grace
    ended = engine.poll([AID])[AID]
    assert (ended.phase, ended.reason) == (AttemptPhase.FAILED, FailureReason.TIMEOUT), ended
    assert scancels == [("--signal=KILL", "--full", "41"), ("41",)], scancels  # it ran: cancelled
    assert ended.message.startswith("exceeded max_runtime; Corral could not read how its instances ended")


def test_a_max_runtime_stop_asked_after_the_job_had_ended_does_not_make_it_a_timeout(tmp_path: Path) -> None:
    """review122 #2: the stop's kind alone was read; as terminal_status does (mapping.stop_kind),
    a stop asked for after the job's own end (Slurm's end_time) is not what ended it."""
    asked = time.time()
    stop = StopRequest(asked, 30.0, kind="timeout")
    ended_before = {
        "job_id": "41",
        "job_state": "COMPLETED",
        "name": job_name(AID),
        "end_time": int(asked) - 5,
    }
    engine, clock, scancels = _engine_with_an_unreadable_running_attempt(tmp_path, stop, ended_before)
    assert engine.poll([AID]).get(AID) is None
    clock.now += 1.5  # past the grace (Slurm says it no longer runs)
    ended = engine.poll([AID])[AID]
    assert (ended.phase, ended.reason) == (AttemptPhase.FAILED, FailureReason.STATUS_UNREADABLE), ended
    assert scancels == []


@pytest.mark.parametrize("slurm_state", ["RUNNING", "TIMEOUT"])
def test_a_job_past_its_limit_whose_status_cannot_be_read_ends_as_a_timeout(
    tmp_path: Path, slurm_state: str
) -> None:
    """review123 #1: squeue's end time of a running job is the limit's projection (start + --time),
    before the stop Corral asks once max_runtime has passed, and a job Slurm's own limit ended says
    TIMEOUT: both read as "asked after the job's end" and became status_unreadable, retried."""
    asked = time.time()
    stop = StopRequest(asked, 30.0, kind="timeout")
    row = {"job_id": "41", "job_state": slurm_state, "name": job_name(AID), "end_time": int(asked) - 3}
    engine, clock, _ = _engine_with_an_unreadable_running_attempt(tmp_path, stop, row)
    assert engine.poll([AID]).get(AID) is None
    clock.now += 2.5  # past twice the grace
    ended = engine.poll([AID])[AID]
    assert (ended.phase, ended.reason) == (AttemptPhase.FAILED, FailureReason.TIMEOUT), ended


def test_a_kill_whose_marker_is_refused_is_not_recorded_as_killed_and_its_log_is_paced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """review122 #3: the stop was saved as killed without its marker (node.sh's backstop never
    came), and each poll logged a traceback. Now each kill sends the scancels, leaves `killed`
    unset for a later one to try again, and logs once per LOG_EVERY_S."""
    engine, clock, scancels = _engine_with_an_unreadable_running_attempt(
        tmp_path, StopRequest(time.time(), 0.0)
    )

    def refuse(attempt_id: str, marker: str) -> None:
        raise OSError(28, "No space left on device", marker)

    engine._mark = refuse  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger=unreadable.__name__):
        for _ in range(3):
            engine._kill(engine.store.load(AID))
            clock.now += 1.0
        said = [r for r in caplog.records if "kill marker could not be written" in r.getMessage()]
        assert len(said) == 1 and "No space left on device" in said[0].getMessage(), said
        clock.now += LOG_EVERY_S
        engine._kill(engine.store.load(AID))
        assert len([r for r in caplog.records if "kill marker could not be written" in r.getMessage()]) == 2
    assert len(scancels) == 8  # both scancels at every kill
    stop = engine.store.load(AID).stop
    assert stop is not None and not stop.killed


ASKED = 2_000_000_000.0  # when the stop was asked (unix s)


@pytest.mark.parametrize(
    ("state", "stop_kind", "end", "runs", "said"),
    [
        (None, "timeout", None, False, "exceeded max_runtime"),  # Slurm no longer knows the job
        (None, None, None, False, None),
        ("RUNNING", "timeout", ASKED - 3, True, "exceeded max_runtime"),  # end: the limit's projection
        ("TIMEOUT", None, ASKED, False, "Slurm time limit (TIMEOUT)"),  # no stop asked: Slurm's limit
        ("DEADLINE", None, ASKED, False, "Slurm time limit (DEADLINE)"),
        ("TIMEOUT", "stopped", ASKED + 5, False, None),  # stopped for a fault first: not the limit
        ("NODE_FAIL", "timeout", ASKED + 5, False, None),  # a lost node comes first
        ("COMPLETING", "timeout", ASKED - 3, True, None),  # its own end, before the stop: a real end
        ("STAGE_OUT", "timeout", ASKED - 3, True, None),  # (review125 #1)
        ("SUSPENDED", "timeout", ASKED - 3, True, "exceeded max_runtime"),  # a projection there
        ("COMPLETED", "timeout", ASKED - 3, False, None),
        ("COMPLETED", "timeout", ASKED + 5, False, "exceeded max_runtime"),
        ("CANCELLED", "timeout", ASKED + 5, False, "exceeded max_runtime"),
    ],
)
def test_an_unread_end_is_a_timeout_exactly_where_terminal_status_reads_one(
    state: str | None, stop_kind: str | None, end: float | None, runs: bool, said: str | None
) -> None:
    """review123 #1, review124 #1-#2: in terminal_status's order (a lost node, the stop Corral
    asked, Slurm's own state), with squeue's end time of a running job only a projection."""
    stop = None if stop_kind is None else StopRequest(ASKED, 30.0, kind=stop_kind)
    job = None if state is None else {"job_id": "41", "job_state": state, "end_time": int(end or 0)}
    assert unreadable.time_limit_end(stop, job, runs) == said


def test_a_refused_kill_marker_is_logged_even_when_a_scancel_finds_slurm_away(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """review124 #4: the marker's error was logged after the scancels, so never when one raised."""
    engine, _, _ = _engine_with_an_unreadable_running_attempt(tmp_path, StopRequest(time.time(), 0.0))

    def refuse(attempt_id: str, marker: str) -> None:
        raise OSError(28, "No space left on device", marker)

    def away(tool: str, *args: str, env: Any = None) -> CliResult:
        raise EngineUnavailable("slurmctld: connection refused")

    engine._mark = refuse  # type: ignore[method-assign]
    engine.cli.run = away  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger=unreadable.__name__), pytest.raises(EngineUnavailable):
        engine._kill(engine.store.load(AID))
    assert any("kill marker could not be written" in r.getMessage() for r in caplog.records), caplog.text


def _engine_that_cannot_read(state_dir: Path, squeue: dict[str, SlurmJob]) -> SlurmEngine:
    """A SlurmEngine (no Slurm: its CLI answers here) on `state_dir`, its own bookkeeping of
    unreadable attempts (kept under the state dir), whose every attempt's status cannot be read."""
    engine = SlurmEngine(state_dir, unreadable_grace_s=1.0)

    def status(record: Any, jobs: Any) -> Any:
        raise OSError(28, "No space left on device", "attempt.json")

    engine.cli.run = lambda tool, *args, env=None: CliResult(0, "", "")  # type: ignore[method-assign]
    engine._live_jobs = lambda live: squeue  # type: ignore[method-assign]
    engine._status = status  # type: ignore[method-assign]
    return engine


def test_the_first_unreadable_time_outlives_a_restart_of_the_engine(tmp_path: Path) -> None:
    """A server restarting more often than the grace started every attempt's count again, and so
    never ended one: the first time is kept in a file of the engine's state dir (not the attempt's
    record, whose writes may be what fails), and a restarted engine counts from it."""
    first = SlurmEngine(tmp_path, unreadable_grace_s=1.0)
    first.store.save(AttemptRecord(AID, slurm_job_id="41", submitted_at=time.time(), n_ranks=1))
    before = time.time()
    assert _engine_that_cannot_read(tmp_path, {}).poll([AID]) == {}  # Slurm knows it no more
    kept = tmp_path / unreadable.SINCE_DIR / AID
    assert before <= float(kept.read_text()) <= time.time()
    assert kept.stat().st_mode & 0o077 == 0
    # The grace and more, across the "restart": its first time set 5 s back (no sleep: review126 #6,
    # a sleep of just over the grace asserted against rounding was flaky on a slow box)
    kept.write_text(f"{float(kept.read_text()) - 5:.3f}\n")
    restarted = _engine_that_cannot_read(tmp_path, {})
    ended = restarted.poll([AID])[AID]
    assert (ended.phase, ended.reason) == (AttemptPhase.FAILED, FailureReason.STATUS_UNREADABLE), ended
    found = re.match(r"Corral could not read how its instances ended for (\d+) s", ended.message)
    assert found is not None and 5 <= int(found[1]) <= 5 + (time.time() - before) + 1, ended.message
    assert not kept.exists()  # ended: its file goes with it


def test_an_attempt_ended_or_gone_some_other_way_takes_its_unreadable_file_with_it(tmp_path: Path) -> None:
    """review126 #7: only the status_unreadable end removed the file; an attempt whose end was
    recorded otherwise (a stop, a later good read by another path), or that the engine no longer
    knows, kept it until forgotten, and a restart before then counted it as still unreadable."""
    engine = _engine_that_cannot_read(tmp_path, {})
    for aid in (AID, "8.1"):
        engine.store.save(AttemptRecord(aid, slurm_job_id="41", submitted_at=time.time(), n_ranks=1))
    assert engine.poll([AID, "8.1"]) == {}  # unreadable, within the grace: both kept
    since = tmp_path / unreadable.SINCE_DIR
    assert sorted(p.name for p in since.iterdir()) == [AID, "8.1"]
    ended = AttemptRecord(AID, slurm_job_id="41", submitted_at=time.time(), n_ranks=1)
    ended.final = {"phase": AttemptPhase.SUCCEEDED.value, "exit_code": 0}
    engine.store.save(ended)
    shutil.rmtree(engine.store.root / "attempts" / "8.1")  # gone from the engine
    out = engine.poll([AID, "8.1"])
    assert out[AID].phase is AttemptPhase.SUCCEEDED and out["8.1"].phase is AttemptPhase.LOST, out
    assert list(since.iterdir()) == []


class Restarts:
    """A server's unreadable-attempt bookkeeping started again and again on one state dir: each
    start a new monotonic origin, the wall clock going on."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock, self.wall = Clock(), Clock()
        self.wall.now = 1_700_000_000.0
        self.since = tmp_path / unreadable.SINCE_DIR

    def started(self) -> UnreadableAttempts:
        self.clock.now += 10_000.0
        return UnreadableAttempts(600, clock=self.clock, since_dir=self.since, wall=self.wall)


def test_a_kept_first_time_goes_with_a_read_and_with_forgetting(tmp_path: Path) -> None:
    server = Restarts(tmp_path)
    clock, wall, since, started = server.clock, server.wall, server.since, server.started

    attempts = started()
    assert attempts.unreadable_for("1.1") == 0 and attempts.unreadable_for("2.1") == 0
    wall.now += 400
    attempts = started()
    assert attempts.unreadable_for("1.1") == 400  # counted from the first time, not from the start
    attempts.read("1.1")  # read well: its count ends, its file too
    assert sorted(p.name for p in since.iterdir()) == ["2.1"]
    attempts = started()
    assert attempts.unreadable_for("1.1") == 0
    # 2.1 is no longer polled (it ended some other way): forgotten, with its file
    for _ in range(int(FORGET_AFTER_S // PRUNE_EVERY_S) + 2):
        clock.now += PRUNE_EVERY_S
        wall.now += PRUNE_EVERY_S
        attempts.read("3.1")
    assert sorted(p.name for p in since.iterdir()) == []  # 1.1's too: not seen unreadable since
    # a wall clock stepped back: counted from the start, never a negative age
    attempts.unreadable_for("4.1")
    wall.now -= 3600
    assert started().unreadable_for("4.1") == 0


def test_a_restart_forgets_what_a_running_server_would_have_and_counts_no_more(tmp_path: Path) -> None:
    """review126 #2: only the first time was kept, so one failed read, an hour's outage and one
    failed read after it counted the whole hour (a FAILED end at once, its job scancelled) where
    one process forgets an attempt not seen unreadable for FORGET_AFTER_S. The file's mtime is
    when it was last seen so (refreshed while it stays so); a restart forgets one last seen
    FORGET_AFTER_S ago or more, and counts one seen since from its first time."""
    server = Restarts(tmp_path)
    clock, wall, since, started = server.clock, server.wall, server.since, server.started

    def one_process_apart(gap_s: float) -> float:
        own_clock = Clock()
        attempts = UnreadableAttempts(600, clock=own_clock)
        attempts.unreadable_for("9.1")
        own_clock.now += gap_s
        return attempts.unreadable_for("9.1")

    attempts = started()
    assert attempts.unreadable_for("1.1") == 0
    wall.now += 3600  # the server down an hour
    attempts = started()
    assert attempts.unreadable_for("1.1") == 0 == one_process_apart(3600)  # forgotten, in both
    assert float((since / "1.1").read_text()) == wall.now  # its count begun again, on disk too
    # seen unreadable every PRUNE_EVERY_S for 900 s, then down 100 s: counted from the first time,
    # as one process counts a 100 s gap between two failed reads
    start = wall.now
    for _ in range(int(900 // PRUNE_EVERY_S)):
        clock.now += PRUNE_EVERY_S
        wall.now += PRUNE_EVERY_S
        attempts.unreadable_for("1.1")
    assert os.stat(since / "1.1").st_mtime == wall.now
    wall.now += 100
    assert started().unreadable_for("1.1") == wall.now - start == one_process_apart(100) + 900


def test_a_file_the_state_dir_would_not_remove_is_tried_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """review126 #2: a failed removal dropped the attempt from the kept ones, never tried again;
    its file was then read at the next start as an attempt still unreadable."""
    clock = Clock()
    since = tmp_path / unreadable.SINCE_DIR
    attempts = UnreadableAttempts(600, clock=clock, since_dir=since)
    attempts.unreadable_for("1.1")
    kept = since / "1.1"
    kept.unlink()
    (kept / "in-the-way").mkdir(parents=True)  # unlink() refuses a directory
    with caplog.at_level(logging.WARNING, logger=unreadable.__name__):
        attempts.read("1.1")
    assert "could not be removed" in caplog.text, caplog.text
    shutil.rmtree(kept)
    kept.write_text("1700000000.0\n")  # (removable now)
    clock.now += PRUNE_EVERY_S
    attempts.read("2.1")  # a poll: the prune tries the removal again
    assert not kept.exists()


def test_a_file_not_removed_is_tried_again_though_the_attempt_is_unreadable_again(tmp_path: Path) -> None:
    """review127 #6: the prune retried a failed removal only for an attempt not unreadable again;
    found so again while the state dir refuses its new file too, the old file (the old first time)
    survived and a restart counted the attempt from then."""
    clock = Clock()
    since = tmp_path / unreadable.SINCE_DIR
    attempts = UnreadableAttempts(600, clock=clock, since_dir=since)
    attempts.unreadable_for("1.1")
    kept = since / "1.1"
    kept.unlink()
    (kept / "in-the-way").mkdir(parents=True)  # unlink() refuses a directory, as os.replace onto it
    attempts.read("1.1")  # the removal fails
    clock.now += 1
    assert attempts.unreadable_for("1.1") == 0  # unreadable again: its new file refused too
    shutil.rmtree(kept)
    kept.write_text("1700000000.0\n")  # the old first time, removable now
    clock.now += PRUNE_EVERY_S
    attempts.read("2.1")  # a poll: the prune tries the removal again
    assert not kept.exists()
    restarted = UnreadableAttempts(600, clock=clock, since_dir=since)
    assert restarted.unreadable_for("1.1") == 0  # counted from now, not from the old first time


def test_a_state_dir_that_refuses_the_file_leaves_the_count_in_memory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    since = tmp_path / unreadable.SINCE_DIR
    since.mkdir()
    (since / ".tmp-cut-short").write_text("17")  # a write cut short: removed at start
    (since / "5.1").write_text("")  # no time in it: removed at start
    clock = Clock()
    attempts = UnreadableAttempts(600, clock=clock, since_dir=since)
    assert list(since.iterdir()) == []
    since.rmdir()
    since.write_text("not a directory")  # the state dir refuses the file (as a full disk would)
    with caplog.at_level(logging.WARNING, logger=unreadable.__name__):
        assert attempts.unreadable_for("6.1") == 0
    clock.now += 30
    assert attempts.unreadable_for("6.1") == 30  # counted all the same, in this process
    assert "when its status was first unreadable could not be kept in" in caplog.text, caplog.text
    attempts.read("6.1")  # nothing kept, nothing to remove
