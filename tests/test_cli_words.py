"""Counts in the CLI's messages read as English: "1 file", "2 files", never "1 files" or "file(s)"."""

from __future__ import annotations

import re
from pathlib import Path

import corral.cli
from corral.cli.words import plural


def test_plural_is_singular_for_exactly_one() -> None:
    assert [plural(n, "file") for n in (0, 1, 2)] == ["0 files", "1 file", "2 files"]
    assert (
        plural(1.0, "CPU") == "1 CPU" and plural(0.5, "CPU") == "0.5 CPUs" and plural(2.0, "CPU") == "2 CPUs"
    )
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"
    assert plural(1_000_000, "byte") == "1000000 bytes"  # an int as written, not 1e+06


def test_no_cli_message_counts_with_a_parenthesised_plural() -> None:
    """'1 node(s)', '1 alert(s)', '1 step(s)' and 'fired 1 time(s)' were printed: counts go
    through `plural`, so no CLI source says "(s)" in a message."""
    sources = Path(corral.cli.__file__).parent.glob("*.py")
    offenders = [
        f"{path.name}:{number}"
        for path in sources
        if path.name != "words.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"[}\d] [a-z]+\(s\)", line)  # "{n} node(s)", not a call such as "parse_step(s)"
    ]
    assert offenders == []
