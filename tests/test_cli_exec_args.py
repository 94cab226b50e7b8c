"""`corral exec`'s options may follow the job id, as docs/workspaces.md writes them: `corral exec
42 --rank 1 -- bash`, `corral exec 42 -T -- cat < data.csv`. The command was registered with
interspersed options off, so everything after the job id was the command: `--rank 1` and `-T` were
run in the sandbox (`/usr/bin/env: '--rank': No such file or directory`, exit 127)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from corral.cli import sandbox
from corral.cli.main import app


class _Session:
    def __enter__(self) -> _Session:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _Client:
    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self.calls = calls

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def exec_session(self, job_id: int, argv: list[str], **kw: Any) -> _Session:
        self.calls.append({"job": job_id, "argv": argv, **kw})
        return _Session()


@pytest.mark.parametrize(
    ("args", "argv", "rank", "tty"),
    [
        (["42", "--rank", "1", "--", "bash"], ["bash"], 1, False),
        (["42", "-T", "--", "cat"], ["cat"], 0, False),
        (["--rank", "2", "42", "--", "sh", "-c", "exit 3"], ["sh", "-c", "exit 3"], 2, False),
        (["42", "-t", "--", "ls", "--", "-la"], ["ls", "--", "-la"], 0, True),
        (["42", "--", "nvidia-smi", "-L"], ["nvidia-smi", "-L"], 0, False),
    ],
)
def test_options_after_the_job_id_are_options_and_the_command_follows_the_separator(
    monkeypatch: pytest.MonkeyPatch, args: list[str], argv: list[str], rank: int, tty: bool
) -> None:
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(sandbox, "client", lambda: _Client(calls))
    monkeypatch.setattr(sandbox, "_interactive", lambda session: 0)  # no terminal under the runner,
    monkeypatch.setattr(sandbox, "_piped", lambda session: 0)  # nor a stdin with a descriptor
    result = CliRunner().invoke(app, ["exec", *args])
    assert result.exit_code == 0, result.output
    assert [(c["job"], c["argv"], c["rank"], c["tty"]) for c in calls] == [(42, argv, rank, tty)]
