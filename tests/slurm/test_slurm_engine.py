"""The Slurm engine against a real Slurm cluster (three emulated nodes with four fake GPUs each)."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from corral.db.models import Node
from corral.engine.base import AttemptPhase, FailureReason
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm.cli import CliResult, SlurmCli
from corral.scheduler.types import NodeState
from corral.server.context import LoopMemory, ServerContext
from corral.server.nodes import push_admin_states
from tests.slurm.harness import SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, slurm_engine, wait_for

pytestmark = pytest.mark.slurm


def slurm_jobs_named(cluster: SlurmCluster, name: str) -> list[str]:
    out = subprocess.run(
        ["squeue", "-h", "--states=all", f"--name={name}", "-o", "%i"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=15,
    ).stdout
    return out.split()


def read_log(engine: SlurmEngine, attempt_id: str, rank: int = 0) -> str:
    return engine.logs(attempt_id, instance=rank).data.decode()


def test_nodes_discovered_with_gres(engine: SlurmEngine) -> None:
    nodes = {n.name: n for n in engine.nodes()}
    assert sorted(nodes) == ["node1", "node2", "node3"]
    for node in nodes.values():
        assert node.state is NodeState.READY
        assert node.cpus == 4
        assert node.memory_mib == 4000
        assert [g.index for g in node.gpus] == [0, 1, 2, 3]
        assert {g.model for g in node.gpus} == {"vgpu"}  # the GRES type from slurm.conf
        assert node.address == "127.0.0.1"
        assert node.labels["slurm.partitions"] == "debug"


def test_launch_succeeds_logs_and_is_idempotent(engine: SlurmEngine, slurm_cluster: SlurmCluster) -> None:
    a = attempt(
        "101.1",
        instance("node1", 'echo "hello from $(hostname) job=$CORRAL_JOB_ID"', env={"CORRAL_JOB_ID": "101"}),
    )
    ref = engine.launch(a)
    assert ref.isdigit()
    assert engine.launch(a) == ref  # same attempt: same Slurm job, nothing submitted twice
    status = wait_for(engine, "101.1", FINISHED)
    assert status.phase is AttemptPhase.SUCCEEDED, status
    assert status.exit_code == 0
    assert status.engine_ref == ref
    assert status.started_at is not None and status.finished_at is not None
    assert slurm_jobs_named(slurm_cluster, "corral-101.1") == [ref]
    chunk = engine.logs("101.1")
    assert chunk.data.decode() == "hello from node1 job=101\n"
    assert chunk.eof
    tail = engine.logs("101.1", offset=6)
    assert tail.data.decode() == "from node1 job=101\n" and tail.next_offset == chunk.next_offset
    assert engine.launch(a) == ref  # still idempotent after it finished


def test_exit_code_and_signal(engine: SlurmEngine) -> None:
    engine.launch(attempt("102.1", instance("node1", "echo failing >&2; exit 3")))
    engine.launch(attempt("103.1", instance("node2", "kill -9 $$")))
    failed = wait_for(engine, "102.1", FINISHED)
    assert (failed.phase, failed.reason, failed.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.EXIT_CODE,
        3,
    )
    assert read_log(engine, "102.1") == "failing\n"  # stderr lands in the same log
    killed = wait_for(engine, "103.1", FINISHED)
    assert (killed.phase, killed.reason, killed.exit_code) == (AttemptPhase.FAILED, FailureReason.SIGNAL, 137)
    assert "signal 9" in killed.message


def test_stop_with_grace_then_kill(engine: SlurmEngine, tmp_path: Path) -> None:
    polite = "trap 'echo got TERM; exit 0' TERM; echo started; while :; do /bin/sleep 0.1; done"
    stubborn = "trap '' TERM; echo started; while :; do sleep 0.1; done"
    # the polite job's own PATH has no programs: the rank script forwards TERM all the same
    engine.launch(attempt("104.1", instance("node1", polite, env={"PATH": "/nonexistent"})))
    engine.launch(attempt("105.1", instance("node2", stubborn)))
    for aid in ("104.1", "105.1"):
        wait_for(engine, aid, {AttemptPhase.RUNNING})
        deadline = time.monotonic() + 10
        while "started" not in read_log(engine, aid) and time.monotonic() < deadline:
            time.sleep(0.05)
    t0 = time.monotonic()
    engine.stop("104.1", grace_s=20)
    engine.stop("105.1", grace_s=1.5)
    assert time.monotonic() - t0 < 5  # stop does not wait for the grace period
    polite_status = wait_for(engine, "104.1", FINISHED)
    assert (polite_status.phase, polite_status.reason) == (AttemptPhase.FAILED, FailureReason.STOPPED)
    assert "got TERM" in read_log(engine, "104.1")
    assert time.monotonic() - t0 < 15  # ended on SIGTERM, well before its 20 s grace
    stubborn_status = wait_for(engine, "105.1", FINISHED)
    assert time.monotonic() - t0 >= 1.5  # it survived SIGTERM until the grace ran out
    assert (stubborn_status.phase, stubborn_status.reason) == (AttemptPhase.FAILED, FailureReason.STOPPED)
    engine.stop("105.1", grace_s=1)  # stopping a finished attempt is a no-op
    assert engine.poll(["105.1"])["105.1"] == stubborn_status


def test_rejected_submission_fails_with_slurms_message(engine: SlurmEngine) -> None:
    too_big = attempt("106.1", instance("node1", "true", gpus=[0, 1, 2, 3, 4]))  # nodes have 4 GPUs
    assert engine.launch(too_big) == "rejected"
    status = engine.poll(["106.1"])["106.1"]
    assert (status.phase, status.reason) == (AttemptPhase.FAILED, FailureReason.LAUNCH_FAILED)
    assert "Requested node configuration is not available" in status.message
    unknown_node = attempt("107.1", instance("node9", "true"))
    assert engine.launch(unknown_node) == "rejected"
    assert "node9" in engine.poll(["107.1"])["107.1"].message or "Invalid node name" in (
        engine.poll(["107.1"])["107.1"].message
    )


def test_bad_input_is_named(engine: SlurmEngine) -> None:
    with pytest.raises(ValueError, match="attempt_id"):
        engine.launch(attempt("../etc", instance("node1", "true")))
    with pytest.raises(ValueError, match="no instances"):
        engine.launch(attempt("108.1"))
    with pytest.raises(ValueError, match="empty command"):
        engine.launch(attempt("109.1", instance("node1", "  ")))
    unknown = engine.poll(["never-launched"])["never-launched"]
    assert unknown.phase is AttemptPhase.LOST


def test_max_runtime_becomes_timeout(engine: SlurmEngine) -> None:
    engine.launch(attempt("110.1", instance("node3", "sleep 60"), max_runtime_s=1.5))
    status = wait_for(engine, "110.1", FINISHED, timeout_s=30)
    assert (status.phase, status.reason) == (AttemptPhase.FAILED, FailureReason.TIMEOUT)
    assert status.started_at is not None and status.finished_at is not None
    assert status.finished_at - status.started_at < 20


def test_cordon_drain_resume_both_directions(engine: SlurmEngine, slurm_cluster: SlurmCluster) -> None:
    def state(name: str, want: NodeState | None = None) -> NodeState:
        """The node's state; with `want`, wait for it: after a resume slurmctld flags the node
        NOT_RESPONDING (shown as UNKNOWN) until its next ping answer."""
        deadline = time.monotonic() + 10
        while True:
            got = {n.name: n for n in engine.nodes()}[name].state
            if want is None or got is want or time.monotonic() > deadline:
                return got
            time.sleep(0.1)

    def slurm_node(name: str) -> str:
        return subprocess.run(
            ["sinfo", "-h", "-n", name, "-o", "%T|%E"], env=slurm_cluster.env, capture_output=True, text=True
        ).stdout.strip()

    engine.set_node_state("node2", NodeState.CORDONED, "disk check")
    assert state("node2") is NodeState.CORDONED
    assert slurm_node("node2") == "drained|corral cordon: disk check"
    engine.set_node_state("node2", NodeState.DRAINING, "maintenance")
    assert state("node2") is NodeState.DRAINING
    engine.set_node_state("node2", NodeState.READY)
    assert state("node2", NodeState.READY) is NodeState.READY
    assert slurm_node("node2").startswith("idle|")
    engine.set_node_state("node2", NodeState.READY)  # uncordon of a ready node: no-op
    # ... and the other way: an admin drains or downs a node in Slurm itself
    for slurm_state, corral_state in (("drain", NodeState.DRAINING), ("down", NodeState.DOWN)):
        subprocess.run(
            ["scontrol", "update", "nodename=node3", f"state={slurm_state}", "reason=admin"],
            env=slurm_cluster.env,
            check=True,
        )
        node3 = {n.name: n for n in engine.nodes()}["node3"]
        assert (node3.state, node3.message) == (corral_state, "admin")
        subprocess.run(
            ["scontrol", "update", "nodename=node3", "state=resume"], env=slurm_cluster.env, check=True
        )
        assert state("node3", NodeState.READY) is NodeState.READY
    with pytest.raises(ValueError, match="node9"):
        engine.set_node_state("node9", NodeState.CORDONED, "x")
    with pytest.raises(ValueError, match="unknown"):
        engine.set_node_state("node1", NodeState.UNKNOWN)


def _admin_drained_node3_and_corral_cordoned_node2(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> Callable[[str], str]:
    """node3 drained by an admin in Slurm itself ("disk check"), node2 cordoned by Corral; returns
    sinfo(name): the node's state and reason as sinfo prints them (%T|%E)."""

    def sinfo(name: str) -> str:
        return subprocess.run(
            ["sinfo", "-h", "-n", name, "-o", "%T|%E"], env=slurm_cluster.env, capture_output=True, text=True
        ).stdout.strip()

    subprocess.run(
        ["scontrol", "update", "nodename=node3", "state=drain", "reason=disk check"],
        env=slurm_cluster.env,
        check=True,
    )
    engine.set_node_state("node2", NodeState.CORDONED, "was cordoned")
    return sinfo


def test_a_restarted_server_resumes_only_the_drains_corral_made(
    engine: SlurmEngine, slurm_cluster: SlurmCluster
) -> None:
    """After a restart the node loop pushes every node's Corral state once (push_admin_states,
    with an empty memory): "none" for a node an admin drained in Slurm itself must not resume it;
    a node Corral cordoned and an admin uncordoned in Corral meanwhile is resumed. Nor does a
    cordon take the admin's drain over (its uncordon would then resume it)."""

    sinfo = _admin_drained_node3_and_corral_cordoned_node2(engine, slurm_cluster)
    restarted = SimpleNamespace(engine=engine, memory=LoopMemory())
    rows = [Node(name=n, admin_state="none", message="") for n in ("node2", "node3")]
    push_admin_states(cast(ServerContext, restarted), rows)
    assert sinfo("node3") == "drained|disk check"  # the admin's drain stays, with its reason
    node3 = {n.name: n for n in engine.nodes()}["node3"]
    assert (node3.state, node3.message) == (NodeState.DRAINING, "disk check")
    deadline = time.monotonic() + 10
    while not sinfo("node2").startswith("idle|") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sinfo("node2").startswith("idle|")  # Corral's own cordon is undone
    engine.set_node_state("node3", NodeState.CORDONED, "over the admin's drain")
    engine.set_node_state("node3", NodeState.READY)
    assert sinfo("node3") == "drained|disk check"


def test_a_restarts_push_reads_the_holds_from_the_nodes_report(
    engine: SlurmEngine, slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node loop pushes every node's state after a restart right after its report: whether a
    node is held in Slurm is read from that `sinfo --json` (what sinfo's %T and %E print for it),
    not asked of `sinfo` once per node. A node Corral has set since is asked of sinfo again."""

    sinfo = _admin_drained_node3_and_corral_cordoned_node2(engine, slurm_cluster)
    calls: list[tuple[str, ...]] = []
    real = SlurmCli.run

    def recording(self: SlurmCli, tool: str, *args: str, **kwargs: object) -> CliResult:
        if tool == "sinfo":
            calls.append(args)
        return real(self, tool, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(SlurmCli, "run", recording)
    engine.nodes()  # the node loop's report, then its push
    calls.clear()
    restarted = SimpleNamespace(engine=engine, memory=LoopMemory())
    rows = [Node(name=n, admin_state="none", message="") for n in ("node1", "node2", "node3")]
    push_admin_states(cast(ServerContext, restarted), rows)
    assert calls == []  # no sinfo per node
    assert sinfo("node3") == "drained|disk check"  # the admin's drain stays, with its reason
    deadline = time.monotonic() + 10
    while not sinfo("node2").startswith("idle|") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert sinfo("node2").startswith("idle|")  # Corral's own cordon is undone
    engine.set_node_state("node2", NodeState.READY)  # set since the report: asked of sinfo
    assert calls == [("--noheader", "--Node", "--nodes=node2", "--format=%T|%E")]
    engine.set_node_state("node1", NodeState.CORDONED, "x")
    engine.nodes()
    for name in ("node1", "node2", "node3"):  # the report says what sinfo says, as the check reads it
        state, reason = engine.cli.node_hold(name) or ("", "")
        held = engine._holds.get(name)
        assert held is not None, name
        assert (held[0].startswith("drain"), held[1]) == (state.startswith("drain"), reason), name


RENDEZVOUS_PRINT = (
    'echo "host=$(hostname) node=$SLURMD_NODENAME rank=$RANK world=$WORLD_SIZE '
    'master=$MASTER_ADDR:$MASTER_PORT cvd=$CUDA_VISIBLE_DEVICES slurm_gpus=$CORRAL_SLURM_GPUS"'
)


def rendezvous_env(rank: int, cvd: str) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29511",
        "CUDA_VISIBLE_DEVICES": cvd,
        "CORRAL_TASK_INDEX": str(rank),
    }


def test_two_instances_two_gpus_on_two_named_nodes(engine: SlurmEngine, slurm_cluster: SlurmCluster) -> None:
    a = attempt(
        "111.1",
        instance(
            "node1", RENDEZVOUS_PRINT, rank=0, gpus=[0, 1], env=rendezvous_env(0, "0,1"), role="trainer"
        ),
        instance(
            "node3", RENDEZVOUS_PRINT, rank=1, gpus=[2, 3], env=rendezvous_env(1, "2,3"), role="trainer"
        ),
    )
    ref = engine.launch(a)
    status = wait_for(engine, "111.1", FINISHED)
    assert status.phase is AttemptPhase.SUCCEEDED, status
    assert slurm_jobs_named(slurm_cluster, "corral-111.1") == [ref]  # the gang is ONE Slurm job
    rank0, rank1 = read_log(engine, "111.1", 0).split(), read_log(engine, "111.1", 1).split()
    assert rank0[:5] == ["host=node1", "node=node1", "rank=0", "world=2", "master=127.0.0.1:29511"]
    assert rank1[:5] == ["host=node3", "node=node3", "rank=1", "world=2", "master=127.0.0.1:29511"]
    # Slurm chose two GPUs on each node (Corral's own indices and CUDA_VISIBLE_DEVICES are not
    # passed on); CUDA numbers the devices the job can open from 0, as under ConstrainDevices
    for words in (rank0, rank1):
        assert words[5] == "cvd=0,1" and len(words[6].split("=")[1].split(",")) == 2, words


def test_two_instances_share_a_node_with_disjoint_gpus(engine: SlurmEngine) -> None:
    node2 = {n.name: n for n in engine.nodes()}["node2"]
    uuids = ",".join(g.uuid for g in node2.gpus[:2])
    a = attempt(
        "112.1",
        instance(
            "node2", RENDEZVOUS_PRINT, rank=0, gpus=[0, 1], env={"RANK": "0", "CUDA_VISIBLE_DEVICES": uuids}
        ),
        instance("node2", RENDEZVOUS_PRINT, rank=1, gpus=[2, 3], env={"RANK": "1"}),
    )
    engine.launch(a)
    assert wait_for(engine, "112.1", FINISHED).phase is AttemptPhase.SUCCEEDED
    words = [read_log(engine, "112.1", r).split() for r in (0, 1)]
    assert [w[5] for w in words] == ["cvd=0,1", "cvd=0,1"]
    # Slurm allocated the node's four GPUs to the job; each instance got its own half of them
    shares = [set(w[6].split("=")[1].split(",")) for w in words]
    assert len(shares[0]) == len(shares[1]) == 2 and shares[0] | shares[1] == {"0", "1", "2", "3"}, words


def test_one_failing_rank_fails_the_gang(engine: SlurmEngine) -> None:
    a = attempt(
        "113.1",
        instance("node1", "sleep 30", rank=0),
        instance("node2", "echo bye; exit 7", rank=1),
    )
    engine.launch(a)
    status = wait_for(engine, "113.1", FINISHED, timeout_s=25)
    assert (status.phase, status.reason, status.exit_code) == (
        AttemptPhase.FAILED,
        FailureReason.EXIT_CODE,
        7,
    )
    assert "rank 1" in status.message


def test_adopt_after_restart(engine: SlurmEngine, slurm_cluster: SlurmCluster) -> None:
    ref = engine.launch(attempt("114.1", instance("node1", "sleep 1; echo adopted")))
    wait_for(engine, "114.1", {AttemptPhase.RUNNING})
    engine.close()
    # the server restarts with the same state dir ...
    same_dir = slurm_engine(slurm_cluster, engine.store.root)
    same_dir.adopt({"114.1": ref})
    assert wait_for(same_dir, "114.1", FINISHED).phase is AttemptPhase.SUCCEEDED
    assert read_log(same_dir, "114.1") == "adopted\n"
    # ... or with its state dir lost: Slurm still knows the job by id
    fresh = slurm_engine(slurm_cluster)
    fresh.adopt({"114.1": ref})
    status = fresh.poll(["114.1"])["114.1"]
    assert (status.phase, status.engine_ref) == (AttemptPhase.SUCCEEDED, ref)


def test_poll_survives_an_account_that_no_longer_exists(engine: SlurmEngine) -> None:
    """squeue --users=<unknown account> prints an error and lists no jobs (exit 0): the engine must
    neither read that as "every job is gone" (LOST) nor stop polling; it asks for all users."""
    engine.launch(attempt("115.1", instance("node2", "echo still here")))
    record = engine.store.load("115.1")
    assert record is not None
    record.unix_user = "corralt-deleted-account"  # as if the account was removed since the launch
    record.slurm_job_id = ""  # and sbatch's answer lost: the poll looks for it by the accounts' jobs
    engine.store.save(record)
    status = wait_for(engine, "115.1", FINISHED)
    assert status.phase is AttemptPhase.SUCCEEDED, status
    assert read_log(engine, "115.1") == "still here\n"


def test_factory_builds_the_slurm_engine(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from corral.config import Settings
    from corral.engine.factory import make_engine

    monkeypatch.setenv("CORRAL_SLURM_CONF", str(slurm_cluster.conf))
    monkeypatch.setenv("CORRAL_SLURM_PARTITION", "debug")
    eng = make_engine(Settings(engine="slurm", home=tmp_path / "home"))
    assert isinstance(eng, SlurmEngine)
    assert eng.store.root == tmp_path / "home" / "slurm"
    assert eng.user_map.source is None  # unset: every launch is refused
    monkeypatch.setenv("CORRAL_SLURM_USER_MAP", "same")
    monkeypatch.setenv("CORRAL_SLURM_GPU_DEVICE", "/dev/gpu-{index}")
    eng = make_engine(Settings(engine="slurm", home=tmp_path / "home"))
    assert isinstance(eng, SlurmEngine)
    assert eng.user_map.source == "same" and eng.sandbox.gpu_device == "/dev/gpu-{index}"
    assert len(eng.nodes()) == 3
    monkeypatch.setenv("CORRAL_SLURM_PARTITION", "nonexistent")
    assert make_engine(Settings(engine="slurm", home=tmp_path / "home")).nodes() == []
    assert eng.poll_interval_s == 0.04  # the reconcile loop's pace on Slurm (server.runner)
    monkeypatch.setenv("CORRAL_SLURM_POLL_S", "0.2")
    assert make_engine(Settings(engine="slurm", home=tmp_path / "home")).poll_interval_s == 0.2
    monkeypatch.setenv("CORRAL_SLURM_POLL_S", "0")
    with pytest.raises(ValueError, match="CORRAL_SLURM_POLL_S"):
        make_engine(Settings(engine="slurm", home=tmp_path / "home"))
    monkeypatch.delenv("CORRAL_SLURM_POLL_S")
    assert eng.launch_workers == 8  # sbatch calls at once (server/dispatch.launch_workers)
    monkeypatch.setenv("CORRAL_SLURM_LAUNCH_WORKERS", "16")
    assert make_engine(Settings(engine="slurm", home=tmp_path / "home")).launch_workers == 16
    for bad in ("0", "many"):
        monkeypatch.setenv("CORRAL_SLURM_LAUNCH_WORKERS", bad)
        with pytest.raises(ValueError, match="CORRAL_SLURM_LAUNCH_WORKERS"):
            make_engine(Settings(engine="slurm", home=tmp_path / "home"))
    monkeypatch.delenv("CORRAL_SLURM_LAUNCH_WORKERS")
    # how long an attempt whose status cannot be read keeps its state (engine/slurm/unreadable.py)
    assert eng._unreadable.grace_s == 600
    monkeypatch.setenv("CORRAL_SLURM_UNREADABLE_GRACE_S", "30")
    assert make_engine(Settings(engine="slurm", home=tmp_path / "home"))._unreadable.grace_s == 30
    for bad in ("0", "soon", "1e9"):
        monkeypatch.setenv("CORRAL_SLURM_UNREADABLE_GRACE_S", bad)
        with pytest.raises(ValueError, match="CORRAL_SLURM_UNREADABLE_GRACE_S"):
            make_engine(Settings(engine="slurm", home=tmp_path / "home"))
    monkeypatch.delenv("CORRAL_SLURM_UNREADABLE_GRACE_S")
    monkeypatch.setenv("CORRAL_SLURM_TIMEOUT_S", "soon")
    with pytest.raises(ValueError, match="CORRAL_SLURM_TIMEOUT_S"):
        make_engine(Settings(engine="slurm", home=tmp_path / "home"))


def test_doctor_asks_the_cluster_the_engine_uses(
    slurm_cluster: SlurmCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral doctor` on Slurm: CORRAL_SLURM_CONF, as the engine (not the shell's SLURM_CONF,
    which it used to read, so it said "slurmctld not answering" of a working cluster), the
    partition the engine submits to, whether Slurm enforces memory and GPUs as the local engine's
    cgroups do (the shared cluster constrains devices, not RAM), and the user map."""
    from corral.config import Settings
    from corral.ops.doctor import check_cgroups, check_slurm, check_slurm_users

    settings = Settings(engine="slurm", home=tmp_path / "home")
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.delenv("CORRAL_SLURM_CONF", raising=False)
    unset = check_slurm(settings)
    assert unset.status == "fail" and "set CORRAL_SLURM_CONF" in (unset.fix or ""), unset
    monkeypatch.setenv("CORRAL_SLURM_CONF", str(slurm_cluster.conf))
    assert check_slurm(settings).detail == "partitions: debug*"
    monkeypatch.setenv("CORRAL_SLURM_PARTITION", "gpu-big")
    wrong = check_slurm(settings)
    assert (wrong.status, wrong.detail) == (
        "fail",
        "CORRAL_SLURM_PARTITION=gpu-big: Slurm has no such partition (it has debug*)",
    )
    confined = check_cgroups(settings, tmp_path)
    assert confined.status == "warn" and confined.fix == "ConstrainRAMSpace=yes in cgroup.conf", confined
    assert confined.detail.startswith("ConstrainRAMSpace=no: a job over its memory runs on"), confined
    monkeypatch.delenv("CORRAL_SLURM_USER_MAP", raising=False)
    users = check_slurm_users(settings)  # unset: every job refused at launch, said only then
    assert (users.status, users.detail) == ("fail", "CORRAL_SLURM_USER_MAP is unset: every job is refused")
    monkeypatch.setenv("CORRAL_SLURM_USER_MAP", str(tmp_path / "missing.yaml"))
    assert "cannot read the user map" in check_slurm_users(settings).detail
    monkeypatch.setenv("CORRAL_SLURM_USER_MAP", str(slurm_cluster.user_map))
    assert check_slurm_users(settings).status == "ok"
