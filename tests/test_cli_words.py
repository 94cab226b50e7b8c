"""Counts in messages (the CLI's, the server's, the scheduler's, the portal's) read as English:
"1 file", "2 files", never "1 files" or "file(s)"."""

from __future__ import annotations

import re
from pathlib import Path

import corral.cli
from corral.words import plural


def test_plural_is_singular_for_exactly_one() -> None:
    assert [plural(n, "file") for n in (0, 1, 2)] == ["0 files", "1 file", "2 files"]
    assert (
        plural(1.0, "CPU") == "1 CPU" and plural(0.5, "CPU") == "0.5 CPUs" and plural(2.0, "CPU") == "2 CPUs"
    )
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"
    assert plural(1_000_000, "byte") == "1000000 bytes"  # an int as written, not 1e+06


def test_no_message_counts_with_a_parenthesised_plural() -> None:
    """'1 node(s)', '1 alert(s)', '1 step(s)' and 'fired 1 time(s)' were printed by the CLI, and
    '1 job(s)', '2 round(s)', 'dropped out 1 time(s)' by the services, the monitor and the portal:
    counts go through `plural` (the portal's JS by hand), so no source says "(s)" in a message."""
    root = Path(corral.cli.__file__).parent.parent
    sources = [*root.rglob("*.py"), *(root / "web").rglob("*.js")]
    offenders = [
        f"{path.relative_to(root)}:{number}"
        for path in sources
        if path.name != "words.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        # "{n} node(s)", "{n} new uncorrectable ECC error(s)"; not a call such as "parse_step(s)"
        if re.search(r"[}\d] (?:[A-Za-z]+ ){0,3}(?!https?\b)[A-Za-z]+\(s\)", line)
    ]
    assert offenders == []
