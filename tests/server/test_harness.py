"""The test harness keeps its promise: in CI a server runs jobs sandboxed or does not start."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server_harness import server_env, start_server
from tests.support import in_ci


@pytest.mark.parametrize(
    ("value", "expected"),
    [("true", True), ("1", True), ("yes", True), ("TRUE", True), (" Yes ", True), ("", False),
     ("0", False), ("false", False), ("no", False)],
)  # fmt: skip
def test_ci_is_recognised_however_it_is_spelled(value: str, expected: bool) -> None:
    assert in_ci({"CI": value}) is expected
    assert in_ci({}) is False


def test_servers_may_run_unsandboxed_only_outside_ci(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def allowed() -> str:
        env = server_env(tmp_path, database_url=None, virtual_gpus=0, extra_env=None)
        return env["CORRAL_ALLOW_UNISOLATED"]

    monkeypatch.setenv("CORRAL_ALLOW_UNISOLATED", "true")  # never inherited from the caller
    for ci in ("1", "true", "yes"):
        monkeypatch.setenv("CI", ci)
        assert allowed() == "false"
    monkeypatch.setenv("CI", "false")
    assert allowed() == "true"
    monkeypatch.delenv("CI")
    assert allowed() == "true"
    strict = server_env(tmp_path, database_url=None, virtual_gpus=0, extra_env=None, allow_unisolated=False)
    assert strict["CORRAL_ALLOW_UNISOLATED"] == "false"


def test_a_server_without_isolation_fails_to_start_naming_what_is_missing(tmp_path: Path) -> None:
    """What CI gets on a machine without bubblewrap: no server, and the reason (here bwrap is
    hidden from the server's PATH)."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    with pytest.raises(RuntimeError, match=r"refuses to run jobs unsandboxed .*bubblewrap \(bwrap\) is not"):
        start_server(
            tmp_path / "home", virtual_gpus=0, extra_env={"PATH": str(empty)}, allow_unisolated=False
        )
