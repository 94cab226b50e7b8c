"""`corral doctor`'s table at 80 columns gives each detail and fix whole: a long path, URL or
`<file>:<line>:` was cut with an ellipsis ("/home/corral/monito…"), which lost the very line
number docs/metrics.md promises doctor prints for a bad monitor.yml."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli import common
from corral.cli.main import app as cli
from corral.config import Settings
from corral.ops.doctor import run_checks


def column(out: str, index: int) -> str:
    """The text of one column of a Rich box table, its lines run together without blanks."""
    cells = [line.split("│")[index] for line in out.splitlines() if line.count("│") >= index + 1]
    return "".join("".join(cells).split())


def test_a_bad_monitor_config_is_named_with_its_line_at_80_columns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "a-rather-long-home-directory-name-for-corral" / "home"
    home.mkdir(parents=True, mode=0o700)
    (home / "monitor.yml").write_text("channels:\n  - name: x\n    type: email\n    smtp_port: nope\n")
    monkeypatch.setenv("CORRAL_HOME", str(home))
    monkeypatch.setenv("CORRAL_DATABASE_URL", f"sqlite:///{home}/corral.db")
    monkeypatch.setattr(common.out, "_width", 80)  # _width: see tests/api/test_cli_tables.py
    checks = {c.name: c for c in run_checks(Settings())}
    monitor = checks["monitor config"]
    assert (
        monitor.status == "fail" and f"{home}/monitor.yml:2: channels.0.email.smtp_host" in monitor.detail
    ), monitor.detail
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 1, result.output
    assert "…" not in result.output and max(len(line) for line in result.output.splitlines()) <= 80
    for check in checks.values():
        assert "".join(check.detail.split()) in column(result.output, 3), check.name
        assert "".join((check.fix or "").split()) in column(result.output, 4), check.name
