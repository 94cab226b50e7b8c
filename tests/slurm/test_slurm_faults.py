"""Faults against a real Slurm: a node crash in the middle of a gang, slurmctld going away."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from corral.engine.base import AttemptPhase, EngineUnavailable, FailureReason
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.cli import CliResult, SlurmCli
from corral.engine.slurm.scripts import KILL_CHECK_S
from corral.scheduler.types import NodeState
from tests.slurm.harness import SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, slurm_engine, wait_for

pytestmark = pytest.mark.slurm


def processes_with(token: str) -> list[int]:
    """PIDs (any namespace) whose command line contains `token`."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if token.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            continue
    return found


def start_ticking(engine: SlurmEngine, cluster: SlurmCluster, attempt_id: str, node: str) -> Path:
    """Launch an attempt on `node` that appends a timestamp to <scratch>/ticks every 0.2 s, and
    wait until it has; the ticks file, to see when the attempt's ranks stopped running."""
    runs = cluster.scratch_dir()
    engine.launch(
        attempt(
            attempt_id,
            instance(node, f"while true; do date +%s.%N >> {runs}/ticks; sleep 0.2; done"),
            rw_mounts=[runs],
        )
    )
    wait_for(engine, attempt_id, {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 10
    while not (runs / "ticks").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return runs / "ticks"


def last_tick(ticks: Path) -> float:
    return max(float(t) for t in ticks.read_text().split())


def slurm_job_state(cluster: SlurmCluster, job_id: str) -> str:
    return subprocess.run(
        ["squeue", "-h", "--states=all", "-j", job_id, "-o", "%T"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=15,
    ).stdout.strip()


def test_node_crash_is_lost_once_and_never_runs_twice(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    runs = slurm_cluster.scratch_dir()  # mounted into the jobs' sandboxes
    token = "60.2011"  # a unique sleep argument, to find the job's processes in /proc
    # "end" only when the sleep ran out (`&&`): Slurm ends the surviving node's step by signalling
    # its processes one after another, so the sleep can die a moment before the shell around it,
    # which with `;` then ran its next command (the job's own shell code ending, not a second run;
    # the failure this test had now and then, docs/slurm.md)
    out = f"{runs}/rank-$RANK"
    command = f'echo "$SLURMD_NODENAME" >> {out} && sleep {token} && echo end >> {out}'
    ref = engine.launch(
        attempt(
            "201.1",
            instance("node2", command, rank=0, env={"RANK": "0"}),
            instance("node3", command, rank=1, env={"RANK": "1"}),
            rw_mounts=[runs],
        )
    )
    wait_for(engine, "201.1", {AttemptPhase.RUNNING})
    deadline = time.monotonic() + 10
    while len(list(runs.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in runs.iterdir()) == ["rank-0", "rank-1"]
    assert len(processes_with(token)) >= 2

    t0 = time.monotonic()
    slurm_cluster.crash_node("node3")  # slurmd, slurmstepd and the rank-1 processes die at once
    lost = wait_for(engine, "201.1", FINISHED, timeout_s=45, every_s=0.25)
    detected_s = time.monotonic() - t0
    assert (lost.phase, lost.reason) == (AttemptPhase.LOST, FailureReason.NODE_LOST), lost
    assert lost.engine_ref == ref and "NODE_FAIL" in lost.message
    assert detected_s < 40
    node3 = {n.name: n for n in engine.nodes()}["node3"]
    assert node3.state in (NodeState.DOWN, NodeState.UNKNOWN)
    # the surviving node's instance is killed with the gang, not left running
    deadline = time.monotonic() + 15
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with(token) == []

    # the node comes back: nothing is requeued or started again, the verdict does not change
    slurm_cluster.start_node("node3")
    time.sleep(3)
    assert slurm_job_state(slurm_cluster, ref) == "NODE_FAIL"
    assert engine.poll(["201.1"])["201.1"] == lost
    assert (runs / "rank-0").read_text() == "node2\n" and (runs / "rank-1").read_text() == "node3\n"

    # Corral retries as a new attempt on other nodes; it runs once and succeeds
    retry = command.replace(f"sleep {token}", "true")
    engine.launch(
        attempt(
            "201.2",
            instance("node1", retry, rank=0, env={"RANK": "0"}),
            instance("node2", retry, rank=1, env={"RANK": "1"}),
            rw_mounts=[runs],
        )
    )
    assert wait_for(engine, "201.2", FINISHED).phase is AttemptPhase.SUCCEEDED
    assert (runs / "rank-0").read_text() == "node2\nnode1\nend\n"
    assert (runs / "rank-1").read_text() == "node3\nnode2\nend\n"


def test_a_node_slurm_cannot_reach_kills_the_attempt_declared_lost_there(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """A hung slurmd (SIGSTOP; alike: a node cut off from slurmctld) is no crash: Slurm ends the
    job as NODE_FAIL, the attempt is LOST and Corral retries it elsewhere, while slurmstepd and the
    ranks run on where Slurm cannot kill them (until slurmd answers again). The engine marks the
    attempt given up, and node.sh's watch kills the ranks itself."""
    ticks = start_ticking(engine, slurm_cluster, "202.1", "node3")
    slurmd = slurm_cluster.slurmd_pid("node3")
    assert slurmd is not None
    os.kill(slurmd, signal.SIGSTOP)
    try:
        lost = wait_for(engine, "202.1", FINISHED, timeout_s=45, every_s=0.25)
        lost_at = time.time()
        assert (lost.phase, lost.reason) == (AttemptPhase.LOST, FailureReason.NODE_LOST), lost
        assert "NODE_FAIL" in lost.message
        time.sleep(KILL_CHECK_S + 4)
        last = last_tick(ticks)
        assert last < lost_at + KILL_CHECK_S + 2, f"the LOST attempt ran on {last - lost_at:.1f}s after it"
    finally:
        os.kill(slurmd, signal.SIGCONT)


def test_a_submission_that_turns_up_after_its_stop_runs_nothing(
    engine: SlurmEngine, slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch's answer timed out ("Socket timed out": EngineUnavailable, the job stays scheduled),
    the job is cancelled and stop() finds no job of the attempt in Slurm, and only then does the
    request reach slurmctld (a busy one): that job must start nothing."""
    runs = slurm_cluster.scratch_dir()
    held: list[tuple[tuple[str, ...], dict[str, object]]] = []
    real = SlurmCli.run

    def late_sbatch(self: SlurmCli, tool: str, *args: str, **kwargs: object) -> CliResult:
        if tool == "sbatch" and not held:
            held.append((args, kwargs))
            raise EngineUnavailable("Slurm is unreachable: Socket timed out on send/recv operation")
        return real(self, tool, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SlurmCli, "run", late_sbatch)
    with pytest.raises(EngineUnavailable):
        engine.launch(attempt("203.1", instance("node1", f"echo ran > {runs}/ran"), rw_mounts=[runs]))
    engine.stop("203.1", 0.0)  # e.g. cancelled while scheduled: no such job in Slurm (yet)
    args, kwargs = held[0]
    late = real(engine.cli, "sbatch", *args, **kwargs)  # type: ignore[arg-type]
    assert late.returncode == 0, late.message
    job_id = late.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 30
    while slurm_job_state(slurm_cluster, job_id) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline, f"job {job_id} still {slurm_job_state(slurm_cluster, job_id)}"
        time.sleep(0.1)
    assert not (runs / "ran").exists()


def test_a_submission_that_turns_up_after_its_relaunch_runs_nothing(
    engine: SlurmEngine, slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sbatch's answer timed out and the attempt is launched again (the dispatch's retry, or a
    restarted server): Slurm knows no job of it yet, so the relaunch submits again. The first
    request then reaches slurmctld (a busy one) after all: two Slurm jobs of one attempt, and the
    late one must run nothing (before submission tokens both ran the ranks: two writers), while
    the engine keeps following the current one."""
    runs = slurm_cluster.scratch_dir()
    held: list[tuple[tuple[str, ...], dict[str, object]]] = []
    real = SlurmCli.run

    def late_sbatch(self: SlurmCli, tool: str, *args: str, **kwargs: object) -> CliResult:
        if tool == "sbatch" and not held:
            held.append((args, kwargs))
            raise EngineUnavailable("Slurm is unreachable: Socket timed out on send/recv operation")
        return real(self, tool, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SlurmCli, "run", late_sbatch)
    launch = attempt(
        "204.1", instance("node1", f"echo $SLURM_JOB_ID >> {runs}/ran; sleep 2"), rw_mounts=[runs]
    )
    with pytest.raises(EngineUnavailable):
        engine.launch(launch)
    current = engine.launch(launch)  # the relaunch: nothing of the attempt in Slurm yet
    args, kwargs = held[0]
    late = real(engine.cli, "sbatch", *args, **kwargs)  # type: ignore[arg-type]
    assert late.returncode == 0, late.message
    late_id = late.stdout.strip().split(";")[0]
    assert int(late_id) > int(current)  # the newest job of the attempt's name is the stale one
    deadline = time.monotonic() + 30
    while slurm_job_state(slurm_cluster, late_id) in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
        assert time.monotonic() < deadline, f"job {late_id} still {slurm_job_state(slurm_cluster, late_id)}"
        time.sleep(0.1)
    status = wait_for(engine, "204.1", FINISHED)
    assert (status.phase, status.engine_ref) == (AttemptPhase.SUCCEEDED, current), status
    assert (runs / "ran").read_text() == f"{current}\n"  # only the current submission ran
    # found by name (as after a lost answer), the attempt's job is the current one, not the newest
    assert engine._find_job_by_name("204.1", "") == current


def test_a_superseded_submission_that_started_first_is_stopped(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """The stale submission may start before the later one exists (sbatch's answer lost, the job
    found by no lookup yet): once the attempt's current submission is another, node.sh's watch
    kills the stale one's ranks, as for the kill marker."""
    ticks = start_ticking(engine, slurm_cluster, "205.1", "node2")
    engine.store.new_submission("205.1")  # what a relaunch writes before its sbatch
    superseded_at = time.time()
    time.sleep(KILL_CHECK_S + 3)
    last = last_tick(ticks)
    assert last < superseded_at + KILL_CHECK_S + 1.5, (
        f"ran on {last - superseded_at:.1f}s after it was superseded"
    )


def test_slurm_unreachable_then_back(engine: SlurmEngine, slurm_cluster: SlurmCluster) -> None:
    engine.launch(attempt("301.1", instance("node1", "sleep 3; echo survived")))
    wait_for(engine, "301.1", {AttemptPhase.RUNNING})
    assert {n.state for n in engine.nodes()} == {NodeState.READY}

    slurm_cluster.stop_controller()
    try:
        nodes = engine.nodes()  # nodes do not vanish: same names, state unknown, a clear message
        assert sorted(n.name for n in nodes) == ["node1", "node2", "node3"]
        assert {n.state for n in nodes} == {NodeState.UNKNOWN}
        assert all("unreachable" in n.message.lower() for n in nodes)
        assert all(len(n.gpus) == 4 for n in nodes)
        with pytest.raises(EngineUnavailable):
            engine.poll(["301.1"])
        with pytest.raises(EngineUnavailable, match=r"(?i)unable to contact slurm controller"):
            engine.launch(attempt("302.1", instance("node2", "echo later")))
        with pytest.raises(EngineUnavailable):  # no node ever seen: nothing to report but the fault
            slurm_engine(slurm_cluster).nodes()
    finally:
        slurm_cluster.start_controller(fresh=False)  # keeps its state: jobs and nodes

    deadline = time.monotonic() + 30
    while {n.state for n in engine.nodes()} != {NodeState.READY} and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {n.state for n in engine.nodes()} == {NodeState.READY}
    status = wait_for(engine, "301.1", FINISHED)
    assert status.phase is AttemptPhase.SUCCEEDED, status  # it ran on through the outage
    assert engine.logs("301.1").data == b"survived\n"
    ref = engine.launch(attempt("302.1", instance("node2", "echo later")))
    assert wait_for(engine, "302.1", FINISHED).phase is AttemptPhase.SUCCEEDED
    names = subprocess.run(
        ["squeue", "-h", "--states=all", "--name=corral-302.1", "-o", "%i"],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert names == [ref]  # the launch refused during the outage submitted nothing
