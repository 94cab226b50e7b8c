"""`corral sim --from-cluster`: fetch the platform's job history (admins), replay it under the
cluster's current settings and under a changed policy or changed quotas, and show each group's
queueing under both. The logic is in corral.sim.whatif; this module talks to the server (SDK) and
prints."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
import yaml
from rich.console import Console
from rich.table import Table

from corral.sdk import CorralError
from corral.words import plural

if TYPE_CHECKING:
    from corral.sim.whatif import QuotaChange


@dataclass(frozen=True, slots=True)
class LiveRequest:
    since: str
    anonymise: bool
    unfinished: bool
    policy: str | None  # None: the cluster's current policy
    placement: str | None  # None: the policy's own
    quotas: Sequence[str]
    save_trace: Path | None
    out: Path | None
    output: str  # table or json


def _fetch(request: LiveRequest) -> dict[str, Any]:
    from corral.cli.common import client

    try:
        with client() as c:
            return c.sim_export(
                since=request.since, anonymise=request.anonymise, unfinished=request.unfinished
            )
    except CorralError as exc:
        typer.echo(f"error: {exc.message}", err=True)
        raise typer.Exit(1)


def _save(export: dict[str, Any], trace: Any, trace_path: Path, cluster_path: Path) -> None:
    from corral.sim.trace import write_generic_csv

    trace_path.parent.mkdir(parents=True, exist_ok=True)
    write_generic_csv(trace.jobs, trace_path)
    # the server's knobs go with the cluster, so that the saved trace replays as --from-cluster does
    cluster = {**export["cluster"], "policy_knobs": dict(export.get("policy_knobs") or {})}
    cluster_path.write_text(yaml.safe_dump(cluster, sort_keys=False), encoding="utf-8")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _delta(value: float | None, hours: bool = False) -> str:
    if value is None:
        return "-"
    shown = value / 3600 if hours else value
    text = f"{shown:+,.2f}" if hours else f"{shown:+,.0f}"
    colour = "green" if value < 0 else "red" if value > 0 else "white"
    return f"[{colour}]{text}[/{colour}]"


def group_table(rows: Sequence[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    headers = (
        "group",
        "jobs",
        "live avg queue s",
        "avg queue s now",
        "changed",
        "delta",
        "p99 queue s now",
        "changed",
        "delta",
        "avg JCT h now",
        "changed",
        "delta",
        "rejected now/changed",
    )
    for header in headers:
        table.add_column(header, justify="left" if header == "group" else "right")
    for r in rows:
        jct_now, jct_changed = r["avg_jct_s_current"], r["avg_jct_s_changed"]
        table.add_row(
            r["group"],
            str(r["jobs"]),
            _seconds(r["live_avg_queue_s"]),
            _seconds(r["avg_queue_s_current"]),
            _seconds(r["avg_queue_s_changed"]),
            _delta(r["avg_queue_s_delta"]),
            _seconds(r["p99_queue_s_current"]),
            _seconds(r["p99_queue_s_changed"]),
            _delta(r["p99_queue_s_delta"]),
            "-" if jct_now is None else f"{jct_now / 3600:,.2f}",
            "-" if jct_changed is None else f"{jct_changed / 3600:,.2f}",
            _delta(r["avg_jct_s_delta"], hours=True),
            f"{r['rejected_current']}/{r['rejected_changed']}",
        )
    return table


def run_from_cluster(request: LiveRequest, config: Any, knobs: dict[str, Any], console: Console) -> None:
    """Fetch, replay under the current settings and under the changed ones (policy, placement,
    quotas, knobs: the changed replay only), print; once when nothing changes. Bad input exits 2
    with one line; a refusal by the server (not an admin, bad --since) exits 1."""
    from corral.sim.metrics import summarize
    from corral.sim.report import write_plots
    from corral.sim.runner import PolicyError, resolve_policy, simulate
    from corral.sim.whatif import (
        WhatIfError,
        apply_quota_changes,
        compare_groups,
        from_export,
        parse_quota_change,
        rejection_notes,
        resolve_quota_changes,
    )

    try:
        changes = [parse_quota_change(q) for q in request.quotas]  # bad syntax: before any request
        # a policy, placement or knob that does not exist: before the request and the first replay
        resolve_policy(f"{request.policy or 'default'}:{request.placement or ''}".rstrip(":"), knobs)
    except (WhatIfError, PolicyError) as exc:
        _fail(str(exc))
    export = _fetch(request)
    try:
        trace, cluster = from_export(export)
        changes = resolve_quota_changes(cluster, changes)
        changed_cluster = apply_quota_changes(cluster, changes)
    except WhatIfError as exc:
        _fail(str(exc))
    if request.save_trace:
        cluster_path = request.save_trace.with_suffix(".cluster.yaml")
        _save(export, trace, request.save_trace, cluster_path)
        typer.echo(f"wrote {request.save_trace} ({plural(len(trace.jobs), 'job')}) and {cluster_path}")
        typer.echo(f"replay: corral sim --trace {request.save_trace} --cluster {cluster_path}")
        return
    current_policy, new_policy, described = _what_changes(request, export, changes, knobs)
    try:
        live_knobs = dict(export.get("policy_knobs") or {})  # what the server sets beyond the profile
        current = simulate(trace, cluster, current_policy, config, live_knobs)
        changed = (
            simulate(trace, changed_cluster, new_policy, config, live_knobs | knobs) if described else current
        )
        _refuse_if_nothing_ran(current, changed, described, export)
    except PolicyError as exc:
        _fail(str(exc))
    label_now = f"current ({current_policy})"
    label_changed = "changed (" + "; ".join(described) + ")" if described else "changed (nothing)"
    summaries = [summarize(current), summarize(changed)]
    for summary, label in zip(summaries, (label_now, label_changed), strict=True):
        summary["policy"] = label
    short = (f"current: {current_policy}", f"changed: {new_policy}")  # the wide table's first column
    rows = compare_groups(current, changed, export)
    if request.out:
        out = request.out
        _save(export, trace, out / "trace.csv", out / "cluster.yaml")
        report = {"changes": described, "groups": rows, "summaries": summaries, "notes": export["notes"]}
        (out / "whatif.json").write_text(json.dumps(report, indent=2))
        current.policy, changed.policy = label_now, label_changed  # the plots' legend
        for path in write_plots([current, changed] if described else [current], out):
            typer.echo(f"wrote {path}", err=True)
    if request.output == "json":
        typer.echo(json.dumps({"changes": described, "groups": rows, "summaries": summaries}))
        return
    title = (
        f"{plural(len(trace.jobs), 'job')} since {export_when(export)} on {plural(cluster.total_gpus, 'GPU')}"
    )
    tables = [s | {"policy": label} for s, label in zip(summaries, short, strict=True)]
    notes = [*export["notes"], *current.notes, *rejection_notes(rows)]
    _print_comparison(console, title, tables, rows, described, notes)


def _refuse_if_nothing_ran(
    current: Any, changed: Any, described: Sequence[str], export: dict[str, Any]
) -> None:
    """Every job of the window rejected in the replay asked about (the nodes they ran on gone or
    replaced, say): the what-if compared two tables of zeros. Refused, with the first reasons of
    that replay: the changed one when something changes, which may run jobs the current settings
    reject (a quota raised, another policy: exactly the question asked; review110 #4), so a
    what-if is refused only when neither replay runs a job."""
    if current.jobs or changed.jobs:
        return
    example: dict[str, str] = {}  # the first job of each reason
    for job, why in changed.rejected:
        example.setdefault(why, job.job_id)
    shown = "; ".join(f"{job}: {why}" for why, job in list(example.items())[:3])
    count = len(changed.rejected)
    which, verb = ("the only job", "cannot") if count == 1 else (f"none of the {count:,} jobs", "can")
    where = f"the cluster as it is now ({plural(current.total_gpus, 'GPU')})"
    if described:
        where += f", nor with the changes asked for ({'; '.join(described)}); with them, e.g."
    else:
        where += "; e.g."
    _fail(f"{which} since {export_when(export)} {verb} run on {where} {shown}")


def _what_changes(
    request: LiveRequest, export: dict[str, Any], changes: Sequence[QuotaChange], knobs: dict[str, Any]
) -> tuple[str, str, list[str]]:
    """The server's policy, the one the changed replay runs under (--policy, --placement), and
    each change in words (policy, quotas, knobs; empty when nothing changes)."""
    current_policy = str(export.get("policy") or "default")
    new_policy = request.policy or current_policy
    if request.placement:
        new_policy = f"{new_policy}:{request.placement}"
    described = [c.describe() for c in changes]
    if new_policy != current_policy:
        described.insert(0, f"policy {new_policy}")
    described += [f"knob {name}={value}" for name, value in knobs.items()]
    return current_policy, new_policy, described


def _print_comparison(
    console: Console,
    title: str,
    summaries: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    described: list[str],
    notes: list[str],
) -> None:
    """The what-if as tables: the changes, current vs changed overall and per group, the notes."""
    from corral.sim.report import compare_table

    console.print(f"changes: {'; '.join(described) or 'none'}", markup=False)
    console.print(compare_table(summaries, title))
    console.print(group_table(rows, "per group: queueing and JCT, current settings vs changed"))
    for note in notes:
        console.print(f"note: {note}", markup=False)
    if not described:
        console.print(
            "note: nothing changed (give --policy or --quota): both columns are the current settings"
        )


def export_when(export: dict[str, Any]) -> str:
    from corral.sim.whatif import utc_time

    return utc_time(export.get("since"))


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
