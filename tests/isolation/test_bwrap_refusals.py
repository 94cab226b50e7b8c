"""Which sandbox failures are the platform's (launch_failed) and which the job's own
(docs/isolation.md, "Sandboxes that do not start"), end to end: the real engine, bubblewrap and
cgroups, with a `bwrap` first on PATH that, when the test arms it, makes the real one refuse (a
bind of a missing source) or fails the sandbox's setup itself, for one rank only (told by the
rank log its stdout is)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.engine.base import AttemptLaunch, AttemptPhase, FailureReason, InstanceLaunch
from corral.engine.local import LocalEngine
from tests.engine.contract import new_attempt_id, wait_finished
from tests.engine.local_support import local_engine_factory
from tests.support import require, require_binary

pytestmark = pytest.mark.isolation
UID = 230_002
GONE = "/nonexistent-corral-bind-source"
REFUSED = f"bwrap: Can't find source path {GONE}: No such file or directory"


@pytest.fixture
def armed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The dir of the fake bwrap's switches: `refuse-<r>` makes rank r's sandbox refuse, after
    rank 0 printed "rank 0 ran" when `after-rank-0` exists too; `setup-oom` makes the setup use
    more than the rank's memory (OOM-killed) and then exit 1; `setup-137` makes it exit 137.
    Unarmed (the engine's probes, other ranks) it is the real bwrap."""
    real = require_binary("bwrap")
    switches, fake = tmp_path / "switches", tmp_path / "bin"
    switches.mkdir()
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\n"
        "log=$(readlink /proc/$$/fd/1); rank=${log##*/rank-}; rank=${rank%.log}\n"
        f'if [ -e "{switches}/setup-oom" ]; then python3 -c "b = bytearray(400 << 20)"; exit 1; fi\n'
        f'if [ -e "{switches}/setup-137" ]; then exit 137; fi\n'
        f'if [ -e "{switches}/refuse-$rank" ]; then\n'
        f'  if [ -e "{switches}/after-rank-0" ]; then\n'
        "    i=0; until grep -q 'rank 0 ran' \"${log%/*}/rank-0.log\" 2>/dev/null || [ $i -gt 400 ]; do\n"
        "      sleep 0.05; i=$((i + 1)); done\n"
        "  fi\n"
        f'  exec {real} --ro-bind {GONE} /mnt "$@"\n'
        "fi\n"
        f'exec {real} "$@"\n'
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    return switches


@pytest.fixture
def engine(tmp_path: Path, armed: Path) -> Iterator[LocalEngine]:
    with local_engine_factory(tmp_path / "home") as make:
        eng = make()
        caps = eng.capabilities()
        require(caps.sandbox and caps.cgroups, "bwrap and cgroups")
        assert eng.status.json_status and eng.status.bwrap == str(armed.parent / "bin" / "bwrap")
        yield eng


def gang(*commands: str, memory_mib: int = 256) -> AttemptLaunch:
    aid = new_attempt_id()
    instances = tuple(
        InstanceLaunch("worker", r, r, "node-a", (), 1.0, memory_mib, command, {"RANK": str(r)})
        for r, command in enumerate(commands)
    )
    return AttemptLaunch(aid, aid.split(".")[0], 1, "alice", "vision", instances, uid=UID)


def run(engine: LocalEngine, launch: AttemptLaunch) -> tuple[object, list[str]]:
    engine.launch(launch)
    status = wait_finished(engine, launch.attempt_id)
    logs = [
        engine.logs(launch.attempt_id, r).data.decode(errors="replace") for r in range(len(launch.instances))
    ]
    return status, logs


def test_a_rank_refused_after_another_ran_is_the_jobs_failure_in_bwraps_words(
    engine: LocalEngine, armed: Path
) -> None:
    """review109 #3: rank 0's command ran (its side effects stand) before rank 1's sandbox was
    refused: re-running the attempt as the platform's loss would repeat them uncharged, so it is
    the job's own failure, and the message says why in bwrap's words."""
    (armed / "refuse-1").touch()
    (armed / "after-rank-0").touch()
    status, logs = run(engine, gang("echo rank 0 ran; sleep 30", "echo rank 1 ran"))
    assert "rank 0 ran" in logs[0] and "rank 1 ran" not in logs[1], logs
    assert status.phase is AttemptPhase.FAILED and status.reason is FailureReason.EXIT_CODE, status
    assert status.exit_code == 1
    assert status.message == (
        f"rank 1: the sandbox did not start the job: {REFUSED}; "
        "rank 0 may have run the job's command, so this is the job's own failure"
    )


def test_a_gang_whose_every_rank_was_refused_is_a_launch_failure(engine: LocalEngine, armed: Path) -> None:
    (armed / "refuse-0").touch()
    (armed / "refuse-1").touch()
    status, logs = run(engine, gang("echo rank 0 ran", "echo rank 1 ran"))
    assert "ran" not in logs[0] + logs[1], logs
    assert status.phase is AttemptPhase.FAILED and status.reason is FailureReason.LAUNCH_FAILED, status
    assert status.exit_code is None
    assert status.message in (f"rank {r}: the sandbox did not start the job: {REFUSED}" for r in (0, 1))


def test_an_oom_kill_during_the_sandboxs_setup_is_oom_not_a_refusal(engine: LocalEngine, armed: Path) -> None:
    """review109 #4: the rank's memory limit reached while its sandbox was being set up (the OOM
    killer's SIGKILL in the rank's cgroup), then bwrap exits with no exit-code line: an OOM, as
    the cgroup says, not a sandbox that refused."""
    (armed / "setup-oom").touch()
    status, logs = run(engine, gang("echo rank 0 ran", memory_mib=96))
    assert "rank 0 ran" not in logs[0], logs
    assert status.phase is AttemptPhase.FAILED and status.reason is FailureReason.OOM, status
    assert status.message == "rank 0 was OOM-killed by the kernel inside its 96 MiB memory limit"


def test_a_sandbox_killed_by_a_signal_during_setup_is_a_signal_not_a_refusal(
    engine: LocalEngine, armed: Path
) -> None:
    """review109 #4: bwrap's monitor exits 128+N when a signal killed the sandbox before its exec;
    bwrap's own refusals exit 1."""
    (armed / "setup-137").touch()
    status, _ = run(engine, gang("echo rank 0 ran"))
    assert status.phase is AttemptPhase.FAILED and status.reason is FailureReason.SIGNAL, status
    assert (status.exit_code, status.message) == (137, "rank 0 was killed by signal 9")
