"""The Slurm engine's reading of bwrap's --json-status-fd files (state.StateStore.sandbox_refusal),
without a cluster: an attempt is launch_failed only when no rank's command may have run (a rank
killed by a signal after its bwrap started may have: review110 #1), a rank killed by a signal or
stopped before its bwrap is never a refusal, and no status file keeps the exit the job's.
The files are laid out as the rank scripts leave them; on real Slurm:
tests/slurm/test_slurm_sandbox_refusal.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from corral.engine.base import AttemptPhase, FailureReason
from corral.engine.slurm.cli import SlurmJob
from corral.engine.slurm.mapping import SandboxRefusal, terminal_status
from corral.engine.slurm.scripts import (
    BWRAP_NO_STATUS,
    BWRAP_NOT_STARTED,
    BWRAP_STATUS_FILE,
    NO_STATUS_FD_VAR,
    node_status_fd_probe,
    status_fd_launch,
)
from corral.engine.slurm.state import StateStore

UID = os.getuid()
STARTED = b'{ "child-pid": 41, "mnt-namespace": 1, "pid-namespace": 2 }\n'
RAN = STARTED + b'{ "exit-code": 1 }\n'
WORDS = "bwrap: Can't find source path /data/x: No such file or directory"


def store_with(tmp_path: Path, statuses: dict[int, bytes], logs: dict[int, str] | None = None) -> StateStore:
    store = StateStore(tmp_path / "state")
    store.job_dir("9.1").mkdir(parents=True)
    for rank, text in statuses.items():
        (store.attempt_dir("9.1") / BWRAP_STATUS_FILE.format(rank=rank)).write_bytes(text)
    for rank, text in (logs or {}).items():
        store.log_path("9.1", rank).write_text(text)
    return store


def test_a_rank_whose_bwrap_never_execd_its_command_is_the_refusal_with_bwraps_last_words(
    tmp_path: Path,
) -> None:
    store = store_with(tmp_path, {0: STARTED}, {0: "corral: a dir line\nbwrap: earlier\n" + WORDS + "\n"})
    assert store.sandbox_refusal("9.1", 1, {0: 1}, UID) == SandboxRefusal(0, 1, WORDS, ())


def test_without_bwraps_words_the_refusal_says_its_exit_code(tmp_path: Path) -> None:
    store = store_with(tmp_path, {0: b""})  # bwrap died before it cloned: nothing written yet
    assert store.sandbox_refusal("9.1", 1, {0: 1}, UID) == SandboxRefusal(
        0, 1, "bwrap exited with code 1 before starting the job's command", ()
    )


def test_a_refusal_after_another_ranks_command_ran_names_that_rank(tmp_path: Path) -> None:
    # rank 1 refused first, rank 0's command ran (and was failed with the gang): the job's exit
    store = store_with(tmp_path, {0: RAN, 1: STARTED}, {1: WORDS})
    assert store.sandbox_refusal("9.1", 2, {1: 1, 0: 143}, UID) == SandboxRefusal(1, 1, WORDS, (0,))
    # a rank that left no exit code (killed) but whose bwrap said its command ran counts too
    store = store_with(tmp_path / "b", {0: STARTED, 1: RAN}, {0: WORDS})
    assert store.sandbox_refusal("9.1", 2, {0: 1}, UID) == SandboxRefusal(0, 1, WORDS, (1,))


def test_a_rank_killed_after_its_bwrap_started_may_have_run(tmp_path: Path) -> None:
    # review110 #1: rank 0 ignored TERM and was KILLed at the gang's grace; a killed bwrap writes
    # no exit-code line even after its command ran, with an exit of 137 or none at all
    store = store_with(tmp_path, {0: STARTED, 1: STARTED}, {1: WORDS})
    assert store.sandbox_refusal("9.1", 2, {1: 1, 0: 137}, UID) == SandboxRefusal(1, 1, WORDS, (0,))
    assert store.sandbox_refusal("9.1", 2, {1: 1}, UID) == SandboxRefusal(1, 1, WORDS, (0,))
    # even before its child-pid line: it cannot tell how far its bwrap got
    store = store_with(tmp_path / "b", {0: b"", 1: STARTED}, {1: WORDS})
    assert store.sandbox_refusal("9.1", 2, {1: 1}, UID) == SandboxRefusal(1, 1, WORDS, (0,))
    # stopped before its bwrap started, or refused by itself: nothing of the job ran
    store = store_with(tmp_path / "c", {0: BWRAP_NOT_STARTED, 1: STARTED, 2: STARTED}, {1: WORDS})
    assert store.sandbox_refusal("9.1", 3, {1: 1, 2: 1}, UID) == SandboxRefusal(1, 1, WORDS, ())
    job: SlurmJob = {"job_id": 7, "job_state": "FAILED", "exit_code": 256}
    status = terminal_status("9.1", job, {1: 1}, None, SandboxRefusal(1, 1, WORDS, (0,)))
    assert (status.phase, status.reason, status.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.EXIT_CODE,
        1,
    )
    assert status.message == (
        f"rank 1: the sandbox did not start the job: {WORDS}; "
        "rank 0 may have run the job's command, so this is the job's own failure"
    )
    two = terminal_status("9.1", job, {1: 1}, None, SandboxRefusal(1, 1, WORDS, (0, 2)))
    assert two.message.endswith(
        "; ranks 0, 2 may have run the job's command, so this is the job's own failure"
    )


def test_signals_stops_before_bwrap_and_missing_files_are_never_refusals(tmp_path: Path) -> None:
    store = store_with(tmp_path, {0: STARTED, 1: BWRAP_NOT_STARTED}, {0: WORDS, 1: WORDS})
    assert store.sandbox_refusal("9.1", 2, {0: 137}, UID) is None  # bwrap killed (OOM, final kill)
    assert store.sandbox_refusal("9.1", 2, {1: 90}, UID) is None  # the rank script's own refusal
    assert store.sandbox_refusal("9.1", 3, {2: 1}, UID) is None  # no status file: an old bubblewrap
    # the first refusal in the order the ranks ended is named
    store = store_with(tmp_path / "b", {0: STARTED, 1: STARTED}, {0: WORDS, 1: "bwrap: other\n"})
    assert store.sandbox_refusal("9.1", 2, {1: 1, 0: 1}, UID) == SandboxRefusal(1, 1, "bwrap: other", ())
    # a refusal after the first failure (a signal) is not its cause
    assert store.sandbox_refusal("9.1", 2, {0: 137, 1: 1}, UID) is None


def test_a_rank_whose_nodes_bwrap_has_no_status_fd_is_never_a_refusal_and_may_have_run(
    tmp_path: Path,
) -> None:
    # review110 #6: its rank script ran bwrap without --json-status-fd and said so in the file
    store = store_with(tmp_path, {0: BWRAP_NO_STATUS, 1: STARTED}, {0: WORDS, 1: WORDS})
    assert store.sandbox_refusal("9.1", 2, {0: 1}, UID) is None  # its exit 1 stays its own
    assert store.sandbox_refusal("9.1", 2, {1: 1, 0: 1}, UID) == SandboxRefusal(1, 1, WORDS, (0,))


def test_files_that_are_not_the_jobs_own_plain_files_are_not_read(tmp_path: Path) -> None:
    store = store_with(tmp_path, {0: STARTED}, {0: WORDS})
    assert store.sandbox_refusal("9.1", 1, {0: 1}, UID + 1) is None  # owned by another uid
    status = store.attempt_dir("9.1") / BWRAP_STATUS_FILE.format(rank=0)
    status.unlink()
    os.mkfifo(status)  # never blocks the poll
    assert store.sandbox_refusal("9.1", 1, {0: 1}, UID) is None


def test_the_refusal_is_launch_failed_unless_corral_stopped_it_or_slurm_saw_oom() -> None:
    job: SlurmJob = {"job_id": 7, "job_state": "FAILED", "exit_code": 256}
    status = terminal_status("9.1", job, {0: 1}, None, SandboxRefusal(0, 1, WORDS))
    assert (status.phase, status.reason, status.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.LAUNCH_FAILED,
        None,
    )
    assert status.message == f"rank 0: the sandbox did not start the job: {WORDS}"
    refused = SandboxRefusal(0, 1, WORDS)
    assert terminal_status("9.1", job, {0: 1}, "stopped", refused).reason is FailureReason.STOPPED
    oom: SlurmJob = {**job, "job_state": "OUT_OF_MEMORY"}
    assert terminal_status("9.1", oom, {0: 1}, None, refused).reason is FailureReason.OOM
    assert terminal_status("9.1", job, {0: 1}, None).reason is FailureReason.EXIT_CODE  # no refusal


def test_a_rank_killed_before_its_bwrap_started_is_not_the_cause_even_when_it_sorts_first(
    tmp_path: Path,
) -> None:
    """review111 #1: exit files written in one tick of the file system's clock sort by rank, so
    rank 0, killed by the gang's stop before its bwrap started (143), came before rank 1, whose
    bwrap refused: the attempt then read as the job's own failure though no command ran."""
    store = store_with(tmp_path, {0: BWRAP_NOT_STARTED, 1: STARTED}, {1: WORDS})
    assert store.sandbox_refusal("9.1", 2, {0: 143, 1: 1}, UID) == SandboxRefusal(1, 1, WORDS, ())
    # a rank that failed by itself before its bwrap (the rank script's own refusal) stays the cause
    store = store_with(tmp_path / "b", {0: BWRAP_NOT_STARTED, 1: STARTED}, {1: WORDS})
    assert store.sandbox_refusal("9.1", 2, {0: 90, 1: 1}, UID) is None


def run_launch_line(tmp_path: Path, bwrap_body: str) -> tuple[bytes, list[str], str]:
    """Runs node.sh's probe (scripts.node_status_fd_probe) and then a rank script's launch line
    (scripts.status_fd_launch) with a fake bwrap that logs each call's arguments and then does
    `bwrap_body`: (the status file, the calls, stderr)."""
    tmp_path.mkdir()
    bwrap, calls, status = tmp_path / "bwrap", tmp_path / "calls", tmp_path / "bwrap-0.status"
    bwrap.write_text(f'#!/bin/sh\necho "$*" >>{calls}\n{bwrap_body}\n')
    bwrap.chmod(0o755)
    status.write_bytes(BWRAP_NOT_STARTED)
    with_fd = f"{bwrap} --json-status-fd 3 -- job"
    probe = f'{NO_STATUS_FD_VAR}=""\n{node_status_fd_probe(str(bwrap))}'
    line = probe + status_fd_launch(str(status), with_fd, f"{bwrap} -- job")
    done = subprocess.run(["sh", "-c", line], capture_output=True, text=True, timeout=10, check=False)
    return status.read_bytes(), calls.read_text().splitlines(), done.stderr


def test_the_rank_runs_without_the_status_fd_only_when_its_bwrap_says_the_option_is_unknown(
    tmp_path: Path,
) -> None:
    # review111 #2: a bwrap with the option pays one probe and writes its lines to the fd
    has_it = 'case "$*" in *--version*) exit 0;; *job*) echo \'{ "exit-code": 0 }\' >&3;; esac'
    status, calls, _ = run_launch_line(tmp_path / "a", has_it)
    assert status == b'{ "exit-code": 0 }\n'
    assert calls == ["--json-status-fd 1 --version", "--json-status-fd 3 -- job"]
    # bubblewrap's own words for an option it lacks (0.8.0: "bwrap: Unknown option --no-such")
    old = (
        'case "$*" in *--json-status-fd*) echo "bwrap: Unknown option --json-status-fd" >&2; exit 1;; esac\n'
        "echo ran without"
    )
    status, calls, stderr = run_launch_line(tmp_path / "b", old)
    assert status == BWRAP_NO_STATUS
    assert calls[-1] == "-- job"
    assert "has no --json-status-fd (bwrap: Unknown option --json-status-fd)" in stderr
    # any other failure of the probe (no fork under the job's pids limit): the fd as usual, so
    # a refusal on that node still reads as one
    flaky = (
        'case "$*" in *--version*) echo "bwrap: Resource temporarily unavailable" >&2; exit 1;; '
        "*job*) echo '{ \"child-pid\": 41 }' >&3; exit 1;; esac"
    )
    status, calls, stderr = run_launch_line(tmp_path / "c", flaky)
    assert status == b'{ "child-pid": 41 }\n'
    assert calls[-1] == "--json-status-fd 3 -- job"
    assert "has no --json-status-fd" not in stderr


def test_exit_files_of_ranks_the_job_does_not_have_or_past_a_shells_exit_status_are_skipped(
    tmp_path: Path,
) -> None:
    """The job's account writes its job dir: a rank read from a name such as rank--5.exit crashed
    sandbox_refusal (and so every reconcile tick), rank-3000000.exit made it read three million
    status files, and an exit code past 255 reached the database, which refused it (review115 #1, #2)."""
    store = store_with(tmp_path, {0: STARTED})
    job = store.job_dir("9.1")
    (job / "rank-0.exit").write_text("1\n")
    (job / "rank--5.exit").write_text("1\n")
    (job / "rank-3000000.exit").write_text("1\n")
    (job / "rank-+1.exit").write_text("1\n")
    assert store.rank_exits("9.1", 2, UID) == {0: 1}
    assert store.sandbox_refusal("9.1", 2, store.rank_exits("9.1", 2, UID), UID) is not None
    for text in ("9" * 40, "256", "-1", "1e3", " 1 2"):
        (job / "rank-1.exit").write_text(text + "\n")
        assert store.rank_exits("9.1", 2, UID) == {0: 1}, text
    (job / "rank-1.exit").write_text("255\n")
    assert store.rank_exits("9.1", 2, UID) == {0: 1, 1: 255}
    failed_at = store.first_failure_time("9.1", 2, UID)
    first = min(os.stat(job / f"rank-{rank}.exit").st_mtime for rank in (0, 1))
    assert failed_at is not None and failed_at == first
