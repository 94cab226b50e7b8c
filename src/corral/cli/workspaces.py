"""`corral ws`: interactive workspaces (docs/workspaces.md): create, ls, show, open, ssh, stop,
start, rm, and the admins' idle timeouts per group (policy, policies)."""

from __future__ import annotations

import os
import shutil
import webbrowser
from typing import Annotated, Any
from urllib.parse import urlsplit

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, print_json, when
from corral.sdk import CorralError
from corral.spec import MAX_CPUS_PER_INSTANCE, MAX_GPUS_PER_INSTANCE, duration_text
from corral.words import plural

ws_app = typer.Typer(
    help="Interactive workspaces: JupyterLab through Corral, SSH through its gateway.", no_args_is_help=True
)
UserOpt = Annotated[str | None, typer.Option("--user", "-u", help="another user's workspace (admins)")]
NameArg = Annotated[str, typer.Argument(help="the workspace's name")]


def _describe(ws: dict[str, Any]) -> str:
    gpus = plural(ws["gpus"], "GPU") if ws["gpus"] else "no GPU"
    if ws["gpu_model"]:
        gpus += f" ({ws['gpu_model']})"
    return f"{gpus}, {plural(float(ws['cpus']), 'CPU')}, {_memory(ws['memory_mib'])}"


def _memory(mib: int) -> str:
    """As it was asked for: `--memory 16GiB` shows as 16GiB, not 16384 MiB."""
    return f"{mib // 1024}GiB" if mib % 1024 == 0 else f"{mib}MiB"


def _state(ws: dict[str, Any]) -> str:
    """The workspace's state, and when the idle policy stopped it: "stopped (idle, 2h ago)"."""
    at = ws.get("idle_stopped_at")
    return ws["state"] if at is None else f"{ws['state']} (idle, {ago(at)})"


def _print_one(ws: dict[str, Any], server: str) -> None:
    out.print(f"[bold]{ws['name']}[/bold] ({ws['user']}, group {ws['group']}): {ws['state']}", markup=True)
    out.print(f"  resources    {_describe(ws)}; environment {ws['environment']}")
    out.print(f"  idle timeout {duration_text(ws['idle_timeout_s'])}")
    if ws["job_id"] is not None:
        out.print(f"  job          {ws['job_id']} ({ws['job_state']})")
    if ws.get("idle_stopped_at") is not None:
        out.print(
            f"  stopped      for being idle, at {when(ws['idle_stopped_at'])}"
            f" (`corral ws start {ws['name']}` brings it back)"
        )
    if ws["waiting"]:
        out.print(f"  waiting      {ws['waiting']['message']}")
    if ws.get("failure"):
        out.print(f"  failed       {ws['failure']}", highlight=False)
        out.print(f"               `corral show {ws['job_id']}` has its attempts")
    out.print(f"  JupyterLab   {server}{ws['url']}")
    host = urlsplit(server).hostname or "localhost"
    out.print(f"  ssh          ssh -p {ws['ssh_port']} {ws['ssh_user']}@{host}")


# --gpus and --cpus out of range are refused here, naming the option, in words: the API's refusal
# was Pydantic's "Input should be greater than or equal to 0" (and Typer's `min=` says the same).
def _gpu_count(value: int) -> int:
    if not 0 <= value <= MAX_GPUS_PER_INSTANCE:
        raise typer.BadParameter(f"{value} is not a number of GPUs from 0 (none) to {MAX_GPUS_PER_INSTANCE}")
    return value


def _cpu_count(value: float) -> float:
    if not 0 < value <= MAX_CPUS_PER_INSTANCE:  # NaN too
        raise typer.BadParameter(
            f"{value:g} is not a number of CPU cores over 0 and up to {MAX_CPUS_PER_INSTANCE} "
            "(a fraction of a core, e.g. 0.5, is fine)"
        )
    return value


@ws_app.command("create")
@friendly_errors
def create(
    name: Annotated[str | None, typer.Argument(help="default: workspace, workspace-2, ...")] = None,
    gpus: Annotated[int, typer.Option("--gpus", callback=_gpu_count, help="GPUs")] = 0,
    gpu_model: Annotated[str | None, typer.Option("--gpu-model", help="e.g. A100 or 'A100|H100'")] = None,
    cpus: Annotated[
        float, typer.Option("--cpus", callback=_cpu_count, help="CPU cores, e.g. 0.5 or 8")
    ] = 1.0,
    memory: Annotated[str, typer.Option("--memory", help="e.g. 16GiB")] = "4GiB",
    environment: Annotated[
        str,
        typer.Option(
            "--environment",
            help="'default' (the server's own interpreter) or a catalogue environment, NAME or NAME@VERSION "
            "(corral env ls); it must contain jupyterlab and corral (refused otherwise)",
        ),
    ] = "default",
    idle_timeout: Annotated[
        str | None, typer.Option("--idle-timeout", help="e.g. 2h; default: your group's")
    ] = None,
    group: Annotated[str | None, typer.Option("--group", "-g", help="default: your default group")] = None,
    stopped: Annotated[bool, typer.Option("--stopped", help="create it without starting it")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Create a workspace and start it (a job of kind workspace, queued like any job)."""
    with client() as c:
        ws = c.create_workspace(
            name,
            gpus=gpus,
            gpu_model=gpu_model,
            cpus=cpus,
            memory=memory,
            environment=environment,
            idle_timeout=idle_timeout,
            group=group,
            start=not stopped,
        )
        server = c.url
    if output is Output.json:
        print_json(ws)
        return
    _print_one(ws, server)


@ws_app.command("ls")
@friendly_errors
def list_workspaces(
    user: UserOpt = None,
    all_users: Annotated[bool, typer.Option("--all", help="every user's (admins)")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Your workspaces."""
    with client() as c:
        rows = c.workspaces(user=user, all_users=all_users)
    if output is Output.json:
        print_json(rows)
        return
    table = Table("NAME", "USER", "STATE", "RESOURCES", "JOB", "CREATED", box=None)
    for ws in rows:
        job = str(ws["job_id"]) if ws["job_id"] is not None else "-"
        table.add_row(ws["name"], ws["user"], _state(ws), _describe(ws), job, ago(ws["created_at"]))
    if not rows:  # a header alone read as a listing that failed
        out.print(_none_listed(user, all_users))
        return
    out.print(table)


def _none_listed(user: str | None, all_users: bool) -> str:
    """The line for an empty list: the hint to make one is for one's own list alone."""
    if all_users:
        return "no workspaces of any user"
    if user is not None:
        return f"{user} has no workspaces"
    return "no workspaces (`corral ws create NAME` makes one)"


@ws_app.command("show")
@friendly_errors
def show(name: NameArg, user: UserOpt = None, output: OutputOpt = Output.table) -> None:
    """One workspace: state, why it waits, its JupyterLab URL and ssh command."""
    with client() as c:
        ws = c.workspace(name, user=user)
        server = c.url
    if output is Output.json:
        print_json(ws)
        return
    _print_one(ws, server)


@ws_app.command("open")
@friendly_errors
def open_lab(
    name: NameArg,
    browser: Annotated[bool, typer.Option("--browser", help="also open it in the web browser")] = False,
) -> None:
    """Print the workspace's JupyterLab URL (behind Corral's login; no token in it)."""
    with client() as c:
        ws = c.workspace(name)
        url = f"{c.url}{ws['url']}"
    if ws["state"] != "running":
        out.print(
            f"[yellow]workspace {name} is {ws['state']}[/yellow]; the page answers once it runs", markup=True
        )
    typer.echo(url)
    if browser:
        webbrowser.open(url)


@ws_app.command("ssh", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@friendly_errors
def ssh(ctx: typer.Context, name: NameArg) -> None:
    """Open a shell in the workspace through Corral's SSH gateway (runs `ssh`; extra arguments,
    e.g. `-L 6006:localhost:6006` or a command, are passed on). Register your key first:
    `corral key add ~/.ssh/id_ed25519.pub`."""
    with client() as c:
        ws = c.workspace(name)
        host = urlsplit(c.url).hostname or "localhost"
        # Said here, before ssh runs: the gateway can only answer "Permission denied (publickey)"
        # to a user with no key, and tells a stopped workspace apart only after a login.
        if not c.ssh_keys():
            raise CorralError(
                "you have no SSH key registered, so the gateway lets none of yours in: "
                "`corral key add ~/.ssh/id_ed25519.pub` first (`corral key ls` lists them)"
            )
    if ws["state"] == "stopped":
        raise CorralError(f"workspace {name!r} is stopped: start it with `corral ws start {name}`")
    program = shutil.which("ssh")
    if program is None:
        raise CorralError("the OpenSSH client (ssh) is not installed")
    os.execv(program, ssh_argv(program, ws["ssh_port"], f"{ws['ssh_user']}@{host}", ctx.args))


# ssh(1)'s options that take a value (its getopt string): `-L 6006:localhost:6006` is one option.
_SSH_VALUE_OPTIONS = set("bceilmopBDEFIJLOPQRSwW")


def _takes_next_argument(arg: str) -> bool:
    """For a cluster of short flags (`-v`, `-L`, `-vNL`, `-L6006:x:6006`): whether its last option
    takes a value that is not attached to it (so the next argument is that value)."""
    for i, letter in enumerate(arg[1:], start=1):
        if letter in _SSH_VALUE_OPTIONS:
            return i == len(arg) - 1  # a value attached (`-L6006:...`) ends the cluster
    return False


def ssh_argv(program: str, port: int, destination: str, extra: list[str]) -> list[str]:
    """`ssh -p PORT [options] DESTINATION [command]`: the extra arguments' options go before the
    destination and the rest (a remote command) after it, as ssh reads them."""
    options: list[str] = []
    rest = list(extra)
    while rest and rest[0].startswith("-") and rest[0] != "--":
        arg = rest.pop(0)
        options.append(arg)
        if _takes_next_argument(arg) and rest:
            options.append(rest.pop(0))  # the option's value, given as the next argument
    if rest and rest[0] == "--":
        rest.pop(0)
    return [program, "-p", str(port), *options, destination, *rest]


@ws_app.command("stop")
@friendly_errors
def stop(name: NameArg, user: UserOpt = None) -> None:
    """Stop it: its job ends; the files in your home stay."""
    with client() as c:
        ws = c.stop_workspace(name, user=user)
    out.print(f"workspace {name}: {ws['state']}")


@ws_app.command("start")
@friendly_errors
def start(name: NameArg, user: UserOpt = None) -> None:
    """Start a stopped workspace (a new job)."""
    with client() as c:
        ws = c.start_workspace(name, user=user)
    out.print(f"workspace {name}: {ws['state']} (job {ws['job_id']})")
    if ws["waiting"]:
        out.print(f"  {ws['waiting']['message']}")


@ws_app.command("rm")
@friendly_errors
def remove(name: NameArg, user: UserOpt = None) -> None:
    """Stop it if it runs and remove it; the files in your home stay."""
    with client() as c:
        c.remove_workspace(name, user=user)
    whose = f"{user}'s files stay in their home" if user else "your files stay in your home"
    out.print(f"workspace {name} removed ({whose})")


@ws_app.command("policy")
@friendly_errors
def policy(
    group: Annotated[str, typer.Argument(help="the group")],
    default: Annotated[
        str | None, typer.Option("--default", help="default idle timeout, e.g. 2h; 'server': the server's")
    ] = None,
    maximum: Annotated[
        str | None, typer.Option("--max", help="maximum idle timeout, e.g. 1d; 'server': the server's")
    ] = None,
) -> None:
    """Admin: set a group's default or maximum workspace idle timeout, or both: one left out
    stays as it is (`--max 8h` alone keeps the group's default); 'server' sets one back to the
    server's (CORRAL_WORKSPACE_IDLE_TIMEOUT_S, _MAX_IDLE_TIMEOUT_S)."""
    if default is None and maximum is None:
        raise CorralError("give --default, --max or both")
    given = {"default_idle_timeout": default, "max_idle_timeout": maximum}
    body: dict[str, Any] = {k: None if v == "server" else v for k, v in given.items() if v is not None}
    with client() as c:
        p = c.set_workspace_policy(group, **body)
    out.print(f"group {group}: default {_limit(p, 'default')}, max {_limit(p, 'max')}")


def _limit(policy: dict[str, Any], which: str) -> str:
    """'2h (the group's)' or '... (the server's)': as `--default 2h` is written, not 7200 s."""
    whose = "the group's" if policy.get(f"{which}_idle_timeout_source") == "group" else "the server's"
    return f"{duration_text(policy[f'{which}_idle_timeout_s'])} ({whose})"


@ws_app.command("policies")
@friendly_errors
def policies(output: OutputOpt = Output.table) -> None:
    """Each group's default and maximum idle timeout."""
    with client() as c:
        rows = c.workspace_policies()
    if output is Output.json:
        print_json(rows)
        return
    table = Table("GROUP", "DEFAULT", "MAX", box=None)
    for p in rows:
        table.add_row(p["group"], _limit(p, "default"), _limit(p, "max"))
    out.print(table)


def register(app: typer.Typer) -> None:
    app.add_typer(ws_app, name="ws")
