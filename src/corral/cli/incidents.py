"""`corral incident ls/show/ack/comment/mitigate/resolve/close/postmortem` and `corral rules
show/apply/history/runs` (admins). See docs/operations.md, "Incidents" and "Remediation rules"."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, plain, print_json
from corral.sdk import CorralError
from corral.words import plural

incident_app = typer.Typer(help="Incidents: one per fault, with a timeline, SLAs and postmortems.",
                           no_args_is_help=True)  # fmt: skip
rules_app = typer.Typer(
    help="Remediation rules: what Corral does by itself on an alert.", no_args_is_help=True
)
IncidentArg = Annotated[int, typer.Argument(metavar="ID", min=1)]


def _countdown(seconds: float | None, breached: bool = False) -> str:
    """Time left (negative: overdue); once done (None), whether it was done in time."""
    if seconds is None:
        return "missed" if breached else "met"
    sign = "-" if seconds < 0 else ""
    s = abs(int(seconds))
    return f"{sign}{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{sign}{s // 60}m{s % 60:02d}s"


def _due(what: str, seconds: float | None, breached: bool = False) -> str:
    if seconds is None:
        return f"{what} {_countdown(None, breached)}"
    return f"{what} overdue by {_countdown(-seconds)}" if seconds < 0 else f"{what} in {_countdown(seconds)}"


@incident_app.command("ls")
@friendly_errors
def list_incidents(
    state: Annotated[
        str | None, typer.Option(help="triggered|acknowledged|mitigated|resolved|closed")
    ] = None,
    severity: Annotated[str | None, typer.Option(help="SEV1..SEV4")] = None,
    node: Annotated[str | None, typer.Option(help="incidents linked to this node")] = None,
    all_: Annotated[bool, typer.Option("--all", help="closed and resolved ones too")] = False,
    flapping: Annotated[
        bool | None,
        typer.Option(
            "--flapping/--not-flapping", help="only those that flap (reopen too often), or only the others"
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Incidents, newest first (open ones unless --all or --state), with SLA countdowns; STATE
    says `flapping` for one that reopens too often (paged once, not at each reopen)."""
    with client() as c:
        page = c.incidents(
            state=state, severity=severity, node=node, open=not (all_ or state), flapping=flapping
        )
    if output is Output.json:
        print_json(page)
        return
    # The title gets the room: the other columns are as narrow as their values (AGE "20m", not
    # OPENED "20m ago"; ACK and MITIGATE, the time left, not "ACK IN" and "MITIGATE IN"), none cut;
    # at 80 columns TITLE was some 18 wide and a title ran over 3-4 lines.
    table = Table("ID", "SEV", "STATE", "TITLE", "AGE", "ACK", "MITIGATE", "OWNER", box=None, pad_edge=False)
    for number in (0, 1, 4, 5, 6):
        table.columns[number].no_wrap = True
    table.columns[7].overflow = "fold"
    for i in page["items"]:
        sla = i["sla"]
        ack_in, mitigate_in = (
            _countdown(sla["ack_remaining_s"], sla["ack_breached"]),
            _countdown(sla["mitigate_remaining_s"], sla["mitigate_breached"]),
        )
        age = ago(i["opened_at"]).removesuffix(" ago")
        title = i["title"] if len(i["title"]) <= 60 else i["title"][:59] + "…"  # cut, and says so
        shown = f"{i['state']}, flapping" if i.get("flapping") else i["state"]
        table.add_row(str(i["id"]), i["severity"], shown, title, age, ack_in, mitigate_in, i["owner"] or "-")
    if not page["items"]:  # a header alone read as a listing that failed
        which = {None: "", True: "flapping ", False: "non-flapping "}[flapping]
        out.print(
            f"no open {which}incidents (--all: resolved and closed ones too)"
            if not (all_ or state)
            else f"no {which}incidents"
        )
        return
    out.print(table)


@incident_app.command("show")
@friendly_errors
def show_incident(incident_id: IncidentArg, output: OutputOpt = Output.table) -> None:
    """One incident: what it links, its SLAs, its timeline and postmortem."""
    with client() as c:
        i = c.incident(incident_id)
    if output is Output.json:
        print_json(i)
        return
    out.print(
        f"[bold]incident {i['id']}[/bold] {i['severity']} {i['state']}: {plain(i['title'])}", markup=True
    )
    out.print(f"  source {i['source']}, owner {i['owner'] or '-'}, fired {plural(i['fire_count'], 'time')}")
    if i.get("flapping"):
        out.print(f"  flapping (began {ago(i['flapping_since'])}): its reopens page nobody until it is quiet")
    for kind, values in (i["links"] or {}).items():
        if values:
            out.print(f"  {kind}: {', '.join(values)}")
    sla = i["sla"]  # "ack in met" and "ack in -3m05s" read as typos
    out.print(
        f"  SLA: {_due('ack', sla['ack_remaining_s'], sla['ack_breached'])}, "
        f"{_due('mitigate', sla['mitigate_remaining_s'], sla['mitigate_breached'])}"
    )
    for e in i["timeline"]:  # the actor once: not "acknowledged by bob (bob)"
        who = f" ({e['actor']})" if e["actor"] and not e["text"].endswith(f"by {e['actor']}") else ""
        out.print(f"  {ago(e['at']):>10}  {e['kind']:<15} {e['text']}{who}")
    pm = i["postmortem"]
    if pm:
        out.print(f"postmortem by {pm['author']}: {pm['summary']}\n  impact: {pm['impact']}")
        out.print(f"  root cause: {pm['root_cause']}")
        for item in pm["action_items"]:
            out.print(f"  - {item['what']} ({item['owner']}, due {item['due']})")
    elif i["postmortem_required"]:
        out.print("postmortem: required before closing (corral incident postmortem)")


def _act(incident_id: int, action: str, done: str = "", **body: Any) -> None:
    """Print the incident's state after `action`; `done` says what happened first when the state
    alone does not (a comment printed "incident 1: acknowledged")."""
    with client() as c:
        i = c.incident_action(incident_id, action, **body)
    out.print(f"incident {i['id']}: {done} ({i['state']})" if done else f"incident {i['id']}: {i['state']}")


@incident_app.command("ack")
@friendly_errors
def ack(incident_id: IncidentArg) -> None:
    """Acknowledge: stops escalation and meets the ack SLA. The first to acknowledge becomes its
    owner unless it has one; acknowledging it again, by anyone, changes nothing. Prints who
    acknowledged it and who owns it."""
    with client() as c:
        i = c.incident_action(incident_id, "ack")
    # "you own it now" was not so when someone else had acknowledged it first: say who did
    who = f"acknowledged by {i['acknowledged_by']}, owner {i['owner'] or '-'}"
    out.print(f"incident {i['id']}: {who} ({i['state']})")


@incident_app.command("comment")
@friendly_errors
def comment(incident_id: IncidentArg, text: Annotated[str, typer.Argument()]) -> None:
    """Add a comment to the timeline."""
    _act(incident_id, "comment", done="comment added", text=text)


@incident_app.command("mitigate")
@friendly_errors
def mitigate(incident_id: IncidentArg, note: Annotated[str, typer.Option("--note")] = "") -> None:
    """The impact is stopped (the cause may remain)."""
    _act(incident_id, "mitigate", note=note)


@incident_app.command("resolve")
@friendly_errors
def resolve(incident_id: IncidentArg, note: Annotated[str, typer.Option("--note")] = "") -> None:
    """The fault is gone."""
    _act(incident_id, "resolve", note=note)


@incident_app.command("close")
@friendly_errors
def close(incident_id: IncidentArg) -> None:
    """Close a resolved incident (SEV1 and SEV2 need their postmortem)."""
    _act(incident_id, "close")


@incident_app.command("postmortem")
@friendly_errors
def postmortem(
    incident_id: IncidentArg,
    summary: Annotated[str, typer.Option("--summary")],
    impact: Annotated[str, typer.Option("--impact")],
    root_cause: Annotated[str, typer.Option("--root-cause")],
    action: Annotated[
        list[str] | None,
        typer.Option("--action", help="WHAT;OWNER;YYYY-MM-DD, OWNER an active user (repeat for several)"),
    ] = None,
) -> None:
    """Write the postmortem: summary, impact, root cause and action items."""
    items = []
    for raw in action or []:
        parts = [p.strip() for p in raw.split(";")]
        if len(parts) != 3:
            raise CorralError(f"--action {raw!r}: expected WHAT;OWNER;YYYY-MM-DD")
        items.append({"what": parts[0], "owner": parts[1], "due": parts[2]})
    with client() as c:
        c.write_postmortem(
            incident_id, summary=summary, impact=impact, root_cause=root_cause, action_items=items
        )
    out.print(f"incident {incident_id}: postmortem written")


@rules_app.command("show")
@friendly_errors
def show_rules(
    version: Annotated[int | None, typer.Option("--version", min=0)] = None, output: OutputOpt = Output.table
) -> None:
    """Print the active rules file (or an older --version; 0 is the shipped defaults)."""
    with client() as c:
        rules = c.remediation_rules(version)
    if output is Output.json:  # as every read command (README): it had no -o
        print_json(rules)
        return
    out.print(f"# version {rules['version']}", highlight=False)
    print(rules["text"], end="")


@rules_app.command("apply")
@friendly_errors
def apply_rules(file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)]) -> None:
    """Make FILE the active rules (a new version); a refused file names its line and the active
    version stays."""
    with client() as c:
        version = c.apply_remediation_rules(file.read_text())["version"]
    out.print(f"rules version {version} active")


@rules_app.command("history")
@friendly_errors
def rules_history(output: OutputOpt = Output.table) -> None:
    """Every applied version: who and when."""
    with client() as c:
        rows = c.remediation_history()
    if output is Output.json:
        print_json(rows)
        return
    if not rows:  # a header alone read as a listing that failed half-way
        out.print("no rules applied yet: version 0 (the shipped defaults) is active")
        return
    table = Table("VERSION", "BY", "APPLIED", box=None)
    for r in rows:
        table.add_row(str(r["version"]), r["author"], ago(r["created_at"]))
    out.print(table)


@rules_app.command("runs")
@friendly_errors
def rules_runs(
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 20, output: OutputOpt = Output.table
) -> None:
    """The latest rule runs (dry runs too): what each did or would have done."""
    with client() as c:
        rows = c.remediation_runs(limit)
    if output is Output.json:
        print_json(rows)
        return
    if not rows:
        out.print("no rule has run yet: rules run when an alert or event matches them")
        return
    # The rule and signal never cut (the signal was "CorralGpuEccErro…" at 80 columns), one action a line.
    table = Table("WHEN", "RULE", "SIGNAL", "OUTCOME", "INCIDENT", "ACTIONS", box=None)
    table.columns[1].no_wrap = table.columns[2].no_wrap = True
    table.columns[5].overflow = "fold"
    for r in rows:
        actions = "\n".join(f"{a['action']}: {a['result']}" for a in r["actions"])
        table.add_row(
            ago(r["at"]),
            r["rule"],
            r["signal"],
            r["outcome"],
            str(r["incident_id"] or "-"),
            actions,
        )
    out.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(incident_app, name="incident")
    app.add_typer(rules_app, name="rules")
