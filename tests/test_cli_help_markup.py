"""Every `--help` text shows what its docstring and option helps say. Typer renders them as Rich
markup, where a bracket that starts with a lower-case letter is a tag: it vanished from the help
instead of being printed (`corral oncall schedule set --help` showed `members:` without
`[alice, bob]`, `corral env create --help` "a pyproject.toml whose dependencies to use" without
`[project]`, `corral template use --help` "(NAME)" for `NAME[@V]`). Such brackets are written
`\\[` in the source."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from rich.markup import render
from typer.testing import CliRunner

from corral.cli.main import app


def _helps(command: Any, path: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    yield " ".join(path), command.help or ""
    for param in getattr(command, "params", []):
        yield f"{' '.join(path)} {param.name}", getattr(param, "help", None) or ""
    for name, sub in getattr(command, "commands", {}).items():
        yield from _helps(sub, (*path, name))


def test_no_help_text_loses_a_bracket_to_rich_markup() -> None:
    lost = {}
    for where, text in _helps(typer.main.get_command(app), ("corral",)):
        shown = render(text).plain  # (Rich drops Click's \b "keep this paragraph" mark too)
        if shown != text.replace("\\[", "[").replace("\b", ""):
            lost[where] = (text, shown)
    assert lost == {}


def test_the_schedule_example_shows_its_members() -> None:
    result = CliRunner().invoke(app, ["oncall", "schedule", "set", "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0 and "members: [alice, bob]" in result.output, result.output


def _commands(command: Any, path: tuple[str, ...]) -> Iterator[tuple[str, Any]]:
    yield " ".join(path), command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_command_says_what_it_does() -> None:
    """`corral oncall schedule --help` listed ls, rm and rm-override with no word of what they do
    (likewise `oncall policy ls|rm`, `oncall contact ls|email|add|rm`, `model share`)."""
    silent = [
        where
        for where, c in _commands(typer.main.get_command(app), ("corral",))
        if not (c.help or "").strip()
    ]
    assert silent == []


def test_help_breaks_lines_where_the_terminal_ends_not_where_the_docstring_did() -> None:
    """Typer's Rich help kept a docstring's line breaks inside a paragraph: `corral --help`
    broke "why" after "its place in the scheduler's order, its" and `corral secret set --help`
    after "(one trailing newline dropped),". Paragraphs are one line each now (those marked \\b,
    printed as written, excepted)."""
    broken = [
        where
        for where, c in _commands(typer.main.get_command(app), ("corral",))
        for paragraph in (c.help or "").split("\n\n")
        if "\n" in paragraph and not paragraph.startswith("\b")
    ]
    assert broken == []
    wide = {"COLUMNS": "200"}
    shown = CliRunner().invoke(app, ["--help"], env=wide).output
    assert "its place in the scheduler's order, its estimated start with its uncertainty" in shown, shown
    shown = CliRunner().invoke(app, ["secret", "set", "--help"], env=wide).output
    assert "stdin (one trailing newline dropped), else a hidden prompt." in shown, shown
    shown = CliRunner().invoke(app, ["oncall", "schedule", "set", "--help"], env=wide).output
    lines = [line.strip() for line in shown.splitlines()]  # the \b example keeps its lines
    assert "time_zone: Europe/Berlin" in lines and "- name: primary" in lines, shown
