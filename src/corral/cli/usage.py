"""`corral usage`: GPU-hours and CPU-hours per user or group over a period (table, CSV or JSON)."""

from __future__ import annotations

import csv
import re
import sys
import time
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import client, friendly_errors, out, print_json, when
from corral.sdk import CorralError

RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhdw])$")
UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
CSV_COLUMNS = ("gpu_hours", "cpu_hours", "jobs", "attempts")


class UsageOutput(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


class By(StrEnum):
    user = "user"
    group = "group"


def parse_time(text: str, now: float, option: str) -> float:
    """`7d` / `12h` / `30m` ago, an ISO date or date-time (local time), or unix seconds; a refusal
    names the `option` it was given to (of --since and --until, which one was wrong)."""
    text = text.strip()
    match = RELATIVE.match(text)
    if match:
        return now - float(match.group(1)) * UNIT_S[match.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise CorralError(
            f"{option}: cannot read {text!r} as a time: use e.g. 7d, 12h (ago), 2026-11-01, "
            "2026-11-01T08:00 or unix seconds"
        ) from None


def write_csv(report: dict[str, Any]) -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow([report["by"], *CSV_COLUMNS])
    for row in report["rows"]:
        writer.writerow(
            [row["name"], f"{row['gpu_hours']:.4f}", f"{row['cpu_hours']:.4f}", row["jobs"], row["attempts"]]
        )


@friendly_errors
def usage(
    since: Annotated[
        str | None, typer.Option(help="start: 7d (ago), 2026-11-01, ...; default 30 days before --until")
    ] = None,
    until: Annotated[str | None, typer.Option(help="end (same forms); default now")] = None,
    by: Annotated[By, typer.Option("--by", help="one row per user or per group")] = By.user,
    output: Annotated[
        UsageOutput, typer.Option("--output", "-o", help="table, csv or json")
    ] = UsageOutput.table,
) -> None:
    """GPU-hours and CPU-hours per user or group over a period, from the jobs' attempts.
    Members see their own, group admins their groups', admins everyone's."""
    now = time.time()
    with client() as c:
        report = c.usage(
            since=None if since is None else parse_time(since, now, "--since"),
            until=None if until is None else parse_time(until, now, "--until"),
            by=by.value,
        )
    if output is UsageOutput.json:
        print_json(report)
        return
    if output is UsageOutput.csv:
        write_csv(report)
        return
    table = Table(by.value.upper(), "GPU-HOURS", "CPU-HOURS", "JOBS", "ATTEMPTS", box=None)
    for row in [*report["rows"], report["total"]]:
        table.add_row(
            row["name"],
            f"{row['gpu_hours']:,.2f}",
            f"{row['cpu_hours']:,.2f}",
            str(row["jobs"]),
            str(row["attempts"]),
        )
    out.print(f"usage from {when(report['since'])} to {when(report['until'])}")
    out.print(table)


def register(app: typer.Typer) -> None:
    app.command()(usage)
