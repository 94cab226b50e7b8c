"""Platform commands: up, submit, ls, show, why, logs, cancel, node, group, user, token.

Everything goes through the SDK (corral.sdk.Client), so the CLI is just another API client.
Read commands and `submit` take `-o json` and then print exactly the JSON the API returned.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from corral.domain import span_text, start_text
from corral.sdk import KEEP, Client, CorralError, Keep
from corral.spec import parse_memory_mib

F = TypeVar("F", bound=Callable[..., Any])
out = Console()
err = Console(stderr=True)


class Output(StrEnum):
    table = "table"
    json = "json"


OutputOpt = Annotated[Output, typer.Option("--output", "-o", help="table (default) or json (the API's JSON)")]


def client() -> Client:
    return Client.from_config()


def friendly_errors(fn: F) -> F:
    """Turn SDK errors into one plain line on stderr and exit code 1 (no tracebacks)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except CorralError as exc:
            err.print(f"[red]error:[/red] {exc.message}", markup=True, highlight=False)
            raise typer.Exit(1)
        except TimeoutError as exc:
            err.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1)

    return wrapper  # type: ignore[return-value]


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def ago(ts: float | None, now: float | None = None) -> str:
    if ts is None:
        return "-"
    delta = (time.time() if now is None else now) - ts
    future = delta < 0
    delta = abs(delta)
    text = f"{delta:.0f}s" if delta < 90 else f"{delta / 60:.0f}m" if delta < 5400 else f"{delta / 3600:.1f}h"
    return f"in {text}" if future else f"{text} ago"


def gpus_of(job: dict[str, Any]) -> int:
    tasks = job.get("spec", {}).get("tasks", {})
    return sum(
        int(t.get("instances", 1)) * int(t.get("resources", {}).get("gpus", 0)) for t in tasks.values()
    )


# --- jobs ---------------------------------------------------------------------------------------


@friendly_errors
def submit(
    file: Annotated[
        Path | None, typer.Argument(help="job spec (YAML); '-' reads stdin", allow_dash=True)
    ] = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="wait until the job ends; exit 1 unless it succeeded")
    ] = False,
    output: OutputOpt = Output.table,
    code: Annotated[
        Path | None,
        typer.Option(
            "--code",
            help="upload this directory (minus .gitignore/.corralignore) as the job's code, "
            "read-only at /code, its working dir; unchanged files are not sent again",
        ),
    ] = None,
    from_job: Annotated[
        int | None, typer.Option("--from-job", help="submit a copy of this job's spec (a clone)")
    ] = None,
) -> None:
    """Submit a job spec, or a copy of an earlier job's (`--from-job 42`)."""
    if (file is None) == (from_job is None):
        raise CorralError("give a spec file (or '-') or --from-job JOB, one of them")
    with client() as c:
        if from_job is not None:
            text: str | dict[str, Any] = dict(c.job(from_job)["spec"])
        else:
            assert file is not None
            text = sys.stdin.read() if str(file) == "-" else _read(file)
        snapshot = None
        if code is not None:
            upload = c.upload_code(code)
            snapshot = upload.id
            err.print(
                f"code: {upload.files} files, {upload.total_bytes} bytes; "
                f"uploaded {upload.uploaded_bytes} bytes (snapshot {upload.id[:12]})"
            )
        job = c.submit(text, code=snapshot)
        if wait:
            if output is Output.table:
                err.print(f"job {job['id']} submitted; waiting for it to end ...")
            job = c.wait(job["id"])
    if output is Output.json:
        print_json(job)
    else:
        out.print(f"job [bold]{job['id']}[/bold] ({job['name']}) {job['state']} in group {job['group']}")
    if wait and job["state"] != "succeeded":
        raise typer.Exit(1)


def _read(file: Path) -> str:
    try:
        return file.read_text()
    except OSError as exc:
        raise CorralError(f"cannot read {file}: {exc.strerror}")


@friendly_errors
def ls(
    state: Annotated[str | None, typer.Option(help="e.g. queued,running")] = None,
    user: Annotated[str | None, typer.Option()] = None,
    group: Annotated[str | None, typer.Option()] = None,
    sort: Annotated[
        str, typer.Option(help="created_at, updated_at, id, priority, state, name")
    ] = "created_at",
    asc: Annotated[bool, typer.Option("--asc", help="oldest first")] = False,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    output: OutputOpt = Output.table,
) -> None:
    """List jobs you can see."""
    with client() as c:
        page = c.jobs(
            state=state,
            user=user,
            group=group,
            sort=sort,
            order="asc" if asc else "desc",
            limit=limit,
            offset=offset,
        )
    if output is Output.json:
        print_json(page)
        return
    table = Table("ID", "NAME", "STATE", "USER", "GROUP", "GPUS", "ATTEMPTS", "SUBMITTED", box=None)
    for job in page["items"]:
        table.add_row(
            str(job["id"]),
            job["name"],
            job["state"],
            job["user"],
            job["group"],
            str(gpus_of(job)),
            str(len(job["attempts"])),
            ago(job["created_at"]),
        )
    out.print(table)
    shown = len(page["items"])
    out.print(f"{shown} of {page['total']} jobs" + (f" (from offset {offset})" if offset else ""))


def budgets_line(job: dict[str, Any]) -> str:
    """What the retry rules have counted: own failures against `retries`, platform losses
    against the server's lost-requeue budget; preemptions cost neither."""
    budget = job.get("lost_requeue_budget")
    losses = f"{job.get('platform_losses', 0)}" + (f" of {budget}" if budget is not None else "")
    return (
        f"failures {job.get('own_failures', 0)} of {job['retries']} retries  "
        f"platform losses {losses} requeues  preemptions {job.get('preemptions', 0)}"
    )


@friendly_errors
def show(job_id: Annotated[int, typer.Argument(metavar="JOB")], output: OutputOpt = Output.table) -> None:
    """Show a job: state, attempts, why it is pending, queue position and estimated start."""
    with client() as c:
        job = c.job(job_id)
    if output is Output.json:
        print_json(job)
        return
    out.print(
        f"[bold]job {job['id']}[/bold] {job['name']}  state: [bold]{job['state']}[/bold]"
        + (
            "  (cancel requested)"
            if job["cancel_requested"] and job["state"] not in ("cancelled", "failed", "succeeded")
            else ""
        )
    )
    out.print(
        f"user {job['user']}  group {job['group']}  priority {job['priority']}  GPUs {gpus_of(job)}  "
        f"retries {job['retries']}  submitted {when(job['created_at'])}"
    )
    out.print(budgets_line(job))
    if job.get("reason"):
        out.print(f"reason: {job['reason']}")
    _print_diagnosis(job.get("diagnosis"))
    if job["attempts"]:
        table = Table("#", "STATE", "NODES", "GPUS", "STARTED", "ENDED", "EXIT", "REASON", box=None)
        for a in job["attempts"]:
            gpus = ",".join(f"{g['node']}:{g['index']}" for g in a["gpus"]) or "-"
            table.add_row(
                str(a["number"]),
                a["state"],
                ",".join(a["nodes"]) or "-",
                gpus,
                when(a["started_at"]),
                when(a["ended_at"]),
                "-" if a["exit_code"] is None else str(a["exit_code"]),
                (a["reason"] or "") + (f": {a['message']}" if a["message"] else ""),
            )
        out.print(table)
        _print_failures(job)
    else:
        out.print("no attempts yet")
    _print_watch(job.get("watch"))


def _print_failures(job: dict[str, Any]) -> None:
    """The exit-spec's verdict on each failed attempt: reason, category, message and fix."""
    for a in job["attempts"]:
        f = a.get("failure")
        if not f:
            continue
        out.print(f"attempt {a['number']}: [bold]{f['reason']}[/bold] ({f['category']}) {f['message']}")
        if f.get("evidence"):
            out.print(f"  log: {f['evidence']}", markup=False)
        out.print(f"  fix: {f['fix']}")


def _print_watch(watch: dict[str, Any] | None) -> None:
    if not watch:
        return
    if watch.get("suspected_hang"):
        done = f"; action: {watch['action']}" if watch.get("action") else ""
        out.print(f"[red]suspected hang[/red]: {watch['suspected_hang']}{done}")
    if watch.get("stragglers"):
        out.print(f"stragglers: {watch['stragglers']}")


def _print_diagnosis(diag: dict[str, Any] | None) -> None:
    if not diag:
        return
    if diag.get("unschedulable"):
        out.print("[red]this job cannot run on the cluster as it stands[/red]")
    for reason in diag.get("reasons", []):
        out.print(
            f"why pending: {reason.get('message')} [dim]({reason.get('code')}, {reason.get('source')})[/dim]",
            highlight=False,
        )
    if diag.get("queue_position") is not None:
        out.print(f"queue position: {diag['queue_position']} (the order the scheduler takes waiting jobs)")
    out.print(f"estimated start: {start_line(diag)}", highlight=False)


def start_line(diag: dict[str, Any]) -> str:
    """ "2026-11-28 03:10 (in ~2 h 10 min (likely 1 h 30 min to 3 h))", or why there is none."""
    if diag.get("unschedulable"):
        return "never, as the cluster stands"
    if diag.get("held"):
        return "none while it is held back by its quota or cap (see why pending)"
    est = diag.get("estimated_start")
    if est is None:
        return "unknown"
    return f"{when(est)} ({start_text(est, diag.get('start_range'), time.time())})"


@friendly_errors
def why(job_id: Annotated[int, typer.Argument(metavar="JOB")], output: OutputOpt = Output.table) -> None:
    """Why a job waits: the scheduler's reasons, its place in the scheduler's order, its
    estimated start with its uncertainty, and the runtime assumed for it."""
    with client() as c:
        job = c.job(job_id)
    if output is Output.json:
        print_json(
            {
                "id": job["id"],
                "state": job["state"],
                "diagnosis": job.get("diagnosis"),
                "runtime_estimate": job.get("runtime_estimate"),
            }
        )
        return
    if job["state"] not in ("queued", "scheduled", "starting"):
        out.print(f"job {job['id']} is {job['state']}: it is not waiting")
        return
    out.print(f"[bold]job {job['id']}[/bold] {job['name']} is {job['state']}")
    if not job.get("diagnosis"):
        out.print("the scheduler has not looked at it yet")
    _print_diagnosis(job.get("diagnosis"))
    estimate = job.get("runtime_estimate")
    if estimate:
        spread = ""
        if estimate.get("low_s") is not None and estimate.get("high_s") is not None:
            spread = f", likely {span_text(estimate['low_s'])} to {span_text(estimate['high_s'])}"
        basis = {
            "name": "this job name's earlier runs",
            "user_size": "the user's jobs of this size",
            "group": "the group's jobs",
            "cluster": "the cluster's jobs",
            "limit": "its max_runtime (no history yet)",
        }.get(estimate.get("basis") or "", "history")
        out.print(
            f"assumed runtime: ~{span_text(estimate['seconds'])}{spread} (from {basis})", highlight=False
        )
    else:
        out.print("assumed runtime: unknown (no history and no max_runtime)")


@friendly_errors
def logs(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing until the job ends")] = False,
    attempt: Annotated[int | None, typer.Option(help="attempt number (default: newest)")] = None,
    rank: Annotated[int, typer.Option(help="instance rank (default 0)")] = 0,
    output: OutputOpt = Output.table,
) -> None:
    """Print a job's output (stdout and stderr). While the job waits to run, say why (on stderr)."""
    with client() as c:
        if follow:
            _print_waiting(c.logs(job_id, attempt=attempt, rank=rank, offset=0).get("waiting"))
            for text in c.follow_logs(job_id, rank=rank):
                sys.stdout.write(text)
                sys.stdout.flush()
            return
        offset, chunks = 0, []
        while True:
            chunk = c.logs(job_id, attempt=attempt, rank=rank, offset=offset)
            chunks.append(chunk["data"])
            if not chunk["data"] or chunk["next_offset"] == offset:
                break
            offset = chunk["next_offset"]
        if output is Output.json:
            print_json({**chunk, "data": "".join(chunks)})
        else:
            sys.stdout.write("".join(chunks))
            _print_waiting(chunk.get("waiting"))


def _print_waiting(waiting: dict[str, Any] | None) -> None:
    """The job has no output because it has not started (again): why, where, and when."""
    if not waiting:
        return
    err.print(waiting["message"], highlight=False, markup=False, soft_wrap=True)
    est = waiting.get("estimated_start")
    if waiting["state"] == "queued" and est is not None and not waiting.get("unschedulable"):
        err.print(f"estimated start: {start_line(waiting)}", highlight=False, soft_wrap=True)


@friendly_errors
def cancel(job_id: Annotated[int, typer.Argument(metavar="JOB")], output: OutputOpt = Output.table) -> None:
    """Cancel a job (queued jobs end at once; running ones are stopped)."""
    with client() as c:
        job = c.cancel(job_id)
    if output is Output.json:
        print_json(job)
    elif job["state"] == "cancelled":
        out.print(f"job {job_id} cancelled")
    else:
        out.print(f"job {job_id} is {job['state']}; it is being stopped")


@friendly_errors
def rm(job_ids: Annotated[list[int], typer.Argument(metavar="JOB...", help="finished jobs")]) -> None:
    """Delete finished jobs and their logs (yours; admins: anyone's). Exit 1 if any was refused."""
    failed = 0
    with client() as c:
        for job_id in job_ids:
            try:
                c.delete(job_id)
                out.print(f"job {job_id} deleted")
            except CorralError as exc:
                if exc.status_code in (None, 401):  # unreachable server, bad credentials: stop at once
                    raise
                failed += 1
                err.print(f"[red]error:[/red] job {job_id}: {exc.message}", highlight=False)
    if failed:
        raise typer.Exit(1)


# --- nodes --------------------------------------------------------------------------------------

node_app = typer.Typer(
    help="Nodes: list, cordon, uncordon, drain, gpu quarantine|return, risk (failure risk).",
    no_args_is_help=True,
)


@node_app.command("ls")
@friendly_errors
def node_ls(output: OutputOpt = Output.table) -> None:
    """List nodes with their GPUs and the jobs holding them."""
    with client() as c:
        nodes = c.nodes()
    if output is Output.json:
        print_json(nodes)
        return
    table = Table("NODE", "STATE", "CPUS", "MEMORY", "GPUS", "IN USE", "HEARTBEAT", "FLAGS", box=None)
    for n in nodes:
        models = sorted({g["model"] for g in n["gpus"]})
        used = [f"{g['index']}:job {g['job_id']}" for g in n["gpus"] if g["job_id"] is not None]
        table.add_row(
            n["name"],
            n["state"],
            f"{n['cpus']:g}",
            f"{n['memory_mib'] / 1024:.0f}GiB",
            f"{len(n['gpus'])} {'/'.join(models)}".strip(),
            ", ".join(used) or "-",
            ago(n["last_heartbeat"]),
            "; ".join(n.get("flags") or []) or "-",
        )
    out.print(table)


def _node_action(action: str) -> Callable[[str, Output], None]:
    @friendly_errors
    def command(
        name: Annotated[str, typer.Argument(metavar="NODE")], output: OutputOpt = Output.table
    ) -> None:
        with client() as c:
            node = c.node_action(name, action)
        if output is Output.json:
            print_json(node)
        else:
            out.print(f"node {name}: {node['state']}")

    command.__doc__ = {
        "cordon": "Take no new jobs on NODE.",
        "uncordon": "Return NODE to service.",
        "drain": "Take no new jobs on NODE and let it empty.",
    }[action]
    return command


for _action in ("cordon", "uncordon", "drain"):
    node_app.command(_action)(_node_action(_action))


@node_app.command("gpu")
@friendly_errors
def node_gpu(
    name: Annotated[str, typer.Argument(metavar="NODE")],
    index: Annotated[int, typer.Argument(metavar="INDEX", min=0)],
    action: Annotated[str, typer.Argument(metavar="quarantine|return")],
) -> None:
    """Quarantine one GPU (no new job on it; the node's others keep working), or return a
    quarantined or lost GPU to service once examined (admin)."""
    if action not in ("quarantine", "return"):
        raise typer.BadParameter(f"{action!r}: give quarantine or return")
    with client() as c:
        node = c.request("POST", f"/nodes/{name}/gpus/{index}/{action}")
    health = next(g["health"] for g in node["gpus"] if g["index"] == index)
    out.print(f"node {name} GPU {index}: {health}")


# --- groups -------------------------------------------------------------------------------------

group_app = typer.Typer(help="Groups and quotas.", no_args_is_help=True)


def _of(used: float, guaranteed: float, limit: float | None, unit: str = "") -> str:
    """ "3/2/4" = used/guaranteed/max ("-": no max)."""
    return f"{used:g}{unit}/{guaranteed:g}{unit}/{'-' if limit is None else f'{limit:g}{unit}'}"


def _gpu_cell(group: dict[str, Any]) -> str:
    """One line per quota key: "A100: 3/2/4 (1 borrowed)"."""
    lines = []
    for r in group["usage"]["gpus"]:
        label = "any" if r["gpu_model"] == "*" else r["gpu_model"]
        borrowed = f" ({r['borrowed']} borrowed)" if r["borrowed"] else ""
        lines.append(f"{label}: {_of(r['used'], r['guaranteed'], r['max'])}{borrowed}")
    return "\n".join(lines) or "-"


def _resource_cell(usage: dict[str, Any], scale: float = 1.0, unit: str = "") -> str:
    """CPUs or memory (scale 1/1024: MiB -> GiB) used/guaranteed/max."""
    limit = usage["max"]
    return _of(
        round(usage["used"] * scale, 1),
        round(usage["guaranteed"] * scale, 1),
        None if limit is None else round(limit * scale, 1),
        unit,
    )


def _storage_cell(row: dict[str, Any] | None) -> str:
    """Bytes and files used/max (corral storage usage has the detail)."""
    if row is None:
        return "-"
    from corral.cli.data import limit_text
    from corral.datasets.names import human_bytes

    used = limit_text(row["used_bytes"], row["max_bytes"], human_bytes)
    return f"{used}\n{limit_text(row['used_files'], row['max_files'])} files"


@group_app.command("ls")
@friendly_errors
def group_ls(output: OutputOpt = Output.table) -> None:
    """List groups (all for admins, yours otherwise): per GPU model used/guaranteed/max and how
    many of the used GPUs are borrowed; CPUs and memory used/guaranteed/max; warnings."""
    with client() as c:
        groups = c.groups()
        storage = {r["name"]: r for r in c.storage_usage() if r["scope"] == "group"}
    if output is Output.json:
        print_json(groups)
        return
    table = Table(
        "GROUP",
        "GPUS used/guaranteed/max",
        "CPUS",
        "MEMORY",
        "STORAGE used/max",
        "USER CAP",
        "WEIGHT",
        "BORROWING",
        "MEMBERS",
        box=None,
    )
    warnings: dict[str, None] = {}
    for g in groups:
        members = "-" if g.get("members") is None else str(len(g["members"]))
        cap = "-" if g.get("user_max_gpus") is None else f"{g['user_max_gpus']} GPUs"
        table.add_row(
            g["name"],
            _gpu_cell(g),
            _resource_cell(g["usage"]["cpus"]),
            _resource_cell(g["usage"]["memory_mib"], 1 / 1024, "G"),
            _storage_cell(storage.get(g["name"])),
            cap,
            f"{g['weight']:g}",
            "yes" if g["borrowing"] else "no",
            members,
        )
        warnings.update(dict.fromkeys(g.get("warnings") or ()))
    out.print(table)
    for text in warnings:
        out.print(f"[yellow]warning:[/yellow] {text}", highlight=False)


@group_app.command("create")
@friendly_errors
def group_create(
    name: str,
    weight: Annotated[float, typer.Option(help="fair-share weight")] = 1.0,
    no_borrowing: Annotated[bool, typer.Option("--no-borrowing", help="never borrow idle quota")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Create a group (admin)."""
    with client() as c:
        group = c.create_group(name, weight=weight, borrowing=not no_borrowing)
    print_json(group) if output is Output.json else out.print(f"group {name} created")


N = TypeVar("N", int, float)


def _limit(value: str | None, what: str, parse: Callable[[str], N]) -> N | Keep | None:
    """A limit option: not given -> KEEP, "none" -> None (no limit), else the parsed value."""
    if value is None:
        return KEEP
    if value.strip().lower() in ("none", "unlimited", "-"):
        return None
    try:
        return parse(value)
    except ValueError as exc:
        raise typer.BadParameter(f"{what}: {exc}")


def _count(value: str) -> int:
    n = int(value)
    if n < 0:
        raise ValueError(f"{value} is less than 0")
    return n


def _cpus(value: str) -> float:
    n = float(value)
    if n < 0:
        raise ValueError(f"{value} is less than 0")
    return n


def _memory(value: str) -> int:
    return 0 if value.strip() == "0" else parse_memory_mib(value)


LimitOpt = Annotated[str | None, typer.Option(help="'none' = no limit")]


@group_app.command("quota")
@friendly_errors
def group_quota(
    name: str,
    gpus: Annotated[int | None, typer.Option("--gpus", min=0, help="guaranteed GPUs of --model")] = None,
    model: Annotated[str, typer.Option("--model", help="GPU model; '*' = any model")] = "*",
    max_gpus: Annotated[
        str | None, typer.Option("--max", help="most GPUs of --model; 'none' = no limit")
    ] = None,
    user_max: Annotated[str | None, typer.Option(help="per-user GPU cap; 'none' removes it")] = None,
    cpus: Annotated[float | None, typer.Option(min=0, help="guaranteed CPUs (group-wide)")] = None,
    cpus_max: LimitOpt = None,
    memory: Annotated[str | None, typer.Option(help="guaranteed memory, e.g. 64GiB")] = None,
    memory_max: LimitOpt = None,
    storage: Annotated[str | None, typer.Option(help="storage quota, e.g. 2TiB; 'none' = no limit")] = None,
    files: Annotated[str | None, typer.Option(help="quota of files stored; 'none' = no limit")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Set a group's quotas (admin): only the options given change."""
    if storage is not None or files is not None:  # storage quotas: corral.cli.data
        from corral.cli.data import storage_limits

        with client() as c:
            c.set_storage_quota("group", name, **storage_limits(storage, files))
        others = (gpus, max_gpus, user_max, cpus, cpus_max, memory, memory_max)
        if all(option is None for option in others):
            out.print(f"group {name}: storage quota set")
            return
    fields: dict[str, float | None] = {}
    for key, value in (
        ("user_max_gpus", _limit(user_max, "--user-max", _count)),
        ("cpus_max", _limit(cpus_max, "--cpus-max", _cpus)),
        ("memory_max_mib", _limit(memory_max, "--memory-max", _memory)),
    ):
        if not isinstance(value, Keep):
            fields[key] = value
    if cpus is not None:
        fields["cpus_guaranteed"] = cpus
    if memory is not None:
        guaranteed_mib = _limit(memory, "--memory", _memory)
        fields["memory_guaranteed_mib"] = guaranteed_mib if isinstance(guaranteed_mib, int) else 0
    max_value = _limit(max_gpus, "--max", _count)
    if gpus is None and isinstance(max_value, Keep) and not fields:
        raise typer.BadParameter("give at least one quota option (see --help)")
    with client() as c:
        group = c.set_quota(name, gpu_model=model, guaranteed=gpus, max_gpus=max_value, **fields)
    if output is Output.json:
        print_json(group)
        return
    out.print(f"group {name}: quotas set")
    for text in group.get("warnings") or ():
        out.print(f"[yellow]warning:[/yellow] {text}", highlight=False)


# --- users and tokens ---------------------------------------------------------------------------

user_app = typer.Typer(help="Users (admin), default groups and passwords.", no_args_is_help=True)


@user_app.command("ls")
@friendly_errors
def user_ls(output: OutputOpt = Output.table) -> None:
    """List users (admin)."""
    with client() as c:
        users = c.users()
    if output is Output.json:
        print_json(users)
        return
    table = Table("USER", "ROLE", "DEFAULT GROUP", "GROUPS", box=None)
    for u in users:
        groups = ", ".join(g["name"] + (" (admin)" if g["role"] == "admin" else "") for g in u["groups"])
        table.add_row(u["name"], u["role"], u["default_group"] or "-", groups or "-")
    out.print(table)


@user_app.command("create")
@friendly_errors
def user_create(
    name: str,
    group: Annotated[
        list[str] | None, typer.Option("--group", "-g", help="repeat for several groups")
    ] = None,
    default_group: Annotated[str | None, typer.Option(help="default: the first --group")] = None,
    admin: Annotated[bool, typer.Option("--admin", help="make the user an administrator")] = False,
    password: Annotated[
        str | None, typer.Option(help="for the web portal; omit for token-only users")
    ] = None,
    token: Annotated[bool, typer.Option("--token", help="also create an API token and print it")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Create a user (admin)."""
    with client() as c:
        user = c.create_user(
            name, password=password, is_admin=admin, groups=group or [], default_group=default_group
        )
        secret = c.create_token("cli", user=name)["token"] if token else None
    if output is Output.json:
        print_json({**user, "token": secret} if token else user)
        return
    out.print(f"user {name} created")
    if secret:
        out.print(f"API token (shown once): {secret}")


@user_app.command("add-to-group")
@friendly_errors
def user_add_to_group(
    name: str,
    group: str,
    group_admin: Annotated[bool, typer.Option("--admin", help="as an admin of the group")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Add user NAME to GROUP (admin, or an admin of GROUP)."""
    with client() as c:
        member = c.add_member(group, name, "admin" if group_admin else "member")
    print_json(member) if output is Output.json else out.print(f"{name} is now {member['role']} of {group}")


@user_app.command("default-group")
@friendly_errors
def user_default_group(name: str, group: str, output: OutputOpt = Output.table) -> None:
    """Set the group USER's jobs go to when their spec names none (admin, or yourself)."""
    with client() as c:
        user = c.set_default_group(name, group)
    print_json(user) if output is Output.json else out.print(f"{name}'s default group is now {group}")


@user_app.command("passwd")
@friendly_errors
def user_passwd(
    name: Annotated[str | None, typer.Argument(metavar="[USER]", help="default: yourself")] = None,
    password_stdin: Annotated[
        bool,
        typer.Option(
            "--password-stdin",
            help="read the new password from the first line of stdin (and your current one, when "
            "changing your own as a non-admin, from the second)",
        ),
    ] = False,
) -> None:
    """Set the portal password of USER (admin) or your own."""
    with client() as c:
        me = c.me()
        target = name or me["name"]
        needs_current = target == me["name"] and me["role"] != "admin"
        if password_stdin:
            lines = sys.stdin.read().splitlines()
            password = lines[0] if lines else ""
            current = lines[1] if needs_current and len(lines) > 1 else None
        else:
            current = (
                typer.prompt("Current password (empty if you have none)", hide_input=True, default="")
                if needs_current
                else None
            )
            password = typer.prompt(f"New password for {target}", hide_input=True, confirmation_prompt=True)
        if not password:
            raise CorralError("the new password is empty")
        c.set_password(target, password, current_password=current or None)
    out.print(f"password of {target} set")


token_app = typer.Typer(help="Your API tokens.", no_args_is_help=True)


@token_app.command("create")
@friendly_errors
def token_create(
    name: Annotated[str, typer.Option(help="a label to recognise it")] = "cli",
    user: Annotated[str | None, typer.Option(help="admins: for another user")] = None,
    expires_in_days: Annotated[
        float | None, typer.Option(help="default: the server's (CORRAL_TOKEN_DEFAULT_LIFETIME_DAYS)")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Create an API token; the secret is printed once."""
    with client() as c:
        token = c.create_token(name, user=user, expires_in_days=expires_in_days)
    print_json(token) if output is Output.json else out.print(token["token"])


@token_app.command("ls")
@friendly_errors
def token_ls(output: OutputOpt = Output.table) -> None:
    """List your API tokens (prefixes only)."""
    with client() as c:
        tokens = c.tokens()
    if output is Output.json:
        print_json(tokens)
        return
    table = Table("ID", "NAME", "PREFIX", "CREATED", "LAST USED", "REVOKED", box=None)
    for t in tokens:
        table.add_row(
            str(t["id"]),
            t["name"],
            t["prefix"],
            when(t["created_at"]),
            ago(t["last_used_at"]),
            "yes" if t["revoked_at"] else "",
        )
    out.print(table)


@token_app.command("revoke")
@friendly_errors
def token_revoke(
    token_id: Annotated[int, typer.Argument(metavar="ID", help="see `corral token ls`")],
) -> None:
    """Revoke one of your API tokens (admins: anyone's) by its id; it stops working at once."""
    with client() as c:
        c.revoke_token(token_id)
    out.print(f"token {token_id} revoked")


# --- server -------------------------------------------------------------------------------------


def up(
    demo: Annotated[
        bool, typer.Option("--demo", help="demo users, groups and an example training job")
    ] = False,
    host: Annotated[str | None, typer.Option(help="listen address (default 127.0.0.1)")] = None,
    port: Annotated[int | None, typer.Option(help="listen port (default 8080)")] = None,
    virtual_gpus: Annotated[int | None, typer.Option(help="declare N virtual GPUs instead of NVML")] = None,
    gpu_model: Annotated[str | None, typer.Option(help="model name of the virtual GPUs")] = None,
    database_url: Annotated[str | None, typer.Option(help="default: SQLite under $CORRAL_HOME")] = None,
    ssl_certfile: Annotated[Path | None, typer.Option(help="serve HTTPS with this PEM certificate")] = None,
    ssl_keyfile: Annotated[Path | None, typer.Option(help="the certificate's private key (PEM)")] = None,
) -> None:
    """Start the Corral server (API, control loops and the engine: local by default, CORRAL_ENGINE=slurm)."""
    from corral.config import Settings

    overrides: dict[str, Any] = {
        k: v
        for k, v in {
            "host": host,
            "port": port,
            "virtual_gpus": virtual_gpus,
            "gpu_model": gpu_model,
            "database_url": database_url,
            "ssl_certfile": ssl_certfile,
            "ssl_keyfile": ssl_keyfile,
        }.items()
        if v is not None
    }
    try:
        settings = Settings(**overrides)
    except ValueError as exc:  # pydantic's ValidationError: name the setting, no traceback
        err.print(f"[red]error:[/red] {exc}", markup=True, highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    from corral.server.run import serve  # lazy: the CLI must not import the server to run `ls`

    serve(settings, demo=demo)


def register(app: typer.Typer) -> None:
    """Add this area's commands to the root `corral` app."""
    app.command()(up)
    app.command()(submit)
    app.command()(ls)
    app.command()(show)
    app.command()(why)
    app.command()(logs)
    app.command()(cancel)
    app.command()(rm)
    app.add_typer(node_app, name="node")
    app.add_typer(group_app, name="group")
    app.add_typer(user_app, name="user")
    app.add_typer(token_app, name="token")
