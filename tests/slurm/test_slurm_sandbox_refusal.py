"""A sandbox bwrap refused to set up, on Slurm (real Slurm, bubblewrap on the nodes as the job's
account): the attempt ends launch_failed with bwrap's words, as on the local engine, and not as the
job's exit 1; a job whose own command exits 1 (saying `bwrap: ...` to fool the reading) stays its
own failure; bwrap's status fd never reaches the job, nor its file the sandbox; without
--json-status-fd the scripts are as before.
Without a cluster: tests/engine/test_slurm_sandbox_status.py."""

from __future__ import annotations

import json
import os
import pwd
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from corral.engine.base import AttemptPhase, FailureReason
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.scripts import BWRAP_NO_STATUS, BWRAP_STATUS_FILE
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, wait_for

pytestmark = pytest.mark.slurm


def test_a_mount_source_removed_after_submit_ends_launch_failed_with_bwraps_words(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    assert engine.sandbox.json_status, "the harness's bubblewrap has --json-status-fd (0.8)"
    data = slurm_cluster.new_state_dir() / "data"
    data.mkdir()
    launch = attempt("531.1", instance("node1", "echo the job ran"), rw_mounts=[data])
    data.rmdir()  # between the server's checks and bwrap's bind
    engine.launch(launch)
    status = wait_for(engine, "531.1", FINISHED, timeout_s=30)
    assert (status.phase, status.reason, status.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.LAUNCH_FAILED,
        None,
    ), status
    said = f"bwrap: Can't find source path {data}: No such file or directory"
    assert status.message == f"rank 0: the sandbox did not start the job: {said}", status.message
    assert b"the job ran" not in engine.logs("531.1").data
    # the status file: in the root's attempt dir, the job's account's, 0600
    path = engine.store.attempt_dir("531.1") / BWRAP_STATUS_FILE.format(rank=0)
    st = path.stat()
    alice = pwd.getpwnam(TEST_ACCOUNTS["alice"]).pw_uid
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (alice, 0o600)
    assert os.stat(path.parent).st_uid == 0 and b'"child-pid"' in path.read_bytes()
    # the same, seen again by a fresh poll after the record was written: it stays so
    assert engine.poll(["531.1"])["531.1"].reason is FailureReason.LAUNCH_FAILED


def test_a_job_that_exits_1_saying_bwrap_stays_its_own_failure(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    data = slurm_cluster.new_state_dir() / "data"
    data.mkdir()
    data.chmod(0o777)
    status_path = engine.store.attempt_dir("532.1") / BWRAP_STATUS_FILE.format(rank=0)
    # what the job sees of its fds and of the status file's path, then bwrap's kind of words
    command = (
        "ls -l /proc/$$/fd/ | grep -c status; "
        f"if [ -e {status_path} ]; then echo status file seen; fi; "
        'echo "bwrap: Can\'t find source path /x: No such file or directory" >&2; exit 1'
    )
    engine.launch(attempt("532.1", instance("node1", command), rw_mounts=[data]))
    status = wait_for(engine, "532.1", FINISHED, timeout_s=30)
    assert (status.phase, status.reason, status.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.EXIT_CODE,
        1,
    ), status
    log = engine.logs("532.1").data.decode()
    assert log.splitlines()[0] == "0", log  # no fd of the job names the status file
    assert "status file seen" not in log
    assert b'"exit-code": 1' in status_path.read_bytes()  # bwrap's word that the command ran


def test_without_json_status_a_refusal_stays_the_ranks_exit_1_as_before(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    engine.sandbox = replace(engine.sandbox, json_status=False)  # a bubblewrap without the option
    data = slurm_cluster.new_state_dir() / "data"
    data.mkdir()
    launch = attempt("533.1", instance("node1", "echo the job ran"), rw_mounts=[data])
    data.rmdir()
    engine.launch(launch)
    status = wait_for(engine, "533.1", FINISHED, timeout_s=30)
    assert (status.phase, status.reason, status.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.EXIT_CODE,
        1,
    )
    assert not (engine.store.attempt_dir("533.1") / BWRAP_STATUS_FILE.format(rank=0)).exists()
    assert "--json-status-fd" not in (engine.store.job_dir("533.1") / "rank-0.sh").read_text()


def probe_counting_bwrap(slurm_cluster: SlurmCluster, real: str, *, has_status_fd: bool) -> tuple[Path, Path]:
    """A bubblewrap wrapper that writes the node of each probe (a call with --version) to a log
    and, without `has_status_fd`, refuses the option as an old bwrap does; else the real one.
    (the wrapper, the log)."""
    wrapper, probes = slurm_cluster.new_state_dir() / "bwrap", slurm_cluster.scratch_dir() / "probes"
    refuse = (
        ""
        if has_status_fd
        else 'for a in "$@"; do if [ "$a" = --json-status-fd ]; then\n'
        '  echo "bwrap: Unknown option --json-status-fd" >&2; exit 1; fi; done\n'
    )
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" --version "*) echo "$SLURMD_NODENAME" >>{probes};; esac\n'
        f'{refuse}exec {real} "$@"\n'
    )
    wrapper.chmod(0o755)
    wrapper.parent.chmod(0o755)
    return wrapper, probes


def test_a_node_whose_bubblewrap_lacks_the_status_fd_runs_the_job_without_it(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """review110 #6: the server's bubblewrap has --json-status-fd and a node's does not (a wrapper
    that refuses the option as an old bwrap does): every rank there ended launch_failed with
    "Unknown option"; now its rank scripts run bwrap without it and the exit is the job's. Its
    node.sh asks the bubblewrap once (and, having failed, once more for its words) for both its
    ranks, not each rank twice (rough15 #3)."""
    old_bwrap, probes = probe_counting_bwrap(slurm_cluster, engine.sandbox.bwrap, has_status_fd=False)
    engine.sandbox = replace(engine.sandbox, bwrap=str(old_bwrap), json_status=True)
    ranks = (instance("node1", "echo rank 0 ran"), instance("node1", "echo the job ran; exit 1", rank=1))
    engine.launch(attempt("534.1", *ranks))
    status = wait_for(engine, "534.1", FINISHED, timeout_s=30)
    assert (status.phase, status.reason, status.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.EXIT_CODE,
        1,
    ), status
    assert b"the job ran" in engine.logs("534.1", 1).data and b"rank 0 ran" in engine.logs("534.1", 0).data
    for rank in (0, 1):
        path = engine.store.attempt_dir("534.1") / BWRAP_STATUS_FILE.format(rank=rank)
        assert path.read_bytes() == BWRAP_NO_STATUS
        said = engine.logs("534.1", rank).data
        assert b"has no --json-status-fd (bwrap: Unknown option --json-status-fd)" in said, said
    assert probes.read_text().split() == ["node1", "node1"]


def test_each_node_asks_its_bubblewrap_once_for_all_its_ranks(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """rough15 #3: each rank script ran its own `bwrap --json-status-fd 1 --version`; node.sh
    runs it once for the ranks it starts, and they run with the status fd as before."""
    counted, probes = probe_counting_bwrap(slurm_cluster, engine.sandbox.bwrap, has_status_fd=True)
    engine.sandbox = replace(engine.sandbox, bwrap=str(counted), json_status=True)
    ranks = [instance("node1", "echo ran"), instance("node1", "echo ran", rank=1)]
    engine.launch(attempt("536.1", *ranks, instance("node2", "echo ran", rank=2)))
    status = wait_for(engine, "536.1", FINISHED, timeout_s=30)
    assert status.phase is AttemptPhase.SUCCEEDED, status
    for rank in (0, 1, 2):
        path = engine.store.attempt_dir("536.1") / BWRAP_STATUS_FILE.format(rank=rank)
        assert b'"exit-code": 0' in path.read_bytes(), path.read_bytes()
    assert sorted(probes.read_text().split()) == ["node1", "node2"]


def test_a_refusal_after_another_rank_ran_and_was_killed_is_the_jobs_own_failure(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """review110 #1: rank 0 ran its command, ignores TERM and is KILLed with the gang (its bwrap
    writes no exit-code line when it is KILLed first, or 137, 128 + SIGKILL, when its child is:
    the step's processes die in no set order); rank 1's bwrap refused (a wrapper refuses its work dir's
    bind, as bwrap does a source gone). Not launch_failed, a free re-run of what rank 0 did:
    the job's own failure, with bwrap's words and the rank that may have run."""
    said = "bwrap: Can't find source path /gone: No such file or directory"
    work_0, work_1 = (str(engine.store.job_dir("535.1") / "work" / str(r)) for r in (0, 1))
    refusing = slurm_cluster.new_state_dir() / "bwrap"
    # rank 1 refuses only once rank 0's command has run (its marker in its work dir): refused
    # first, the gang's stop could end rank 0 before its own bwrap started, and then nothing ran
    refusing.write_text(
        "#!/bin/sh\n"
        f'for a in "$@"; do if [ "$a" = {work_1} ]; then i=0; '
        f"while [ ! -e {work_0}/rank0-ran ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
        f'echo "{said}" >&2; exit 1; fi; done\n'
        f'exec {engine.sandbox.bwrap} "$@"\n'
    )
    refusing.chmod(0o755)
    refusing.parent.chmod(0o755)
    engine.sandbox = replace(engine.sandbox, bwrap=str(refusing))
    ran = "trap '' TERM; echo rank 0 ran; touch rank0-ran; while :; do sleep 1; done"
    engine.launch(attempt("535.1", instance("node1", ran), instance("node2", "echo rank 1 ran", rank=1)))
    status = wait_for(engine, "535.1", FINISHED, timeout_s=60)
    assert (status.phase, status.reason, status.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.EXIT_CODE,
        1,
    ), status
    assert status.message == (
        f"rank 1: the sandbox did not start the job: {said}; "
        "rank 0 may have run the job's command, so this is the job's own failure"
    ), status.message
    assert b"rank 0 ran" in engine.logs("535.1", 0).data and b"rank 1 ran" not in engine.logs("535.1", 1).data
    status_0 = engine.store.attempt_dir("535.1") / BWRAP_STATUS_FILE.format(rank=0)
    lines = [json.loads(line) for line in status_0.read_text().splitlines() if line.strip()]
    assert any("child-pid" in line for line in lines), lines  # its command was started
    # and did not end by itself: KILLed (bwrap first: no exit-code; its child first: 137)
    assert [line["exit-code"] for line in lines if "exit-code" in line] in ([], [137]), lines
