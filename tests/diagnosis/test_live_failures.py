"""Failures explain themselves, with real job processes on a real server (local engine)."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.server_fixture import CorralServer, start_server, submit_spec, wait_state
from tests.server_fixture import get_job as job

TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    srv = start_server(tmp_path_factory.mktemp("diag") / "home")
    try:
        yield srv
    finally:
        srv.stop()


def submit(c: httpx.Client, command: str, *, retries: int = 0, gpus: int = 1) -> int:
    spec = {
        "name": "diag",
        "retries": retries,
        "tasks": {"main": {"command": command, "resources": {"gpus": gpus}}},
    }
    return submit_spec(c, spec)


def python(code: str) -> str:
    return f"python3 -c {code!r}"


def test_an_import_error_is_a_user_error_and_not_retried_despite_retries(server: CorralServer) -> None:
    with server.client() as c:
        job_id = submit(c, python("import corral_no_such_module_xyz"), retries=3)
        done = wait_state(c, job_id, TERMINAL, timeout_s=30)
        assert done["state"] == "failed", done
        assert len(done["attempts"]) == 1, "a user error was retried"
        (attempt,) = done["attempts"]
        assert attempt["reason"] == "user_error"
        failure = attempt["failure"]
        assert failure["category"] == "user"
        assert "ModuleNotFoundError" in failure["evidence"]
        assert "Install the missing package" in failure["fix"]
        assert "not retryable: user_error" in done["reason"]


def test_a_cuda_oom_message_gives_reason_cuda_oom_with_the_fix(server: CorralServer) -> None:
    code = (
        "import sys; print('step 1', flush=True); "
        "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB', file=sys.stderr); "
        "sys.exit(1)"
    )
    with server.client() as c:
        job_id = submit(c, python(code), retries=2)
        done = wait_state(c, job_id, TERMINAL, timeout_s=30)
        assert done["state"] == "failed", done
        (attempt,) = done["attempts"]
        assert attempt["reason"] == "cuda_oom" and attempt["exit_code"] == 1
        assert attempt["failure"]["category"] == "user"
        assert "batch size" in attempt["failure"]["fix"]
        events = [e["message"] for e in job(c, job_id)["events"] if e["kind"] == "diagnosis"]
        assert any("cuda_oom" in m and "Fix:" in m for m in events), events
