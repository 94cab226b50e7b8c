"""`corral ws rm nb -u alice` (an admin removing alice's workspace) told the admin "your files stay
in your home": they are alice's, in hers."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from corral.cli import workspaces
from corral.cli.main import app


class _Client:
    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def remove_workspace(self, name: str, *, user: str | None = None) -> Any:
        return None


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["nb", "-u", "alice"], "workspace nb removed (alice's files stay in their home)"),
        (["nb"], "workspace nb removed (your files stay in your home)"),
    ],
)
def test_ws_rm_says_whose_files_stay(monkeypatch: pytest.MonkeyPatch, args: list[str], said: str) -> None:
    monkeypatch.setattr(workspaces, "client", lambda: _Client())
    result = CliRunner().invoke(app, ["ws", "rm", *args], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and said in result.output, result.output
