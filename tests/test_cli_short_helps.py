"""What a command group's --help lists for each command (the first paragraph of its help) is a
whole sentence: `corral oncall schedule --help` listed `set` as "Create or replace a schedule
(admins) from a YAML file, e.g." and stopped there. And the example `oncall schedule set --help`
gives is one a new server accepts: its fallback user was `root`, which no Corral server has."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
import yaml

from corral.cli.main import app


def _commands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_listed_summary_is_a_whole_sentence() -> None:
    cut = {}
    for where, command in _commands(typer.main.get_command(app), ("corral",)):
        first = " ".join((command.help or "").split("\n\n")[0].split())
        if first.endswith(("e.g.", "e.g.,", ":", ",", " such as", " like")):
            cut[where] = first
    assert cut == {}


def test_the_schedule_example_names_the_admin_a_server_has() -> None:
    command = typer.main.get_command(app).commands["oncall"].commands["schedule"].commands["set"]
    example = command.help.split("\b\n", 1)[1].replace("\\[", "[")
    spec = yaml.safe_load(example)
    assert spec["fallback_user"] == "admin" and spec["layers"][0]["members"] == ["alice", "bob"]


def test_every_option_of_the_data_and_catalogue_commands_says_what_it_is() -> None:
    # `corral model share --help` listed `--group <str>` and nothing more (whose group? its
    # default?); so did template share, data import, model register's --framework and
    # --code-checksum, template publish --description, and model pull's DIRECTORY.
    root = typer.main.get_command(app)
    silent = [
        f"{group} {name} {param.name}"
        for group in ("data", "storage", "template", "model", "env", "job")
        for name, command in root.commands[group].commands.items()  # type: ignore[attr-defined]
        for param in command.params
        if param.name not in ("help", "name") and not getattr(param, "help", None)
    ]
    assert silent == []


def test_an_option_shared_by_commands_says_what_it_does_in_each() -> None:
    # `corral metrics --all-users` said "every user's jobs you may act on" (cancel's words) while
    # metrics only reads what the caller can see; `corral secret ls --group` said "set/rm: group
    # admins and admins", which is about writing a group's secret, not listing them.
    root = typer.main.get_command(app)

    def option_help(*path: str, option: str) -> str:
        command = root
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        return next(str(getattr(p, "help", "")) for p in command.params if option in getattr(p, "opts", ()))

    assert "act on" in option_help("cancel", option="--all-users")
    assert option_help("metrics", option="--all-users") == "with -l: every job you can see"
    assert option_help("metrics", option="--user") == "with -l: that user's jobs you can see"
    assert "set/rm" in option_help("secret", "rm", option="--group")
    listing = option_help("secret", "ls", option="--group")
    assert listing.startswith("list only this group's secrets") and "set/rm" not in listing
