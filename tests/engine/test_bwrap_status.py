"""Whether a sandbox's command ran, from bwrap's --json-status-fd (corral.engine.isolation.
bwrap_status), with the real bwrap and no engine: the end-to-end cases (a swapped mount, a removed
environment dir, a job's own exit 1) are in tests/isolation/test_mount_race.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from corral.engine.isolation.bwrap_status import hand_over, refusal, with_status_fd
from corral.engine.isolation.sandbox import probe
from tests.support import require_binary


def run_bwrap(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    """bwrap with `args` before its command, as the supervisor's child runs it: (exit code,
    status path, log path)."""
    bwrap = require_binary("bwrap")
    status, log = str(tmp_path / "bwrap-0.status"), str(tmp_path / "rank-0.log")
    argv = with_status_fd([bwrap, "--ro-bind", "/", "/", "--unshare-pid", *args], status)
    with open(log, "wb") as out:
        ready = hand_over(argv, status)
        fd = int(ready[2])
        try:
            done = subprocess.run(ready, stdout=out, stderr=out, pass_fds=(fd,), timeout=10)
        finally:
            os.close(fd)
    return done.returncode, status, log


def test_a_command_that_ran_is_never_a_refusal_whatever_it_printed(tmp_path: Path) -> None:
    says_bwrap = "echo 'bwrap: Race condition binding dirfd' >&2; exit 1"
    code, status, log = run_bwrap(tmp_path, "sh", "-c", says_bwrap)
    assert code == 1 and b'"exit-code": 1' in Path(status).read_bytes()
    assert refusal(status, log, code) is None


def test_a_sandbox_that_did_not_start_is_a_refusal_in_bwraps_words(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    code, status, log = run_bwrap(tmp_path, "--ro-bind", str(gone), "/mnt", "true")
    assert code == 1 and b"child-pid" in Path(status).read_bytes()  # cloned, then refused
    assert refusal(status, log, code) == f"bwrap: Can't find source path {gone}: No such file or directory"


def test_no_status_file_means_bwrap_never_ran_and_the_child_says_why(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_bytes(b"corral supervisor: cannot start instance: [Errno 2] No such file: 'bwrap'\n")
    assert refusal(str(tmp_path / "none.status"), str(log), 127) == (
        "corral supervisor: cannot start instance: [Errno 2] No such file: 'bwrap'"
    )
    log.write_bytes(b"")
    assert refusal(str(tmp_path / "none.status"), str(log), 1) == (
        "bwrap exited with code 1 before starting the job's command"
    )


def test_the_status_fd_goes_only_where_the_argv_holds_its_placeholder(tmp_path: Path) -> None:
    status = str(tmp_path / "s")
    with pytest.raises(ValueError, match=f"no --json-status-fd {status}"):
        hand_over(["bwrap", "--unshare-pid", "--", "true"], status)
    assert not os.path.exists(status)


def test_a_bubblewrap_without_json_status_fd_is_used_and_said_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = require_binary("bwrap")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = --json-status-fd ] && '
        '{ echo "bwrap: Unknown option $a" >&2; exit 1; }; done\n'
        f'exec {real} "$@"\n'
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    status = probe()
    assert status.bwrap == str(fake / "bwrap") and status.bind_fd and not status.json_status
    assert [w for w in status.warnings if "no --json-status-fd" in w and "exit 1, not launch_failed" in w]


def test_a_bubblewrap_whose_status_says_exit_code_for_a_refusal_too_is_not_trusted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """review109 #6: a bubblewrap that wrote the exit-code line without knowing whether the
    command was exec'd would make every refusal read as the job's exit; the probe tries a
    refusal too, expecting no such line, and falls back to the old reading, saying so."""
    real = require_binary("bwrap")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "bwrap").write_text(
        "#!/bin/sh\n"
        '[ "$1" = --json-status-fd ] && fd=$2\n'
        f'{real} "$@"; code=$?\n'
        '[ -n "$fd" ] && echo "{ \\"exit-code\\": $code }" >"/proc/$$/fd/$fd"\n'  # dash: no >&N past 9
        "exit $code\n"
    )
    (fake / "bwrap").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    status = probe()
    assert status.bwrap == str(fake / "bwrap") and status.bind_fd and not status.json_status
    assert [w for w in status.warnings if "does not tell whether the command ran" in w]
