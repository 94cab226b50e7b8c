"""The exit-spec table: every case the platform promises, admin files, bad input, bounded work."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from corral.db.diag_models import AttemptFault
from corral.diagnosis.exitspec import (
    Category,
    ExitSpecCache,
    ExitSpecError,
    Facts,
    load_exit_spec,
    markdown_table,
)
from corral.diagnosis.logtail import log_size, read_tail
from corral.diagnosis.record import facts_of
from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason, LogChunk

ROOT = Path(__file__).resolve().parents[2]
SPEC = load_exit_spec()


def classify(events: set[str], log: str = "", exit_code: int | None = 1, signal: int | None = None) -> str:
    return SPEC.classify(Facts(frozenset(events), exit_code, signal, log)).reason


U, T, H, P, PR = Category.USER, Category.TRANSIENT, Category.HARDWARE, Category.PLATFORM, Category.PREEMPTED


@pytest.mark.parametrize(
    ("events", "log", "exit_code", "signal", "reason", "category"),
    [
        ({"oom"}, "", 137, None, "oom", U),  # host OOM from the cgroup counters
        (
            {"exit_code"},
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB",
            1,
            None,
            "cuda_oom",
            U,
        ),
        (
            {"exit_code"},
            "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total)",
            1,
            None,
            "cuda_oom",
            U,
        ),
        (
            {"exit_code"},
            "tensorflow.python.framework.errors_impl.ResourceExhaustedError: OOM when allocating "
            "tensor with shape[1024,1024]",
            1,
            None,
            "cuda_oom",
            U,
        ),
        (
            {"signal"},
            "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
            "OpType=ALLREDUCE) ran for 1800000 milliseconds before timing out.",
            134,
            6,
            "nccl_hang",
            T,
        ),
        (
            {"exit_code"},
            "torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1275, "
            "unhandled system error",
            1,
            None,
            "nccl_error",
            T,
        ),
        ({"stopped", "gpu_error"}, "", None, None, "gpu_error", H),
        (
            {"exit_code"},
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            1,
            None,
            "gpu_error",
            H,
        ),
        (
            {"exit_code"},
            "RuntimeError: CUDA error: uncorrectable ECC error encountered",
            1,
            None,
            "gpu_error",
            H,
        ),
        ({"signal"}, "", 139, 11, "segfault", U),
        ({"exit_code"}, "ModuleNotFoundError: No module named 'transformers'", 1, None, "user_error", U),
        ({"exit_code"}, "ImportError: cannot import name 'foo' from 'bar'", 1, None, "user_error", U),
        (
            {"exit_code"},
            '  File "train.py", line 3\n    def f(:\nSyntaxError: invalid syntax',
            1,
            None,
            "user_error",
            U,
        ),
        (
            {"exit_code"},
            "FileNotFoundError: [Errno 2] No such file or directory: '/data/x.csv'",
            1,
            None,
            "missing_file",
            U,
        ),
        (
            {"exit_code"},
            "ValueError: dataset imagenet-21k not found in the registry",
            1,
            None,
            "missing_file",
            U,
        ),
        ({"exit_code"}, "OSError: [Errno 28] No space left on device", 1, None, "disk_full", P),
        ({"exit_code"}, "OSError: [Errno 122] Disk quota exceeded", 1, None, "storage_quota", U),
        ({"timeout"}, "", None, None, "timeout", U),  # killed by max_runtime
        ({"preempted"}, "", None, None, "preempted", PR),
        ({"node_lost"}, "", None, None, "node_lost", P),
        ({"status_unreadable"}, "", None, None, "status_unreadable", P),  # Corral's own fault (Slurm)
        # a GPU fault recorded under it is classed by its own rule, not the unreadable end
        ({"status_unreadable", "gpu_error"}, "", None, None, "gpu_error", H),
        (
            {"status_unreadable"},
            "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus",
            None,
            None,
            "gpu_error",
            H,
        ),
        # and no rule after it: none of the user's by a line of the log (review121 #2: a wandb
        # warning made Corral's own fault the job's, never retried); a hang (or OOM) stop's
        # unread end is the fault's all the same: facts_of leaves the unread end out then (below)
        ({"status_unreadable", "hang"}, "", None, None, "status_unreadable", P),
        (
            {"status_unreadable"},
            "wandb: WARNING environment variable WANDB_API_KEY not found",
            None,
            None,
            "status_unreadable",
            P,
        ),
        ({"status_unreadable"}, "sh: 1: conda: command not found", 1, None, "status_unreadable", P),
        ({"status_unreadable", "timeout"}, "", None, None, "timeout", U),
        (
            {"launch_failed"},
            "unknown environment 'torch-9'; this node has: default",
            None,
            None,
            "environment_missing",
            U,
        ),
        (  # a sandbox bwrap refused (local engine): the platform's, not missing_file's (user)
            {"launch_failed"},
            "rank 0: the sandbox did not start the job: bwrap: Can't find source path /proc/self/fd/7: "
            "No such file or directory\n"
            "bwrap: Can't find source path /proc/self/fd/7: No such file or directory",
            None,
            None,
            "launch_failed",
            P,
        ),
        (
            {"launch_failed"},
            "sbatch: error: Batch job submission failed: Socket timed out",
            None,
            None,
            "launch_failed",
            P,
        ),
        ({"exit_code"}, "conda: command not found", 127, None, "environment_missing", U),
        ({"exit_code"}, "sh: 1: trian.py: not found", 127, None, "command_not_found", U),
        ({"exit_code"}, "loss=nan, giving up", 3, None, "exit_code", U),
    ],
)
def test_every_promised_case_gets_its_reason(
    events: set[str], log: str, exit_code: int | None, signal: int | None, reason: str, category: Category
) -> None:
    verdict = SPEC.classify(Facts(frozenset(events), exit_code, signal, log))
    assert (verdict.reason, verdict.category) == (reason, category)
    assert verdict.message and verdict.fix


def test_user_errors_are_never_retried_and_transient_ones_are() -> None:
    user_error, nccl = SPEC.by_reason("user_error"), SPEC.by_reason("nccl_hang")
    assert user_error is not None and user_error.retry.cap == 0
    assert nccl is not None and nccl.retry.cap == 2 and nccl.retry.backoff(2) == 60.0


def test_the_docs_show_the_shipped_table() -> None:
    docs = (ROOT / "docs" / "diagnosis.md").read_text()
    assert markdown_table(SPEC.rules) in docs, "docs/diagnosis.md: run python -m corral.diagnosis.exitspec"


def test_admin_rules_override_by_reason_and_new_ones_come_first(tmp_path: Path) -> None:
    path = tmp_path / "exit.yaml"
    path.write_text(
        "version: 1\nrules:\n"
        "  - {reason: cuda_oom, category: transient, log: ['CUDA out of memory'], message: m, fix: f,"
        " retry: {policy: up_to, limit: 1}}\n"
        "  - {reason: site_flaky_fs, category: transient, log: ['Stale file handle'], message: m, fix: f,"
        " retry: {policy: always}}\n"
    )
    spec = load_exit_spec(path)
    assert spec.rules[0].reason == "site_flaky_fs"
    assert [r.reason for r in spec.rules].count("cuda_oom") == 1
    oom = spec.classify(Facts(frozenset({"exit_code"}), 1, None, "CUDA out of memory"))
    assert (oom.reason, oom.category) == ("cuda_oom", Category.TRANSIENT)
    stale = spec.classify(Facts(frozenset({"exit_code"}), 1, None, "OSError: Stale file handle"))
    assert stale.reason == "site_flaky_fs"


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("version: 1\nrules:\n  - reason: x\n    category: user\n    events: [oom]\n    message: m\n"
         "    fix: f\n    retry: {policy: sometimes}\n", ":8: rules.0.retry.policy"),
        ("version: 1\nrules:\n  - reason: x\n    category: user\n    log: ['(a)\\1']\n    message: m\n"
         "    fix: f\n    retry: {policy: never}\n", ":5: rules.0.log: RE2 cannot compile"),
        ("version: 1\nrules:\n  - reason: x\n    category: user\n    message: m\n    fix: f\n"
         "    retry: {policy: never}\n", ":3: rules.0: rule x has no condition"),
        ("version: 1\nrules:\n  - reason: x\n    category: user\n    events: [oom\n", ":6: not valid YAML"),
        ("version: 1\nrules:\n  - reason: x\n    category: user\n    events: [coffee]\n    message: m\n"
         "    fix: f\n    retry: {policy: never}\n", ":5: rules.0.events: unknown event(s) coffee"),
    ],
)  # fmt: skip
def test_a_bad_file_is_refused_with_its_line(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ExitSpecError) as err:
        load_exit_spec(path)
    assert f"{path}{where}" in str(err.value)


def test_a_bad_edit_keeps_the_previous_table_active(tmp_path: Path) -> None:
    path = tmp_path / "exit.yaml"
    rule = "{reason: mine, category: user, log: ['MINE'], message: m, fix: f, retry: {policy: never}}"
    path.write_text(f"version: 1\nrules:\n  - {rule}\n")
    cache = ExitSpecCache(path)
    assert cache.get().rules[0].reason == "mine"
    path.write_text("version: 1\nrules: [oops\n")
    assert cache.get().rules[0].reason == "mine"
    assert cache.last_error is not None and f"{path}:3" in cache.last_error


class FileEngine:
    """The engine's `logs()` over a real file (what the local engine does), counting calls."""

    def __init__(self, path: Path) -> None:
        self.path, self.calls = path, 0

    def logs(self, attempt_id: str, instance: int = 0, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        self.calls += 1
        with open(self.path, "rb") as f:
            f.seek(offset)
            data = f.read(limit)
        return LogChunk(data, offset + len(data), True)


def test_the_tail_of_a_huge_log_with_invalid_utf8_is_read_in_bounded_time(tmp_path: Path) -> None:
    path = tmp_path / "rank-0.log"
    with open(path, "wb") as f:
        f.truncate(8 << 30)  # 8 GiB (sparse): reading it whole would take minutes
        f.seek(8 << 30)
        f.write(
            b"\xff\xfe garbage \xc3\n" + b"a" * 50_000 + b"\nRuntimeError: CUDA out of memory. \xe2\x28\xa1\n"
        )
    engine = FileEngine(path)
    start = time.monotonic()
    assert log_size(engine, "1.1", 0) == path.stat().st_size  # type: ignore[arg-type]
    tail = read_tail(engine, "1.1", 0, 64 * 1024)  # type: ignore[arg-type]
    elapsed = time.monotonic() - start
    assert len(tail.encode()) <= 64 * 1024 * 3 and "\ufffd" in tail
    assert SPEC.classify(Facts(frozenset({"exit_code"}), 1, None, tail)).reason == "cuda_oom"
    assert engine.calls < 200 and elapsed < 5.0, (engine.calls, elapsed)


def test_a_pathological_pattern_on_a_pathological_log_runs_in_linear_time(tmp_path: Path) -> None:
    path = tmp_path / "exit.yaml"
    path.write_text("version: 1\nrules:\n  - {reason: evil, category: user, log: ['(a+)+$', '(a|aa)+b'],"
                    " message: m, fix: f, retry: {policy: never}}\n")  # fmt: skip
    spec = load_exit_spec(path)
    log = "a" * 60_000 + "!"  # Python's re needs exponential time for both patterns on this
    start = time.monotonic()
    verdict = spec.classify(Facts(frozenset({"exit_code"}), 1, None, log))
    assert verdict.reason == "exit_code"  # neither evil pattern matches; the fallback explains it
    assert time.monotonic() - start < 2.0


@pytest.mark.parametrize(
    ("fault_event", "reason"),
    [(None, "status_unreadable"), ("hang", "hang_killed"), ("oom", "oom"), ("gpu_error", "gpu_error")],
)
def test_an_unread_end_of_an_attempt_stopped_for_a_recorded_fault_is_that_faults(
    fault_event: str | None, reason: str
) -> None:
    """review122 #1: with the status_unreadable rule before the log-only ones, a hang stop (or a
    chaos OOM) whose end Corral could not read became status_unreadable: retried on the whole
    platform budget, "nothing to do". The fault is why Corral stopped it; its rule decides."""
    status = AttemptStatus(
        "9.1", AttemptPhase.FAILED, None, FailureReason.STATUS_UNREADABLE, "could not read"
    )
    fault = None
    if fault_event is not None:
        fault = AttemptFault(attempt_pk=1, event=fault_event, node="n", detail="requeue: rank 0 on n", at=0.0)
    assert SPEC.classify(facts_of(status, fault, "")).reason == reason
    # and no line of its log decides it instead (review123 #2: a wandb warning made a hang stop's
    # unread end environment_missing, the job's, never retried)
    wandb = "wandb: WARNING environment variable WANDB_API_KEY not found"
    assert SPEC.classify(facts_of(status, fault, wandb)).reason == reason


def test_a_read_end_of_an_attempt_stopped_for_a_hang_is_not_decided_by_its_log() -> None:
    """review124 #3: a hang (or OOM) stop's read end (stopped) with a log line a user rule matches
    was that rule's (environment_missing: the job's, never retried)."""
    stopped = AttemptStatus("9.1", AttemptPhase.FAILED, None, FailureReason.STOPPED, "stopped by Corral")
    hang = AttemptFault(attempt_pk=1, event="hang", node="n", detail="requeue: rank 0 on n", at=0.0)
    wandb = "wandb: WARNING environment variable WANDB_API_KEY not found"
    assert SPEC.classify(facts_of(stopped, hang, wandb)).reason == "hang_killed"
    # without a fault, the log still decides an end (the rules are unchanged for it)
    assert SPEC.classify(facts_of(stopped, None, wandb)).reason == "environment_missing"
