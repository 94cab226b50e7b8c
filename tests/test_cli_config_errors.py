"""A bad server URL, token or CLI config file is one line naming it and exit code 1, never a
traceback (no server needed: each fails before a request is sent)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ({"CORRAL_URL": "http://[::1", "CORRAL_TOKEN": "t"}, None, "bad Corral server URL 'http://[::1'"),
        ({"CORRAL_URL": "http://h:x", "CORRAL_TOKEN": "t"}, None, "Invalid port: 'x'"),
        ({"CORRAL_TOKEN": "caf\u00e9"}, None, "the API token (CORRAL_TOKEN or"),
        ({"CORRAL_TOKEN": "abc\ndef"}, None, "the API token (CORRAL_TOKEN or"),
        ({}, "url: http://127.0.0.1:1\ntoken: [unclosed\n", "config.yaml is not valid YAML"),
    ],
)
def test_a_bad_url_token_or_config_is_one_line_naming_it(
    tmp_path: Path, env: dict[str, str], config: str | None, expected: str
) -> None:
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)
    full_env = {"CORRAL_HOME": str(tmp_path), "CORRAL_URL": "", "CORRAL_TOKEN": "", **env}
    result = CliRunner().invoke(app, ["ls"], env=full_env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1
    assert "error:" in result.output and expected in " ".join(result.output.split())
