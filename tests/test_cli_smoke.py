import os
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

import corral
from corral.cli.main import app


def test_root_help_lists_command_areas() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "Corral" in result.output


def test_each_command_group_is_registered_once() -> None:
    # Two modules each added a `storage` group: the second hid the first, so `corral storage ids`
    # (README, docs/storage.md) was "No such command 'ids'".
    names = [group.name for group in app.registered_groups]
    assert sorted(n for n in names if names.count(n) > 1) == []
    result = CliRunner().invoke(app, ["storage", "--help"])
    assert result.exit_code == 0 and all(c in result.output for c in ("usage", "quota", "ids"))


def test_python_dash_m_corral_runs_the_corral_command() -> None:
    """There was no `python -m corral` (no corral/__main__.py): an environment whose scripts
    directory is not on PATH had no way to run the CLI by the package's name."""
    env = {**os.environ, "PYTHONPATH": str(Path(corral.__file__).parent.parent), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "corral", "--help"], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert "Usage: corral [OPTIONS] COMMAND" in result.stdout, result.stdout  # not "python -m corral"
    for command in ("submit", "show", "ws", "audit", "usage"):
        assert f"│ {command} " in result.stdout, (command, result.stdout)
