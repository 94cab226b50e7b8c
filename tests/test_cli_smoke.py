from typer.testing import CliRunner

from corral.cli.main import app


def test_root_help_lists_command_areas() -> None:
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "Corral" in result.output
