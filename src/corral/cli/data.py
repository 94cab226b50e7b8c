"""`corral data ...` (datasets: push with a progress bar, pull, ls, show, versions, rm, share,
import) and `corral storage ...` (usage vs quota, quotas of users)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, print_json, when
from corral.datasets.names import BadName, human_bytes, parse_bytes, parse_ref
from corral.sdk import KEEP, Keep
from corral.words import plural

data_app = typer.Typer(
    help="Datasets: named, versioned, shared read-only; jobs mount data/NAME or data/NAME@VERSION.",
    no_args_is_help=True,
)
storage_app = typer.Typer(help="Storage usage, quotas and identities (uids/gids).", no_args_is_help=True)


def _ref(text: str) -> tuple[str, int | None]:
    try:
        return parse_ref(text)
    except BadName as exc:
        raise typer.BadParameter(str(exc))


class _TransferBar:
    """A transfer's progress bar, started at its first progress report: one started before the
    transfer left an empty bar ("push x ━━━ 0/? bytes ?") above the error of a refusal that came
    before any byte moved (no such dataset or version, not a directory)."""

    def __init__(self, description: str) -> None:
        self.description = description
        self.bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
        )
        self.task: TaskID | None = None

    def __call__(self, done: int, total: int) -> None:
        if self.task is None:
            self.bar.start()
            self.task = self.bar.add_task(self.description, total=total)
        self.bar.update(self.task, completed=done, total=total)

    def __enter__(self) -> _TransferBar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.task is not None:
            self.bar.stop()


@data_app.command("push")
@friendly_errors
def data_push(
    name: str,
    directory: Annotated[Path, typer.Argument(help="the directory to upload as the next version")],
    group: Annotated[
        str | None, typer.Option("--group", "-g", help="owned by this group (default: you)")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Upload DIRECTORY as the next version of dataset NAME: chunked, checksummed (sha256 per
    file), atomic (the version appears only when complete). Interrupted? Run it again: it
    resumes where it stopped."""
    with client() as c, _TransferBar(f"push {name}") as bar:
        version = c.push_dataset(name, directory, group=group, progress=bar)
    if output is Output.json:
        print_json(version)
        return
    resumed = " (resumed)" if version.get("resumed") else ""
    size = human_bytes(version["bytes"])
    out.print(f"dataset {name} v{version['version']}: {plural(version['files'], 'file')}, {size}{resumed}")


@data_app.command("pull")
@friendly_errors
def data_pull(
    ref: Annotated[str, typer.Argument(help="NAME or NAME@VERSION (default: the latest)")],
    directory: Annotated[Path, typer.Argument(help="where to put the files")],
) -> None:
    """Download a version's files into DIRECTORY, each checked against its sha256."""
    name, version = _ref(ref)
    with client() as c, _TransferBar(f"pull {ref}") as bar:
        got = c.pull_dataset(name, directory, version=version, progress=bar)
    out.print(
        f"dataset {name} v{got['version']}: {plural(got['files'], 'file')}, "
        f"{human_bytes(got['bytes'])} in {directory}"
    )


def _owner(ds: dict[str, Any]) -> str:
    owner = ds["owner"]
    return f"group {owner['group']}" if owner.get("group") else f"user {owner['user']}"


def _access(ds: dict[str, Any]) -> str:
    if ds["public"]:
        return "everyone"
    return ", ".join(ds["shared_with"]) or "-"


@data_app.command("ls")
@friendly_errors
def data_ls(output: OutputOpt = Output.table) -> None:
    """Datasets you may read: yours, your groups', shared with you, public."""
    with client() as c:
        rows = c.datasets()
    if output is Output.json:
        print_json(rows)
        return
    if not rows:  # a bare header read as a failed listing
        out.print("no datasets you may read yet: `corral data push NAME DIR` makes one")
        return
    table = Table("NAME", "OWNER", "LATEST", "VERSIONS", "SIZE", "FILES", "SHARED WITH", box=None)
    for ds in rows:
        latest = f"v{ds['latest']}" if ds["latest"] else "-"
        table.add_row(
            ds["name"],
            _owner(ds),
            latest,
            str(ds["versions_count"]),
            human_bytes(ds["bytes"]),
            str(ds["files"]),
            _access(ds),
        )
    out.print(table)


@data_app.command("show")
@friendly_errors
def data_show(name: str, output: OutputOpt = Output.table) -> None:
    """A dataset: owner, sharing, and its versions."""
    with client() as c:
        ds = c.dataset(name)
    if output is Output.json:
        print_json(ds)
        return
    out.print(f"dataset {ds['name']}  owner: {_owner(ds)}  shared with: {_access(ds)}", highlight=False)
    mount = f"data/{ds['name']} or data/{ds['name']}@VERSION"
    out.print(f"created {when(ds['created_at'])} by {ds['created_by']}; mount as {mount}", highlight=False)
    _versions_table(ds)


def _versions_table(ds: dict[str, Any]) -> None:
    table = Table("VERSION", "SIZE", "FILES", "DIGEST", "SOURCE", "CREATED", "BY", box=None)
    for v in ds["versions"]:
        table.add_row(
            f"v{v['version']}", human_bytes(v["bytes"]), str(v["files"]), v["digest"][:16], v["source"],
            when(v["created_at"]), v["created_by"],
        )  # fmt: skip
    out.print(table)


@data_app.command("versions")
@friendly_errors
def data_versions(name: str, output: OutputOpt = Output.table) -> None:
    """A dataset's versions."""
    with client() as c:
        ds = c.dataset(name)
    print_json(ds["versions"]) if output is Output.json else _versions_table(ds)


@data_app.command("rm")
@friendly_errors
def data_rm(ref: Annotated[str, typer.Argument(help="NAME (every version) or NAME@VERSION")]) -> None:
    """Delete a version or a whole dataset (refused while a job that has not ended uses it)."""
    name, version = _ref(ref)
    with client() as c:
        c.delete_dataset(name, version)
    out.print(f"deleted dataset {name}" + (f" v{version}" if version else ""))


@data_app.command("share")
@friendly_errors
def data_share(
    name: str,
    group: Annotated[
        list[str] | None,
        typer.Option("--group", "-g", help="give this group read access (one of yours; an admin: any)"),
    ] = None,
    remove: Annotated[
        list[str] | None, typer.Option("--remove", help="take this group's read access away")
    ] = None,
    public: Annotated[
        bool | None, typer.Option("--public/--private", help="readable by everyone, or not")
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Share a dataset read-only with groups or everyone (owner, its group's admins, admins)."""
    if not group and not remove and public is None:
        raise typer.BadParameter("give --group, --remove, --public or --private")
    with client() as c:
        ds = c.share_dataset(name, add_groups=group, remove_groups=remove, public=public)
    if output is Output.json:
        print_json(ds)
    elif ds["public"] or ds["shared_with"]:
        out.print(f"dataset {name}: readable by {_access(ds)} (and its owner)")
    else:  # was "readable by - (and its owner)"
        out.print(f"dataset {name}: readable only by its owner ({_owner(ds)})")


@data_app.command("import")
@friendly_errors
def data_import(
    name: str,
    path: Annotated[str, typer.Argument(help="a directory on the server under CORRAL_DATASET_IMPORT_ROOTS")],
    group: Annotated[
        str | None, typer.Option("--group", "-g", help="owned by this group (default: you)")
    ] = None,
) -> None:
    """Admins: a new version copied from a server-side directory."""
    with client() as c:
        v = c.import_dataset(name, path, group=group)
    out.print(f"dataset {name} v{v['version']}: {plural(v['files'], 'file')}, {human_bytes(v['bytes'])}")


# --- storage ------------------------------------------------------------------------------------


def limit_text(used: float, limit: float | None, fmt: Any = str) -> str:
    return f"{fmt(used)} / {'-' if limit is None else fmt(limit)}"


def usage_cell(row: dict[str, Any]) -> str:
    """Bytes used / quota, and files used / quota on a second line ("-": no quota)."""
    used = limit_text(row["used_bytes"], row["max_bytes"], human_bytes)
    return f"{used}\n{limit_text(row['used_files'], row['max_files'])} files"


@storage_app.command("usage")
@friendly_errors
def storage_usage(output: OutputOpt = Output.table) -> None:
    """Storage used vs quota per user and group (datasets, plus the background scan of home and
    group directories)."""
    with client() as c:
        rows = c.storage_usage()
    if output is Output.json:
        print_json(rows)
        return
    # One column for bytes and files, used / quota (as `group ls` gives them), SCANNED as an age
    # ("10m ago"), the short columns never wrapped and a name folded, not cut: at 80 columns the
    # timestamp "2026-11-30 06:25:18" wrapped in every row, "703.0 GiB / 2.0 TiB" broke after
    # "2.0" and a group's name read "vision-rese…".
    if not rows:  # a fresh server: a bare header said neither why nor when figures come
        out.print(
            "nothing counted yet: a dataset or model version counts once pushed or registered, homes "
            "and group dirs once the background scan has walked them (every "
            "CORRAL_STORAGE_SCAN_INTERVAL_S, 600 s by default, from the first job that made them)"
        )
        return
    table = Table("SCOPE", "NAME", "USED / QUOTA", "DATASETS", "SCANNED", "OVER", box=None, pad_edge=False)
    for number in (0, 2, 3, 4, 5):
        table.columns[number].no_wrap = True
    table.columns[1].overflow = "fold"
    for r in rows:
        table.add_row(
            r["scope"], r["name"], usage_cell(r), human_bytes(r["dataset_bytes"]), ago(r["scanned_at"]),
            "yes" if r["over_quota"] else "",
        )  # fmt: skip
    out.print(table)


def file_count(value: str) -> int:
    """--files: a whole number >= 0 (Python's "invalid literal for int() with base 10" said
    neither which option nor what to write, and a negative one was refused by its API name)."""
    try:
        count = int(value.strip())
    except ValueError:
        count = -1
    if count < 0:
        raise ValueError(
            f"--files {value!r} is not a number of files: write a whole number such as 1000000, or none"
        )
    return count


def storage_limits(storage: str | None, files: str | None) -> dict[str, int | Keep | None]:
    """--storage / --files option values -> set_storage_quota keywords ('none' = no limit)."""
    fields: dict[str, int | Keep | None] = {"max_bytes": KEEP, "max_files": KEEP}
    for key, value, parse in (("max_bytes", storage, parse_bytes), ("max_files", files, file_count)):
        if value is None:
            continue
        if value.strip().lower() in ("none", "unlimited", "-"):
            fields[key] = None
            continue
        try:
            fields[key] = parse(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc))
    return fields


@storage_app.command("quota")
@friendly_errors
def storage_quota(
    scope: Annotated[str, typer.Argument(help="user or group")],
    name: str,
    storage: Annotated[
        str | None, typer.Option("--storage", help="bytes, e.g. 2TiB; 'none' = no limit")
    ] = None,
    files: Annotated[str | None, typer.Option("--files", help="number of files; 'none' = no limit")] = None,
) -> None:
    """Set a user's or a group's storage quota (admin)."""
    if storage is None and files is None:
        raise typer.BadParameter("give --storage and/or --files")
    with client() as c:
        row = c.set_storage_quota(scope, name, **storage_limits(storage, files))
    out.print(storage_quota_line(scope, name, row))


def storage_quota_line(scope: str, name: str, row: dict[str, Any]) -> str:
    """An account's quota as just set, beside its usage: "group vision: storage 21 B / 2.0 TiB,
    files 14 / 1000000" (`corral storage quota` and `corral group quota --storage` alike)."""
    bytes_text = limit_text(row["used_bytes"], row["max_bytes"], human_bytes)
    return f"{scope} {name}: storage {bytes_text}, files {limit_text(row['used_files'], row['max_files'])}"


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
    app.add_typer(storage_app, name="storage")
