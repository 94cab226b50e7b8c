"""`corral oncall`: who is on call, schedules, escalation policies, pages and contact methods
(docs/operations.md, "On-call", "Escalation", "Notifications")."""

from __future__ import annotations

from datetime import UTC, date, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.table import Table

from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, plain, print_json
from corral.sdk import CorralError
from corral.words import plural
from corral.yaml_lines import safe_load

oncall_app = typer.Typer(
    help="On-call: who is on call, schedules, escalation policies, pages.", no_args_is_help=True
)
schedule_app = typer.Typer(
    help="On-call schedules: rotation layers, overrides, iCal feed.", no_args_is_help=True
)
policy_app = typer.Typer(help="Escalation policies: ordered steps, wait, repeat.", no_args_is_help=True)
contact_app = typer.Typer(
    help="Where pages and job notifications reach a person: email, webhook, Slack/Mattermost.",
    no_args_is_help=True,
)
feed_app = typer.Typer(
    help="A schedule's calendar subscription URL (no login): shown to admins and its members.",
    no_args_is_help=True,
)
oncall_app.add_typer(schedule_app, name="schedule")
oncall_app.add_typer(policy_app, name="policy")
oncall_app.add_typer(contact_app, name="contact")
oncall_app.add_typer(feed_app, name="feed")


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M UTC")


def parse_time(text: str) -> float:
    """Unix seconds, or an ISO time (with an offset; without one, UTC)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise CorralError(f"{text!r} is neither unix seconds nor an ISO time like 2026-10-24T20:00+02:00")
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


def read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = safe_load(path.read_text())
    except OSError as exc:
        raise CorralError(f"cannot read {path}: {exc.strerror}")
    except yaml.YAMLError as exc:
        raise CorralError(f"{path}: not YAML: {exc}")
    if not isinstance(data, dict):
        raise CorralError(f"{path}: expected a mapping (time_zone, layers, ...) at the top")
    return _plain(data, path, "")


def _plain(value: Any, path: Path, where: str) -> Any:
    """YAML's typed values as the JSON the server reads: an unquoted `start_date: 2026-11-02` is
    a date to YAML (JSON has none, so sending it failed with a traceback), and an unquoted
    `handoff: 10:00` is the number 600 (YAML 1.1's base 60), which is refused by name here."""
    if isinstance(value, dict):
        return {str(k): _plain(v, path, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, path, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, date):
        return value.isoformat()
    if where.rpartition(".")[2] in ("handoff", "restrict_from", "restrict_to") and isinstance(value, int):
        raise CorralError(
            f'{path}: {where}: write the time quoted, e.g. "10:00" (unquoted, YAML reads a number)'
        )
    return value


@oncall_app.command("now")
@friendly_errors
def now(
    schedule: Annotated[str | None, typer.Argument(help="one schedule (default: all)")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Who is on call now, until when, and who is next."""
    with client() as c:
        rows = c.on_call_now(schedule)
    if output is Output.json:
        print_json(rows)
        return
    table = Table("SCHEDULE", "ON CALL", "SOURCE", "UNTIL", "NEXT", box=None)
    for r in rows:
        nxt = r["next"]["user"] or "(gap)" if r["next"] else "-"
        until = when(r["until"]) if r["until"] is not None else "over 14 days"
        table.add_row(r["schedule"], r["user"] or "(nobody: gap)", r["source"], until, nxt)
    if not rows:  # a header alone read as a listing that failed
        out.print("no on-call schedules (`corral oncall schedule set NAME -f FILE` defines one)")
        return
    out.print(table)


@schedule_app.command("ls")
@friendly_errors
def list_schedules(output: OutputOpt = Output.table) -> None:
    """Every schedule: its time zone, layers, who is on call now and how many gap warnings."""
    with client() as c:
        rows = c.schedules()
    if output is Output.json:
        print_json(rows)
        return
    table = Table("NAME", "TIME ZONE", "LAYERS", "ON CALL", "WARNINGS", box=None)
    for r in rows:
        table.add_row(
            r["name"],
            r["time_zone"],
            str(len(r["layers"])),
            r["on_call"]["user"] or "-",
            str(len(r["warnings"])),
        )
    out.print(table)


@schedule_app.command("show")
@friendly_errors
def show_schedule(
    name: str,
    days: Annotated[float, typer.Option(help="shifts this many days ahead")] = 7.0,
    output: OutputOpt = Output.table,
) -> None:
    """Definition, who is on call now, the coming shifts and gap warnings."""
    with client() as c:
        view = c.schedule(name, days=days)
    if output is Output.json:
        print_json(view)
        return
    out.print(
        f"[bold]{view['name']}[/bold] ({view['time_zone']}); fallback: {view['fallback_user'] or 'none'}",
        markup=True,
    )
    for layer in view["layers"]:
        window = f", {layer['restrict_from']}-{layer['restrict_to']}" if layer["restrict_from"] else ""
        when_text = f"{layer['rotation']} at {layer['handoff']} from {layer['start_date']}{window}"
        out.print(f"  layer {layer['name']}: {when_text}: {', '.join(layer['members'])}")
    for o in view["overrides"]:  # by id: what `schedule rm-override NAME ID` takes
        out.print(f"  override {o['id']}: {o['user']} {when(o['start'])} - {when(o['end'])}")
    table = Table("FROM", "TO", "ON CALL", "SOURCE", box=None)
    for s in view["shifts"]:
        table.add_row(when(s["start"]), when(s["end"]), s["user"] or "(nobody)", s["source"])
    out.print(table)
    for warning in view["warnings"]:
        out.print(f"[yellow]warning:[/yellow] {plain(warning)}", markup=True)
    if view.get("ical_feed"):
        # One line however wide the terminal: Rich folded the URL at 80 columns, and a copy of
        # the folded lines was not the URL.
        out.print(f"calendar (no login): {c.url}{view['ical_feed']}", soft_wrap=True)


@schedule_app.command("set")
@friendly_errors
def set_schedule(
    name: str,
    from_file: Annotated[Path, typer.Option("--file", "-f", help="YAML: time_zone, fallback_user, layers")],
) -> None:
    """Create or replace a schedule (admins) from a YAML file (docs/operations.md, "On-call").

    For example:

    \b
    time_zone: Europe/Berlin
    fallback_user: admin         # paged in gaps (optional)
    layers:
      - name: primary
        rotation: weekly         # or daily
        start_date: 2026-11-02   # the first member's first shift
        handoff: "09:00"
        members: \\[alice, bob]
    """
    with client() as c:
        view = c.put_schedule(name, read_yaml(from_file))
    out.print(f"schedule {name} saved; on call now: {view['on_call']['user'] or '(nobody)'}")
    for warning in view["warnings"]:
        out.print(f"[yellow]warning:[/yellow] {plain(warning)}", markup=True)


@schedule_app.command("rm")
@friendly_errors
def remove_schedule(name: str) -> None:
    """Delete a schedule (admins)."""
    with client() as c:
        c.delete_schedule(name)
    out.print(f"schedule {name} deleted")


@schedule_app.command("override")
@friendly_errors
def override(
    name: str,
    user: str,
    start: Annotated[str, typer.Argument(help="ISO time (e.g. 2026-10-24T20:00+02:00) or unix seconds")],
    end: Annotated[str, typer.Argument(help="ISO time or unix seconds")],
) -> None:
    """Put USER on call from START to END (swap a shift)."""
    with client() as c:
        made = c.add_override(name, user, parse_time(start), parse_time(end))
    out.print(f"override {made['id']}: {user} on call {when(made['start'])} - {when(made['end'])}")


@schedule_app.command("rm-override")
@friendly_errors
def remove_override(name: str, override_id: int) -> None:
    """Remove an override by its id (`schedule show` lists them)."""
    with client() as c:
        c.remove_override(name, override_id)
    out.print(f"override {override_id} removed")


@feed_app.command("rotate")
@friendly_errors
def rotate_feed(name: str) -> None:
    """Replace a schedule's calendar subscription URL (admins): the old URL is refused from now
    on; subscribed calendars need the new one, printed here (and by `schedule show`)."""
    with client() as c:
        view = c.rotate_schedule_feed(name)
    out.print(f"schedule {name}: the old calendar URL is revoked")
    out.print(f"calendar (no login): {c.url}{view['ical_feed']}", soft_wrap=True)


@schedule_app.command("ical")
@friendly_errors
def ical(name: str) -> None:
    """Print the schedule's iCalendar feed (import it into a calendar)."""
    with client() as c:
        typer.echo(c.schedule_ical(name), nl=False)


def parse_step(text: str) -> dict[str, Any]:
    kind, _, rest = text.partition(":")
    target, _, wait = rest.partition(":")
    if kind not in ("schedule", "user") or not target:
        raise CorralError(f"--step {text!r}: write schedule:NAME[:WAIT_MINUTES] or user:NAME[:WAIT_MINUTES]")
    try:
        minutes = float(wait) if wait else 0.0
    except ValueError:
        raise CorralError(f"--step {text!r}: the wait {wait!r} is not a number of minutes")
    return {kind: target, "wait_minutes": minutes}


@policy_app.command("set")
@friendly_errors
def set_policy(
    name: str,
    step: Annotated[
        list[str],
        typer.Option("--step", "-s", help="schedule:NAME[:WAIT_MIN] or user:NAME[:WAIT_MIN], in order"),
    ],
    repeat: Annotated[int, typer.Option(help="run all steps again this many more times")] = 0,
) -> None:
    """Create or replace an escalation policy (admins): notify each step's target, wait, go on."""
    with client() as c:
        view = c.put_policy(name, {"steps": [parse_step(s) for s in step], "repeat": repeat})
    out.print(f"policy {name}: {plural(len(view['steps']), 'step')}, repeat {view['repeat']}")


@policy_app.command("ls")
@friendly_errors
def list_policies(output: OutputOpt = Output.table) -> None:
    """Every escalation policy: its steps (who, then the wait) and repeats."""
    with client() as c:
        rows = c.policies()
    if output is Output.json:
        print_json(rows)
        return
    table = Table("NAME", "STEPS", "REPEAT", box=None)
    for p in rows:
        steps = "; ".join(
            f"{s.get('schedule') or s.get('user')} (+{s['wait_minutes']:g}m)" for s in p["steps"]
        )
        table.add_row(p["name"], steps, str(p["repeat"]))
    out.print(table)


@policy_app.command("rm")
@friendly_errors
def remove_policy(name: str) -> None:
    """Delete an escalation policy (admins)."""
    with client() as c:
        c.delete_policy(name)
    out.print(f"policy {name} deleted")


@oncall_app.command("page")
@friendly_errors
def page(policy: str, subject: str, body: Annotated[str, typer.Option(help="the message")] = "") -> None:
    """Page through POLICY by hand (admins), e.g. to test the set-up end to end."""
    with client() as c:
        view = c.page(policy, subject, body)
    out.print(f"page {view['id']} started ({view['key']})")


@oncall_app.command("pages")
@friendly_errors
def pages(
    state: Annotated[str | None, typer.Option(help="triggered|acknowledged|cancelled|exhausted")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Pages, newest first (admins: all; others: those that notified them)."""
    with client() as c:
        rows = c.pages(state=state)
    if output is Output.json:
        print_json(rows)
        return
    table = Table("ID", "STATE", "POLICY", "SUBJECT", "STARTED", "ACKED BY", box=None)
    for p in rows:
        table.add_row(
            str(p["id"]),
            p["state"],
            p["policy"],
            p["subject"],
            ago(p["created_at"]),
            p["acked_by"] or "-",
        )
    out.print(table)


@oncall_app.command("ack")
@friendly_errors
def ack(page_id: int) -> None:
    """Acknowledge a page: its escalation stops."""
    with client() as c:
        view = c.ack_page(page_id)
    out.print(f"page {page_id} {view['state']} by {view['acked_by']}")


@contact_app.command("ls")
@friendly_errors
def list_contacts(user: str, output: OutputOpt = Output.table) -> None:
    """USER's email and contact methods with their ids (yours, or anyone's as admin)."""
    with client() as c:
        view = c.contacts(user)
    if output is Output.json:
        print_json(view)
        return
    out.print(f"{view['user']}: email {view['email'] or '(none)'}")
    for m in view["methods"]:
        out.print(f"  {m['id']}: {m['kind']} {m['address']}")


@contact_app.command("email")
@friendly_errors
def set_email(user: str, email: Annotated[str, typer.Argument(help="'' removes it")]) -> None:
    """Set USER's account email, where pages and job notifications reach them. Pages and job
    notifications still waiting for the old address are not sent there."""
    with client() as c:
        c.set_email(user, email or None)
    out.print(f"{user}'s email set to {email or '(none)'}")


@contact_app.command("add")
@friendly_errors
def add_contact(
    user: str, kind: Annotated[str, typer.Argument(help="email | webhook | slack")], address: str
) -> None:
    """Add a contact method: another email address, a webhook URL (a JSON POST) or a Slack or
    Mattermost incoming-webhook URL."""
    with client() as c:
        view = c.add_contact(user, kind, address)
    out.print(f"{user}: contact {view['methods'][-1]['id']} added ({kind})")


@contact_app.command("rm")
@friendly_errors
def remove_contact(user: str, contact_id: int) -> None:
    """Remove one of USER's contact methods by its id (`contact ls` lists them). Pages and job
    notifications still waiting for it are not sent there (`corral show JOB` says so)."""
    with client() as c:
        c.remove_contact(user, contact_id)
    out.print(f"{user}: contact {contact_id} removed")


@contact_app.command("notify")
@friendly_errors
def notify_default(
    user: str,
    on: Annotated[
        str | None,
        typer.Option(
            help="events, comma-separated: started, succeeded, failed, cancelled, requeued, end, all"
        ),
    ] = None,
    to: Annotated[
        str | None,
        typer.Option(help="with --on: contact kinds, comma-separated (email, webhook, slack); default all"),
    ] = None,
    off: Annotated[
        bool, typer.Option("--off", help="no default: jobs without `notify` tell nothing")
    ] = False,
) -> None:
    """USER's job notification default: the `notify` their jobs get when the spec has none
    (`--on failed`: mail me when any of my jobs fails). Without options, shows it. A job opts
    out of it with `notify: false` in its spec."""
    if off and (on is not None or to is not None):
        raise typer.BadParameter("--off takes no --on or --to")
    if to is not None and on is None:
        raise typer.BadParameter("give --on EVENTS with --to")
    with client() as c:
        if off:
            view = c.set_notify_default(user, None)
        elif on is not None:
            kinds = [k.strip() for k in (to or "").split(",") if k.strip()]
            view = c.set_notify_default(
                user, {"on": [w.strip() for w in on.split(",") if w.strip()], "to": kinds}
            )
        else:
            view = c.notify_default(user)
    notify = view["notify"]
    if notify is None:
        out.print(f"{user}: no job notification default", highlight=False)
        return
    where = ", ".join(notify["to"]) or "all contacts"
    out.print(f"{user}: jobs without notify tell of {', '.join(notify['on'])} to {where}", highlight=False)


def register(app: typer.Typer) -> None:
    app.add_typer(oncall_app, name="oncall")
