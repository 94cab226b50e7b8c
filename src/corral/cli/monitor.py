"""Monitoring commands: `corral alert ls|channels`, `corral node risk` (the anomaly detector's
risky nodes), `corral chaos gpu ...` (fault injection into virtual GPUs), `corral chaos node
down|up` (a node's heartbeats stop) and `corral chaos job oom JOB`, for chaos testing: through
the admin API, or (gpu, node) straight into a server's chaos files with `--home`."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from corral.cli import nodes as node_commands
from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, print_json, when
from corral.sdk.base import seg
from corral.words import plural

alert_app = typer.Typer(
    help="Alerts Corral holds (from Alertmanager and its own health checks).", no_args_is_help=True
)
chaos_app = typer.Typer(help="Fault injection for chaos testing.", no_args_is_help=True)
gpu_app = typer.Typer(
    help="Make a (virtual) GPU misbehave; read by the next GPU sample.", no_args_is_help=True
)
chaos_app.add_typer(gpu_app, name="gpu")
node_app = typer.Typer(
    help="Stop or resume a node's heartbeats (after the timeout it is down, its work lost).",
    no_args_is_help=True,
)
chaos_app.add_typer(node_app, name="node")
job_app = typer.Typer(help="Make a running job fail as the platform would see it.", no_args_is_help=True)
chaos_app.add_typer(job_app, name="job")

Node = Annotated[str, typer.Argument(metavar="NODE")]
Index = Annotated[int, typer.Argument(metavar="GPU", min=0, help="GPU index on the node")]
HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home",
        help="write the fault file of the server with this CORRAL_HOME instead of the API",
        # a typo'd home was created and written to, reported as injected, and read by no server
        exists=True,
        file_okay=False,
    ),
]


class AlertStatus(StrEnum):
    firing = "firing"
    resolved = "resolved"


WHERE_LABELS = ("node", "gpu", "job_id")  # what says where an alert is; --labels shows the rest


@alert_app.command("ls")
@friendly_errors
def alert_ls(
    status: Annotated[AlertStatus | None, typer.Option("--status", help="firing or resolved")] = None,
    name: Annotated[str | None, typer.Option("--name", help="alert name, e.g. CorralGpuEccErrors")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 100,
    all_labels: Annotated[
        bool, typer.Option("--labels", "-l", help="every label under the name, not only node, gpu and job_id")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """List alerts, newest first: yours (your jobs' and cluster-wide ones), your groups' if you
    administer them, all for an admin. Under each name, its node, gpu and job_id labels (all of
    them with --labels)."""
    params: dict[str, Any] = {"limit": limit}
    params.update({k: v for k, v in {"status": status and status.value, "name": name}.items() if v})
    with client() as c:
        data = c.request("GET", "/alerts", params=params)
    if output is Output.json:
        print_json(data)
        return
    if not data["items"]:  # a header alone read as a listing that failed half-way
        out.print(f"no {status + ' ' if status else ''}alerts{f' named {name}' if name else ''}")
        return
    # No box, nothing cut, the labels on a line of their own under the name: at 80 columns a
    # WHERE column of one label a line ran an Alertmanager alert's nine labels (corral_url,
    # instance, ...) over some 20 lines, and SOURCE read "alertman…".
    table = Table("ID", "STATUS", "SEVERITY", "NAME", "SOURCE", "SINCE", "SEEN", box=None, pad_edge=False)
    for column in table.columns:
        column.no_wrap = True
    table.columns[3].no_wrap, table.columns[3].overflow = False, "fold"
    for a in data["items"]:
        labels = {
            k: v for k, v in sorted(a.get("labels", {}).items()) if k not in ("alertname", "severity") and v
        }
        shown = labels if all_labels else {k: labels[k] for k in WHERE_LABELS if k in labels}
        title = Text(a["name"])
        if shown:
            title.append("\n" + " ".join(f"{k}={v}" for k, v in shown.items()), style="dim")
        color = "red" if a["status"] == "firing" else "green"
        table.add_row(
            str(a["id"]), Text(a["status"], style=color), a["severity"], title, a["source"],
            ago(a["starts_at"]), str(a["receive_count"]),
        )  # fmt: skip
    out.print(table)
    out.print(f"{len(data['items'])} of {plural(data['total'], 'alert')}")


@alert_app.command("channels")
@friendly_errors
def alert_channels(output: OutputOpt = Output.table) -> None:
    """Notification channels and whether they deliver.

    STATE is failing while a notification is being retried or the last one was given up
    (retry.max_attempts), ok once the next one is sent. Each channel's last error follows the
    table, whole."""
    with client() as c:
        data = c.request("GET", "/alerts/channels")
    if output is Output.json:
        print_json(data)
        return
    # No box, nothing cut: the channel's name and the counts in the table, each last error whole on
    # a line of its own below it. At 80 columns the boxed table with a LAST ERROR column cut the
    # name ("ops-e…") and the headings ("CHANN…", "PENDI…"), and the error was cut at 80 characters.
    table = Table("CHANNEL", "TYPE", "STATE", "SENT", "PENDING", "FAILING", "GAVE UP", "LAST SENT", box=None)
    for column in table.columns:
        column.no_wrap = True
    for ch in data["items"]:
        color = "red" if ch["state"] == "failing" else "green"
        table.add_row(
            ch["name"], ch["type"], Text(ch["state"], style=color), str(ch["sent"]), str(ch["pending"]),
            str(ch["failing"]), str(ch["given_up"]), ago(ch["last_sent_at"]),
        )  # fmt: skip
    out.print(table)
    for ch in data["items"]:
        if ch["last_error"]:
            out.print(Text(f"{ch['name']}: last error: {ch['last_error']}"))


def _inject(node: str, index: int, home: Path | None, **fault: Any) -> None:
    if home is not None:
        from corral.monitor.gpu import update_fault

        try:
            entry = update_fault(home, node, index, **fault)
        except ValueError as exc:
            raise typer.BadParameter(str(exc))
    else:
        with client() as c:
            entry = c.request("POST", f"/chaos/gpus/{seg(node)}/{index}", json=fault)["fault"]
    out.print(f"GPU {index} on {node}: {fault_text(entry)}")


def fault_text(entry: dict[str, Any]) -> str:
    """A GPU's injected faults as `key=value` pairs: the entry was printed as a Python dict, with
    unix times and floats to 16 digits ("'ecc_corrected_per_s': 0.03333333333333333,
    'ecc_corrected_since': 1796007442.055609"). Times (`*_since`) as local times, Xids by code."""
    if not entry:
        return "no faults"
    parts = []
    for key, value in entry.items():
        if key == "xids":
            text = ",".join(str(x["xid"]) for x in value)
        elif key.endswith("_since"):
            text = when(value)
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, float):
            text = f"{value:.4g}"
        else:
            text = str(value)
        parts.append(f"{key}={text}")
    return ", ".join(parts)


@gpu_app.command("ecc")
@friendly_errors
def chaos_ecc(
    node: Node,
    index: Index,
    count: Annotated[int, typer.Option("--count", min=1)] = 1,
    corrected: Annotated[bool, typer.Option("--corrected", help="correctable errors instead")] = False,
    rate: Annotated[
        str | None,
        typer.Option("--rate", help="correctable errors creeping up at a rate, e.g. 2/m (0 stops it)"),
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Inject ECC errors (uncorrectable unless --corrected), or let correctable ones creep up."""
    if rate is not None:
        _inject(node, index, home, ecc_corrected_per_s=parse_rate(rate, "--rate"))
        return
    _inject(node, index, home, **{"ecc_corrected" if corrected else "ecc_uncorrected": count})


@gpu_app.command("xid")
@friendly_errors
def chaos_xid(
    node: Node, index: Index, code: Annotated[int, typer.Argument(min=0)] = 79, home: HomeOpt = None
) -> None:
    """Report an Xid event (default 79: fell off the bus)."""
    _inject(node, index, home, xid=code)


@gpu_app.command("temp")
@friendly_errors
def chaos_temp(
    node: Node,
    index: Index,
    celsius: Annotated[float | None, typer.Argument(help="set the temperature (C)")] = None,
    ramp: Annotated[
        str | None, typer.Option("--ramp", help="climb at a rate, e.g. 0.5/s or 1/m (0 stops it)")
    ] = None,
    home: HomeOpt = None,
) -> None:
    """Set the GPU's temperature, or make it climb at a rate (a failing fan)."""
    if celsius is None and ramp is None:
        raise typer.BadParameter("give a temperature, --ramp RATE, or both")
    fault: dict[str, Any] = {} if celsius is None else {"temperature_c": celsius}
    if ramp is not None:
        fault["temperature_ramp_c_per_s"] = parse_rate(ramp, "--ramp")
    _inject(node, index, home, **fault)


def parse_rate(text: str, option: str) -> float:
    """Per second from `0.5/s`, `2/m`, `10/h` or a bare number (per second)."""
    amount, _, unit = text.strip().partition("/")
    per = {"": 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}.get(unit.strip())
    try:
        value = float(amount)
    except ValueError:
        value = float("nan")
    if per is None or not value >= 0:
        raise typer.BadParameter(f"{option}: expected a rate such as 0.5/s, 2/m or 10/h, got {text!r}")
    return value / per


@gpu_app.command("util")
@friendly_errors
def chaos_util(
    node: Node, index: Index, percent: Annotated[float, typer.Argument(min=0, max=100)], home: HomeOpt = None
) -> None:
    """Set the GPU's utilization (drives the idle-GPU policy)."""
    _inject(node, index, home, utilization_percent=percent)


@gpu_app.command("lose")
@friendly_errors
def chaos_lose(node: Node, index: Index, home: HomeOpt = None) -> None:
    """Make the GPU disappear (as if it fell off the bus)."""
    _inject(node, index, home, lost=True)


@gpu_app.command("flap")
@friendly_errors
def chaos_flap(
    node: Node,
    index: Index,
    period: Annotated[
        float, typer.Option("--period", min=0, help="seconds between drop-outs, 0 stops")
    ] = 60.0,
    down: Annotated[float, typer.Option("--down", min=0, help="seconds each drop-out lasts")] = 10.0,
    home: HomeOpt = None,
) -> None:
    """Make the GPU drop out for --down seconds every --period seconds (a flapping GPU or node)."""
    if period and down >= period:
        raise typer.BadParameter(f"--down ({down:g} s) must be shorter than --period ({period:g} s)")
    _inject(node, index, home, flap_period_s=period, flap_down_s=down)


@gpu_app.command("clear")
@friendly_errors
def chaos_clear(node: Node, index: Index, home: HomeOpt = None) -> None:
    """Undo injected faults as a GPU reset would (lifetime ECC and Xid history stay)."""
    _inject(node, index, home, clear=True)


def _silence(node: str, down: bool, home: Path | None) -> None:
    if home is not None:
        from corral.monitor.chaos import set_node_silenced

        try:
            silenced = set_node_silenced(home, node, down)
        except ValueError as exc:
            raise typer.BadParameter(str(exc))
        flowing = "stopped" if node in silenced else "flowing"
    else:
        with client() as c:
            path = f"/chaos/nodes/{seg(node)}/{'down' if down else 'up'}"
            flowing = c.request("POST", path)["heartbeats"]
    out.print(f"heartbeats of {node}: {flowing}")


@job_app.command("oom")
@friendly_errors
def chaos_job_oom(
    job_id: Annotated[int, typer.Argument(metavar="JOB", min=1)],
    force: Annotated[bool, typer.Option("--force", help="also when the server's GPUs are real")] = False,
) -> None:
    """End the job's running attempt as an out-of-memory kill (diagnosed oom, never retried;
    the CorralJobOOM alert follows). Virtual GPUs only, unless --force."""
    with client() as c:
        done = c.request("POST", f"/chaos/jobs/{job_id}/oom", json={"force": force})
    out.print(f"job {job_id}: attempt {done['attempt']} OOM-killed")


@node_app.command("down")
@friendly_errors
def chaos_node_down(node: Node, home: HomeOpt = None) -> None:
    """Stop the node's heartbeats: after the heartbeat timeout it is marked down."""
    _silence(node, True, home)


@node_app.command("up")
@friendly_errors
def chaos_node_up(node: Node, home: HomeOpt = None) -> None:
    """Let the node's heartbeats through again: its next report brings it back."""
    _silence(node, False, home)


@friendly_errors
def node_risk(
    min_risk: Annotated[
        float, typer.Option("--min", min=0, max=1, help="only nodes at least this risky")
    ] = 0.0,
    output: OutputOpt = Output.table,
) -> None:
    """Risky nodes: the anomaly detector's failure risk per node (0-1), highest first, and why."""
    with client() as c:
        data = c.node_risk(min_risk)
    if output is Output.json:
        print_json(data)
        return
    table = Table("NODE", "RISK", "WORST GPU", "WHY", box=None)
    for n in data["nodes"]:
        color = "red" if n["risk"] >= 0.6 else "yellow" if n["risk"] >= 0.3 else "green"
        worst = n["gpus"][0] if n["gpus"] else None
        table.add_row(
            n["node"], Text(f"{n['risk']:.2f}", style=color),
            f"{worst['index']} ({worst['score']:.2f})" if worst else "-", "; ".join(n["reasons"][:2]) or "-",
        )  # fmt: skip
    out.print(table)
    out.print(f"{plural(len(data['nodes']), 'node')}; scored {ago(data['updated_at'])}")


def register(app: typer.Typer) -> None:
    """Add this area's commands to the root `corral` app (and `risk` to `corral node`)."""
    node_commands.node_app.command("risk")(node_risk)
    app.add_typer(alert_app, name="alert")
    app.add_typer(chaos_app, name="chaos")
