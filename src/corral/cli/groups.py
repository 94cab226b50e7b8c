"""Group commands: `corral group ls|create|quota` (storage quotas through corral.cli.data)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, client, friendly_errors, out, plain, print_json
from corral.cli.data import storage_limits, storage_quota_line, usage_cell
from corral.sdk import KEEP, Keep
from corral.spec import parse_memory_mib
from corral.words import plural

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
    return usage_cell(row)


def _settings_cell(group: dict[str, Any]) -> str:
    """The group-wide settings, one a line: "weight 2", "borrowing" (or "no borrowing"), and
    "8 GPUs/user" when each user is capped."""
    lines = [f"weight {group['weight']:g}", "borrowing" if group["borrowing"] else "no borrowing"]
    if group.get("user_max_gpus") is not None:
        lines.append(f"{plural(group['user_max_gpus'], 'GPU')}/user")
    return "\n".join(lines)


@group_app.command("ls")
@friendly_errors
def group_ls(output: OutputOpt = Output.table) -> None:
    """List groups (all for admins, yours otherwise): per GPU model used/guaranteed/max and how
    many of the used GPUs are borrowed; CPUs and memory used/guaranteed/max; storage used/max;
    weight, borrowing and per-user GPU cap; warnings."""
    with client() as c:
        groups = c.groups()
        storage = {r["name"]: r for r in c.storage_usage() if r["scope"] == "group"}
    if output is Output.json:
        print_json(groups)
        return
    # Seven columns with short headers, the group-wide settings in one, the legend below: nine
    # columns with long headers did not fit 80, and Rich cut headers and cells ("used/gu…",
    # "(4 borrowe…").
    table = Table("GROUP", "GPUS", "CPUS", "MEMORY", "STORAGE", "SETTINGS", "MEMBERS", box=None)
    warnings: dict[str, None] = {}
    for g in groups:
        members = "-" if g.get("members") is None else str(len(g["members"]))
        table.add_row(
            g["name"],
            _gpu_cell(g),
            _resource_cell(g["usage"]["cpus"]),
            _resource_cell(g["usage"]["memory_mib"], 1 / 1024, "G"),
            _storage_cell(storage.get(g["name"])),
            _settings_cell(g),
            members,
        )
        warnings.update(dict.fromkeys(g.get("warnings") or ()))
    out.print(table)
    out.print(
        "GPUS (per GPU model), CPUS, MEMORY: used/guaranteed/max; borrowed: GPUs used beyond the "
        "guarantee. STORAGE: used / max. SETTINGS: fair-share weight, borrowing, GPUs per user"
    )
    for text in warnings:
        out.print(f"[yellow]warning:[/yellow] {plain(text)}", markup=True, highlight=False)


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
    try:
        n = int(value)
    except ValueError:  # int()'s own words ("invalid literal for int() with base 10") name no option
        raise ValueError(f"{value!r} is not a whole number (or 'none')") from None
    if n < 0:
        raise ValueError(f"{value} is less than 0")
    return n


def _cpus(value: str) -> float:
    try:
        n = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number of CPUs (or 'none')") from None
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
    model: Annotated[
        str, typer.Option("--model", help="GPU model; '*' = the models without a quota of their own")
    ] = "*",
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
    weight: Annotated[float | None, typer.Option(help="fair-share weight")] = None,
    borrowing: Annotated[
        bool | None, typer.Option("--borrowing/--no-borrowing", help="may (not) borrow idle quota")
    ] = None,
    clear: Annotated[
        bool, typer.Option("--clear", help="remove the GPU quota of --model (alone, with --model)")
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Set a group's quotas (admin): only the options given change.

    --clear removes the group's GPU quota of --model instead (the model then falls under the
    group's '*' quota, if any). A '*' --max does not cap a model with a quota of its own (that
    quota's --max does; none: no limit): a warning names such models."""
    # Every option is read before anything is sent: a bad one must not leave the storage quota
    # (a request of its own) changed behind its error.
    fields = _group_fields(user_max, cpus, cpus_max, memory, memory_max, weight, borrowing)
    max_value = _limit(max_gpus, "--max", _count)
    limits = None if storage is None and files is None else storage_limits(storage, files)  # corral.cli.data
    quota = gpus is not None or not isinstance(max_value, Keep) or bool(fields)
    if clear:
        if quota or limits is not None:
            raise typer.BadParameter("--clear takes no other quota option than --model")
        _clear_quota(name, model, output)
        return
    if not quota and limits is None:
        raise typer.BadParameter("give at least one quota option (see --help)")
    with client() as c:
        # The group's quotas first: the server checks them (a max below the guarantee, say), and a
        # refusal must not leave the storage quota set behind it, which only a missing group
        # refuses (caught by the first request already).
        group = (
            c.set_quota(name, gpu_model=model, guaranteed=gpus, max_gpus=max_value, **fields)
            if quota
            else None
        )
        account = c.set_storage_quota("group", name, **limits) if limits is not None else None
    # "group vision: storage quota set" said neither the quota nor what the group holds.
    if group is None:
        assert account is not None
        if output is Output.json:
            print_json(account)
        else:
            out.print(storage_quota_line("group", name, account))
        return
    if account is not None and output is not Output.json:
        out.print(storage_quota_line("group", name, account))
    _print_quota_change(group, output, f"group {name}: quotas set")


def _group_fields(
    user_max: str | None, cpus: float | None, cpus_max: str | None, memory: str | None,
    memory_max: str | None, weight: float | None, borrowing: bool | None,
) -> dict[str, float | None]:  # fmt: skip
    """The group-wide settings `corral group quota` was given, as PUT /groups/{name}/quota names them."""
    fields: dict[str, float | None] = {}
    for key, value in (
        ("user_max_gpus", _limit(user_max, "--user-max", _count)),
        ("cpus_max", _limit(cpus_max, "--cpus-max", _cpus)),
        ("memory_max_mib", _limit(memory_max, "--memory-max", _memory)),
    ):
        if not isinstance(value, Keep):
            fields[key] = value
    for key, given in (("cpus_guaranteed", cpus), ("weight", weight), ("borrowing", borrowing)):
        if given is not None:
            fields[key] = given
    if memory is not None:
        guaranteed_mib = _limit(memory, "--memory", _memory)
        fields["memory_guaranteed_mib"] = guaranteed_mib if isinstance(guaranteed_mib, int) else 0
    return fields


def _clear_quota(name: str, model: str, output: Output) -> None:
    """`corral group quota G --model M --clear`: DELETE /groups/{name}/quota?gpu_model=M."""
    with client() as c:
        group = c.remove_quota(name, model)
    _print_quota_change(group, output, f"group {name}: GPU quota of {model} removed")


def _print_quota_change(group: dict[str, Any], output: Output, done: str) -> None:
    """The group as changed (-o json), or what was done and the quota warnings it now has."""
    if output is Output.json:
        print_json(group)
        return
    out.print(done)
    for text in group.get("warnings") or ():
        out.print(f"[yellow]warning:[/yellow] {plain(text)}", markup=True, highlight=False)


def register(app: typer.Typer) -> None:
    """Add `corral group` to the root `corral` app."""
    app.add_typer(group_app, name="group")
