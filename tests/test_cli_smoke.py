from typer.testing import CliRunner

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
