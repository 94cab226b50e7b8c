"""Slurm -> Corral translations for the cases a 3-node test cluster cannot produce on demand
(OUT_OF_MEMORY needs cgroup memory enforcement, typed multi-GRES nodes, ...). The job and node
dicts have the shape `squeue --json` / `sinfo --json` print (openapi v0.0.38); the engine reads
jobs from `squeue --Format` lines into that shape (cli.parse_squeue)."""

from __future__ import annotations

import os
import pwd
import time
from datetime import datetime
from pathlib import Path

import pytest

from corral.engine.base import AttemptPhase, FailureReason
from corral.engine.slurm import mapping, scripts
from corral.engine.slurm.cli import parse_squeue
from corral.engine.slurm.users import UnixAccount, UnmappedUser, UserMap
from corral.scheduler.types import NodeState
from tests.slurm.harness import TEST_ACCOUNTS, ensure_accounts
from tests.slurm.helpers import attempt, instance


def job(state: str, exit_code: int = 0, **extra: object) -> dict[str, object]:
    return {
        "job_id": 42,
        "job_state": state,
        "exit_code": exit_code,
        "start_time": 100,
        "end_time": 160,
        **extra,
    }


@pytest.mark.parametrize(
    ("slurm", "exits", "phase", "reason", "code"),
    [
        (job("COMPLETED"), {0: 0}, AttemptPhase.SUCCEEDED, None, 0),
        (job("FAILED", 3 << 8), {0: 3}, AttemptPhase.FAILED, FailureReason.EXIT_CODE, 3),
        (job("FAILED", 9), {}, AttemptPhase.FAILED, FailureReason.SIGNAL, 137),  # raw status: signal 9
        (job("OUT_OF_MEMORY", 9), {}, AttemptPhase.FAILED, FailureReason.OOM, 137),
        (job("TIMEOUT", 15), {}, AttemptPhase.FAILED, FailureReason.TIMEOUT, 143),
        (job("NODE_FAIL", nodes="node3"), {}, AttemptPhase.LOST, FailureReason.NODE_LOST, None),
        (job("CANCELLED", 15), {}, AttemptPhase.FAILED, FailureReason.SIGNAL, 143),
        (
            job("FAILED", 0, state_reason="JobLaunchFailure"),
            {},
            AttemptPhase.FAILED,
            FailureReason.LAUNCH_FAILED,
            0,
        ),
        # the first rank to end is the cause; the other was killed because of it
        (job("CANCELLED", 15), {1: 7, 0: 143}, AttemptPhase.FAILED, FailureReason.EXIT_CODE, 7),
    ],
)
def test_terminal_status(
    slurm: dict[str, object],
    exits: dict[int, int],
    phase: AttemptPhase,
    reason: FailureReason | None,
    code: int | None,
) -> None:
    status = mapping.terminal_status("42.1", slurm, exits, stop_kind=None)
    assert (status.phase, status.reason, status.exit_code) == (phase, reason, code)
    assert status.engine_ref == "42"
    assert (status.started_at, status.finished_at) == (100.0, 160.0)


def test_stop_and_timeout_requested_by_corral_win() -> None:
    done_on_term = job("COMPLETED")  # a job that exits 0 on SIGTERM was still stopped
    assert mapping.terminal_status("1.1", done_on_term, {0: 0}, "stopped").reason is FailureReason.STOPPED
    assert mapping.terminal_status("1.1", job("CANCELLED"), {}, "timeout").reason is FailureReason.TIMEOUT
    lost = mapping.terminal_status("1.1", job("NODE_FAIL"), {}, "stopped")
    assert lost.phase is AttemptPhase.LOST  # a node failure stays a node failure


def test_squeue_format_gives_what_squeue_json_gives() -> None:
    """Lines as `squeue --Format` printed them on the harness (the JSON of the same jobs, side by
    side: exit_code 768 and 9 are the raw wait statuses of `exit 3` and `kill -9`)."""
    when = int(datetime.fromisoformat("2026-11-27T22:22:09").timestamp())  # local time, as squeue
    out = (
        "3922960|FAILED|768|2026-11-27T22:22:09|2026-11-27T22:22:09|0|NonZeroExitCode|node1|corral-7.1\n"
        "3922961|FAILED|9|2026-11-27T22:22:09|2026-11-27T22:22:09|1|JobLaunchFailure|node2|sig|pipe name\n"
        "3922963|PENDING|0|N/A|N/A|0|Resources||corral-8.1\n"
        "3922964|RUNNING|0|2026-11-27T22:22:09|NONE|0|None|node1|run\n"
        "squeue: a line that is not a job\n"
    )
    jobs = parse_squeue(out)
    assert [j["job_id"] for j in jobs] == [3922960, 3922961, 3922963, 3922964]
    failed, killed, pending, running = jobs
    assert failed == {
        "job_id": 3922960,
        "name": "corral-7.1",
        "job_state": "FAILED",
        "exit_code": 768,
        "start_time": when,
        "end_time": when,
        "restart_cnt": 0,
        "state_reason": "NonZeroExitCode",
        "nodes": "node1",
    }
    assert killed["name"] == "sig|pipe name" and killed["restart_cnt"] == 1  # the name is last
    assert mapping.terminal_status("7.1", failed, {}, None).exit_code == 3
    assert mapping.terminal_status("9.1", killed, {}, None).reason is FailureReason.SIGNAL
    assert (
        pending["start_time"] == 0
        and mapping.live_status("8.1", pending).message == "Slurm holds it pending: Resources"
    )
    assert running["end_time"] == 0 and mapping.live_status("x", running).started_at == when


def test_squeue_lines_with_the_comment() -> None:
    """With --name=corral-<id> (no "|" in the name), the comment comes last and may hold anything."""
    out = "7|RUNNING|0|N/A|NONE|0|None|node1|corral-7.1|corral job=7 submission=ab|cd\n"
    (job,) = parse_squeue(out, comment=True)
    assert (job["name"], job["comment"]) == ("corral-7.1", "corral job=7 submission=ab|cd")


def test_gres_parsing() -> None:
    assert mapping.parse_gpu_gres("gpu:4") == [(None, 4)]
    assert mapping.parse_gpu_gres("gpu:vgpu:4") == [("vgpu", 4)]
    assert mapping.parse_gpu_gres("gpu:a100:2(S:0-1),gpu:v100:2(S:0),mps:100") == [("a100", 2), ("v100", 2)]
    assert mapping.parse_gpu_gres("") == []


def test_node_report_from_sinfo() -> None:
    node = {
        "name": "gpu7",
        "state": "mixed",
        "state_flags": [],
        "cpus": 64,
        "real_memory": 512000,
        "gres": "gpu:a100:2(S:0),gpu:v100:1(S:1)",
        "address": "10.0.0.7",
        "partitions": ["gpu", "debug"],
        "reason": "",
    }
    report = mapping.node_report(node, default_gpu_model="VGPU")
    assert [(g.index, g.model) for g in report.gpus] == [(0, "a100"), (1, "a100"), (2, "v100")]
    assert (report.cpus, report.memory_mib, report.address, report.state) == (
        64.0,
        512000,
        "10.0.0.7",
        NodeState.READY,
    )
    assert report.labels["slurm.partitions"] == "gpu,debug"
    untyped = mapping.node_report({**node, "gres": "gpu:2"}, default_gpu_model="VGPU")
    assert {g.model for g in untyped.gpus} == {"VGPU"}


@pytest.mark.parametrize(
    ("state", "flags", "reason", "expected"),
    [
        ("idle", [], "", NodeState.READY),
        ("allocated", [], "", NodeState.READY),
        ("idle", ["DRAIN"], "corral cordon: disk", NodeState.CORDONED),
        ("mixed", ["DRAIN"], "maintenance", NodeState.DRAINING),
        ("down", [], "Not responding", NodeState.DOWN),
        ("idle", ["NOT_RESPONDING"], "", NodeState.UNKNOWN),
        ("unknown", [], "", NodeState.UNKNOWN),
    ],
)
def test_node_states(state: str, flags: list[str], reason: str, expected: NodeState) -> None:
    assert mapping.node_state({"state": state, "state_flags": flags, "reason": reason})[0] is expected


def test_sbatch_args_sum_what_is_placed_on_each_node() -> None:
    a = attempt(
        "9.1",
        instance("n1", "true", rank=0, gpus=[0, 1], cpus=2, memory_mib=1000),
        instance("n1", "true", rank=1, gpus=[2, 3], cpus=2, memory_mib=1000),
        instance("n2", "true", rank=2, gpus=[0], cpus=1.5, memory_mib=500),
        max_runtime_s=90,
    )
    account = UnixAccount("alice", 1234, 5678)
    args = scripts.sbatch_args(
        a, scripts.validate(a), Path("/shared/9.1"), partition="gpu", account=account, token="5ub"
    )
    assert "--uid=1234" in args and "--gid=5678" in args  # the job runs as its user's account
    assert "--nodelist=n1,n2" in args and "--nodes=2" in args and "--ntasks-per-node=1" in args
    assert "--gres=gpu:4" in args  # the most GPUs placed on one node
    assert "--cpus-per-task=4" in args and "--mem=2000M" in args
    assert "--time=2" in args and "--partition=gpu" in args and "--no-requeue" in args
    assert "--job-name=corral-9.1" in args
    # the submission's token: batch.sh's argument (it runs nothing unless it is the attempt's
    # current one) and in the comment (how the engine tells the current submission by name)
    assert args[-2:] == ["/shared/9.1/batch.sh", "5ub"]
    assert any(a.startswith("--comment=") and a.endswith(" submission=5ub") for a in args)


def test_holds_made_in_slurm_are_left_alone() -> None:
    held = mapping.held_in_slurm
    assert not held(NodeState.READY, "drained", "corral cordon: disk")  # Corral's own: resumed
    assert not held(NodeState.READY, "idle", "none")
    assert held(NodeState.READY, "drained", "disk check") and held(NodeState.READY, "down*", "Not responding")
    assert held(NodeState.CORDONED, "drained", "disk check")  # not relabelled as Corral's cordon
    assert not held(NodeState.DRAINING, "down*", "Not responding")  # drained, to stay out once back
    assert not held(NodeState.DRAINING, "drained", "corral cordon: x")


def test_scontrol_arguments() -> None:
    assert mapping.scontrol_state_args("n1", NodeState.READY, "") == ["update", "nodename=n1", "state=resume"]
    cordon = mapping.scontrol_state_args("n1", NodeState.CORDONED, "")
    assert cordon[2:] == ["state=drain", "reason=corral cordon: cordoned"]
    with pytest.raises(ValueError, match="unknown"):
        mapping.scontrol_state_args("n1", NodeState.UNKNOWN, "")


def test_user_map_modes_and_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ensure_accounts([TEST_ACCOUNTS["alice"], TEST_ACCOUNTS["bob"]])
    alice, bob = (pwd.getpwnam(TEST_ACCOUNTS[u]) for u in ("alice", "bob"))
    same = UserMap("same")  # the Corral user name is the account name
    assert same.account(alice.pw_name) == UnixAccount(alice.pw_name, alice.pw_uid, alice.pw_gid)
    with pytest.raises(UnmappedUser, match=r"'root' .*uid 0.*CORRAL_SLURM_MIN_UID=1000"):
        same.account("root")
    with pytest.raises(UnmappedUser, match=r"'nobody-here-xyz' .*does not exist"):
        same.account("nobody-here-xyz")
    table = tmp_path / "users.yaml"
    table.write_text(f"carol: {alice.pw_name}\n")
    mapped = UserMap(str(table))
    assert mapped.account("carol").uid == alice.pw_uid
    table.write_text(f"carol: {bob.pw_name}\n")  # the admin edits the file: no restart needed
    os.utime(table, (time.time() + 5, time.time() + 5))
    assert mapped.account("carol").uid == bob.pw_uid
    with pytest.raises(UnmappedUser, match=rf"'dave' is not in the Slurm user map {table}"):
        mapped.account("dave")
    assert UserMap(str(table), min_uid=bob.pw_uid + 1).describe() == f"file {table}"
    with pytest.raises(UnmappedUser, match="may not run jobs"):
        UserMap(str(table), min_uid=bob.pw_uid + 1).account("carol")
    monkeypatch.setenv("CORRAL_SLURM_MIN_UID", "0")
    with pytest.raises(ValueError, match="CORRAL_SLURM_MIN_UID must be >= 1"):
        UserMap.from_env()
    monkeypatch.setenv("CORRAL_SLURM_MIN_UID", "500")
    monkeypatch.setenv("CORRAL_SLURM_USER_MAP", "same")
    assert UserMap.from_env().min_uid == 500 and UserMap.from_env().source == "same"
