"""`corral env`: the environments catalogue (ls, show, create, rm). A job selects one with
`environment: NAME[@VERSION]` in its spec; see docs/catalogues.md, "Environments"."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, print_json
from corral.environments.store import DEFAULT_ENVIRONMENT
from corral.sdk import CorralError

env_app = typer.Typer(
    help="Python environments for jobs (`environment: NAME` or `NAME@VERSION` in a spec), built with uv.",
    no_args_is_help=True,
)


def _ref(name: str) -> tuple[str, int | None]:
    base, _, version = name.partition("@")
    if version and not version.isdigit():
        raise CorralError(f"{name!r}: write NAME or NAME@VERSION (a number)")
    return base, int(version) if version else None


@env_app.command("ls")
@friendly_errors
def list_envs(output: OutputOpt = Output.table) -> None:
    """The environments you may use: `default` (the server's own, always there), then the
    catalogue's (official first), with their newest ready version."""
    with client() as c:
        rows: list[dict[str, Any]] = c.environments()
    if output is Output.json:
        print_json(rows)  # the catalogue's, as GET /environments answers
        return
    table = Table("NAME", "READY", "VERSIONS", "VISIBILITY", "OWNER", "CREATED", box=None)
    # `default` is no catalogue entry (nothing to build or version), yet jobs and workspaces
    # take `--env default` (their default): listed first, so the name the texts give is here.
    table.add_row(f"{DEFAULT_ENVIRONMENT} (the server's)", "always", "-", "everyone", "-", "-")
    for e in rows:
        name = f"{e['name']} (official)" if e["official"] else e["name"]
        ready = f"@{e['latest_ready']}" if e["latest_ready"] else "-"
        states = ", ".join(f"{v['version']}:{v['state']}" for v in e["versions"][-3:])
        vis = f"group {e['group']}" if e["visibility"] == "group" else e["visibility"]
        table.add_row(name, ready, states, vis, e["owner"], ago(e["created_at"]))
    out.print(table)


@env_app.command("show")
@friendly_errors
def show_env(
    name: Annotated[str, typer.Argument(help="NAME, or NAME@VERSION for one version with its lock")],
    output: OutputOpt = Output.table,
) -> None:
    """An environment's versions (state, lock hash, cache hit, build job), or one version."""
    base, version = _ref(name)
    with client() as c:
        found = c.environment(base) if version is None else c.environment_version(base, version)
    if output is Output.json:
        print_json(found)
        return
    versions = found["versions"] if version is None else [found]
    if version is None:
        out.print(
            f"[bold]{found['name']}[/bold]  owner {found['owner']}, {found['visibility']}"
            + (", official" if found["official"] else ""),
            markup=True,
        )
    for v in versions:
        hit = " (cache hit)" if v["cache_hit"] else ""
        key = (v["cache_key"] or "")[:12]
        python = f"python {v['python']} ({v['interpreter'] or 'the server base interpreter'})"
        job = f"build job {v['build_job_id']}"
        out.print(f"  {v['ref']}  {v['state']}{hit}  lock {key or '-'}  {python}  {job}")
        if v["state"] == "failed" and v["error"]:
            out.print(v["error"], markup=False, highlight=False)
    if version is not None and found["lock"]:
        out.print(found["lock"], markup=False, highlight=False)


@env_app.command("create")
@friendly_errors
def create_env(
    name: Annotated[str, typer.Argument(help="the environment's name (a new version if it exists)")],
    requirements: Annotated[
        Path | None, typer.Option("--requirements", "-r", help="a requirements.txt ('-': stdin)")
    ] = None,
    pyproject: Annotated[
        Path | None,
        typer.Option("--pyproject", help="a pyproject.toml whose \\[project] dependencies to use"),
    ] = None,
    visibility: Annotated[str, typer.Option(help="private | group | public")] = "private",
    group: Annotated[str | None, typer.Option("--group", "-g", help="the group it is shared with")] = None,
    official: Annotated[bool, typer.Option(help="admins: list it as official")] = False,
    description: Annotated[str, typer.Option(help="one line about it")] = "",
    wait: Annotated[bool, typer.Option(help="wait for the build; print its log if it fails")] = True,
) -> None:
    """Build a new version from a requirements file or a pyproject (a build job runs as you)."""
    if (requirements is None) == (pyproject is None):
        raise CorralError("give exactly one of --requirements or --pyproject")
    path = requirements if requirements is not None else pyproject
    assert path is not None
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text()
    except OSError as exc:
        raise CorralError(f"cannot read {path}: {exc.strerror}")
    kind = "requirements" if requirements is not None else "pyproject"
    with client() as c:
        v = c.create_environment(
            name, text, source_kind=kind, visibility=visibility, group=group,
            official=official, description=description,
        )  # fmt: skip
        out.print(f"{v['ref']}: building (build job {v['build_job_id']})")
        if not wait:
            return
        v = c.wait_environment(name, v["version"])
        if v["state"] == "ready":
            hit = ", cache hit: nothing was installed" if v["cache_hit"] else ""
            out.print(f"{v['ref']}: ready, lock {v['cache_key'][:12]}{hit}")
            return
        log = c.logs(v["build_job_id"])["data"] if v["build_job_id"] else ""
        out.print(log or v["error"], markup=False, highlight=False)
    raise CorralError(f"{v['ref']}: the build failed (log above; `corral logs {v['build_job_id']}`)")


@env_app.command("rm")
@friendly_errors
def remove_env(name: Annotated[str, typer.Argument(help="NAME (all versions) or NAME@VERSION")]) -> None:
    """Delete an environment or one version (refused while an active job runs in it)."""
    base, version = _ref(name)
    with client() as c:
        c.delete_environment(base, version)
    out.print(f"environment {name} deleted")


def register(app: typer.Typer) -> None:
    app.add_typer(env_app, name="env")
