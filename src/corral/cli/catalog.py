"""Catalogue commands: `corral template ls/show/use/publish/share/rm` (job templates) and
`corral model ls/show/versions/register/pull/promote/compare/share/rm/finetune` (the model
registry). Through the SDK like every command; docs/catalogues.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, client, err, friendly_errors, out, plain, print_json, when
from corral.sdk import CorralError
from corral.words import plural

template_app = typer.Typer(
    help="Job templates: specs with typed parameters (docs/catalogues.md).", no_args_is_help=True
)
model_app = typer.Typer(
    help="The model registry: versions, stages, lineage (docs/catalogues.md).", no_args_is_help=True
)

SetOpt = Annotated[
    list[str] | None, typer.Option("--set", help="a parameter's value, NAME=VALUE (repeat for more)")
]


def _range_text(low: float | None, high: float | None) -> str:
    """A parameter's bounds as written (`1..8`, not the API's floats `1.0..8.0`); one bound alone
    as `>= 1` or `<= 8`."""
    if low is not None and high is not None:
        return f"{low:g}..{high:g}"
    if low is not None:
        return f">= {low:g}"
    return f"<= {high:g}" if high is not None else ""


def parse_sets(items: list[str] | None, option: str = "--set", example: str = "lr=0.1") -> dict[str, str]:
    """`--set lr=0.1 --set gpus=2` -> {"lr": "0.1", "gpus": "2"} (the server coerces the types).
    A malformed item's error names `option`, the option it came from (`--metric` too)."""
    values: dict[str, str] = {}
    for item in items or []:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise CorralError(f"{option} {item!r}: write NAME=VALUE, e.g. {option} {example}")
        values[name.strip()] = value
    return values


def _job_line(job: dict[str, Any]) -> None:
    out.print(
        f"job [bold]{job['id']}[/bold] ({job['name']}) {job['state']} in group {job['group']}", markup=True
    )


@template_app.command("ls")
@friendly_errors
def template_ls(output: OutputOpt = Output.table) -> None:
    """The templates you may use."""
    with client() as c:
        items = c.templates()
    if output is Output.json:
        print_json(items)
        return
    table = Table("NAME", "VERSION", "PARAMETERS", "SHARED", "USES", "OWNER", "DESCRIPTION")
    for t in items:
        shared = t["visibility"] + (f" ({t['group']})" if t["visibility"] == "group" else "")
        params = ", ".join(p["name"] for p in t["parameters"]) or "-"
        table.add_row(
            t["name"], f"v{t['latest']}", params, shared, str(t["uses"]), t["owner"], t["description"]
        )
    out.print(table)


@template_app.command("show")
@friendly_errors
def template_show(
    name: str,
    version: Annotated[int | None, typer.Option("--version", help="default: the latest")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """A template's parameters and spec."""
    with client() as c:
        t = c.template(name, version)
    if output is Output.json:
        print_json(t)
        return
    out.print(
        f"[bold]{t['name']}[/bold] v{t['version']} (latest v{t['latest']}) by {t['owner']}, "
        f"used {plural(t['uses'], 'time')}",
        markup=True,
    )
    if t["description"]:
        out.print(t["description"])
    table = Table("PARAMETER", "TYPE", "DEFAULT", "RANGE / CHOICES", "DESCRIPTION")
    for p in t["parameters"]:
        span = ", ".join(str(c) for c in p.get("choices", [])) or _range_text(p.get("min"), p.get("max"))
        table.add_row(
            p["name"], p["type"], str(p.get("default", "(required)")), span or "-", p.get("description", "")
        )
    out.print(table)
    out.print(
        json.dumps({k: v for k, v in t["spec"].items() if k != "parameters"}, indent=2),
        markup=False,
        highlight=False,
    )


@template_app.command("use")
@friendly_errors
def template_use(
    name: str,
    sets: SetOpt = None,
    version: Annotated[int | None, typer.Option("--version", help="default: the latest")] = None,
    model: Annotated[
        list[str] | None,
        typer.Option("--model", help="mount a model version read-only at /models/NAME (NAME\\[@V])"),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Submit a job from a template, e.g. `corral template use train --set lr=0.1 --set gpus=2`."""
    with client() as c:
        job = c.use_template(name, parse_sets(sets), version=version, models=model or [])
    print_json(job) if output is Output.json else _job_line(job)


@template_app.command("publish")
@friendly_errors
def template_publish(
    name: str,
    file: Annotated[Path | None, typer.Argument(help="the template: a spec with `parameters:`")] = None,
    from_job: Annotated[
        int | None, typer.Option("--from-job", help="save this job's spec as a template")
    ] = None,
    description: Annotated[str | None, typer.Option("--description", help="one line about it")] = None,
    group: Annotated[str | None, typer.Option("--group", help="share with this group")] = None,
    public: Annotated[bool, typer.Option("--public", help="share with everyone")] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Publish a new template (or a new version of yours) from a spec file or a job."""
    if (file is None) == (from_job is None):
        raise CorralError("give a spec file or --from-job JOB (one of them)")
    try:
        text = file.read_text() if file is not None else None
    except OSError as exc:
        raise CorralError(f"cannot read {file}: {exc.strerror}") from None
    with client() as c:
        t = c.publish_template(
            name,
            text,
            from_job=from_job,
            description=description,
            group=group,
            visibility="public" if public else None,
        )
    if output is Output.json:
        print_json(t)
    else:
        out.print(
            f"template [bold]{t['name']}[/bold] v{t['version']} "
            f"({plural(len(t['parameters']), 'parameter')})",
            markup=True,
        )


def shared_text(kind: str, view: dict[str, Any]) -> str:
    """What `share` did, in words: "model digits is group" said neither with whom nor as what."""
    name, visibility = f"{kind} {view['name']}", view["visibility"]
    if visibility == "group":
        return f"{name} is shared with group {view['group']}"
    if visibility == "public":
        return f"{name} is public: everyone can see and use it"
    return f"{name} is private: shared with no one"


# --group of `template share` / `model share`: without it, `group` keeps the group it has.
SHARE_GROUP_HELP = "the group it is shared with (one of yours; default: the group it has)"


@template_app.command("share")
@friendly_errors
def template_share(
    name: str,
    visibility: Annotated[str, typer.Argument(help="private, group or public")],
    group: Annotated[str | None, typer.Option("--group", help=SHARE_GROUP_HELP)] = None,
) -> None:
    """Share a template with your group, everyone, or nobody."""
    with client() as c:
        t = c.share_template(name, visibility, group)
    out.print(shared_text("template", t))


@template_app.command("rm")
@friendly_errors
def template_rm(name: str) -> None:
    """Delete a template and its versions (jobs made from it are unaffected)."""
    with client() as c:
        c.delete_template(name)
    out.print(f"template {name} deleted")


# --- models ------------------------------------------------------------------------------------


def _ref(ref: str) -> tuple[str, int]:
    name, _, version = ref.partition("@")
    if not version.lstrip("vV").isdigit():
        raise CorralError(f"{ref!r}: write NAME@VERSION, e.g. digits@2")
    return name, int(version.lstrip("vV"))


STAGES = ("none", "staging", "production", "archived")  # corral.catalog.model_mounts.STAGES


def _version_ref(ref: str) -> tuple[str, str]:
    """NAME@VERSION or NAME@STAGE (as `model finetune` and the `model/` mount source take)."""
    name, _, at = ref.partition("@")
    if not (at.lstrip("vV").isdigit() or at in STAGES):
        raise CorralError(
            f"{ref!r}: write NAME@VERSION or NAME@STAGE, e.g. digits@2 or digits@production "
            f"(stages: {', '.join(STAGES)})"
        )
    number = at.lstrip("vV")
    return name, number if number.isdigit() else at


def _metrics(items: list[str] | None) -> dict[str, Any]:
    metrics: dict[str, Any] = {}
    for key, value in parse_sets(items, "--metric", "f1=0.8").items():
        try:
            metrics[key] = float(value) if value.strip() else value
        except ValueError:
            metrics[key] = value
    return metrics


@model_app.command("ls")
@friendly_errors
def model_ls(output: OutputOpt = Output.table) -> None:
    """The models you may read."""
    with client() as c:
        items = c.models()
    if output is Output.json:
        print_json(items)
        return
    table = Table("NAME", "LATEST", "PRODUCTION", "VERSIONS", "SHARED", "OWNER")
    for m in items:
        prod = f"v{m['production']}" if m["production"] else "-"
        table.add_row(
            m["name"],
            f"v{m['latest']}" if m["latest"] else "-",
            prod,
            str(m["versions_count"]),
            m["visibility"] + (f" ({m['group']})" if m["visibility"] == "group" else ""),  # as template ls
            m["owner"],
        )
    out.print(table)


def _versions_table(model: dict[str, Any]) -> Table:
    table = Table("VERSION", "STAGE", "FRAMEWORK", "METRICS", "JOB", "FILES", "CREATED")
    for v in model["versions"]:
        metrics = ", ".join(f"{k}={v['metrics'][k]}" for k in sorted(v["metrics"]))
        table.add_row(
            f"v{v['version']}", v["stage"], v["framework"] or "-", metrics or "-",
            str(v["source_job_id"]), str(v["files"]), when(v["created_at"]),
        )  # fmt: skip
    return table


@model_app.command("versions")
@friendly_errors
def model_versions(name: str, output: OutputOpt = Output.table) -> None:
    """A model's versions with stage and metrics."""
    with client() as c:
        model = c.model(name)
    print_json(model["versions"]) if output is Output.json else out.print(_versions_table(model))


@model_app.command("show")
@friendly_errors
def model_show(
    ref: Annotated[
        str, typer.Argument(help="NAME (the model), NAME@VERSION or NAME@STAGE (card and lineage)")
    ],
    output: OutputOpt = Output.table,
) -> None:
    """A model, or one version's card and lineage (job, datasets, environment, code)."""
    with client() as c:
        data = c.model_version(*_version_ref(ref)) if "@" in ref else c.model(ref)
    if output is Output.json:
        print_json(data)
        return
    if "@" not in ref:
        about = plain(data["description"])
        out.print(
            f"[bold]{data['name']}[/bold] ({data['visibility']}) by {data['owner']}: {about}", markup=True
        )
        out.print(_versions_table(data))
        return
    lin = data["lineage"]
    out.print(
        f"[bold]{data['name']}@{data['version']}[/bold] stage {data['stage']}, "
        f"{plural(data['files'], 'file')}, "
        f"{plural(data['bytes'], 'byte')}, digest {data['digest'][:16]}",
        markup=True,
    )
    out.print(
        f"lineage: job {lin['job_id']} ({lin['job_name']}) by {lin['user']} in {lin['group']}; "
        f"path /outputs/{data['source_path']}",
        markup=False,
    )
    datasets = ", ".join(f"{d['name']}@{d['version']}" for d in lin["datasets"]) or "none"
    models = ", ".join(m.removeprefix("model/") for m in lin.get("models") or []) or "none"
    out.print(f"datasets: {datasets}; models: {models}; environment: {lin['environment']}", markup=False)
    # The ids whole on one line (soft_wrap): Rich folded the 64-digit snapshot id at 80 columns.
    out.print(
        f"code: {lin['code_snapshot'] or '-'}; checksum: {lin['code_checksum'] or '-'}",
        markup=False,
        soft_wrap=True,
    )
    out.print(f"metrics: {json.dumps(data['metrics'])}", markup=False, highlight=False)
    if data["card"]:
        out.print(data["card"], markup=False, highlight=False)


@model_app.command("register")
@friendly_errors
def model_register(
    name: str,
    job: Annotated[int, typer.Option("--job", help="a job that succeeded")],
    path: Annotated[str, typer.Option("--path", help="under the job's /outputs (default: all of it)")] = "",
    framework: Annotated[str, typer.Option("--framework", help="what it was made with, e.g. pytorch")] = "",
    metric: Annotated[
        list[str] | None, typer.Option("--metric", help="KEY=VALUE (repeat); adds to metrics.json")
    ] = None,
    card: Annotated[
        Path | None,
        typer.Option(
            "--card", exists=True, dir_okay=False, readable=True, help="a markdown file: the model card"
        ),
    ] = None,
    code_checksum: Annotated[
        str | None, typer.Option("--code-checksum", help="the code's checksum, kept in its lineage")
    ] = None,
    group: Annotated[str | None, typer.Option("--group", help="owning group of a new model")] = None,
    output: OutputOpt = Output.table,
) -> None:
    """Register a job's outputs as a new version of NAME (copied: it outlives the job)."""
    with client() as c:
        v = c.register_model(
            name,
            job,
            path=path,
            framework=framework,
            metrics=_metrics(metric),
            card=card.read_text() if card is not None else "",
            code_checksum=code_checksum,
            group=group,
        )
    if output is Output.json:
        print_json(v)
    else:
        out.print(
            f"model [bold]{name}[/bold] v{v['version']}: {plural(v['files'], 'file')} from job {job}",
            markup=True,
        )


@model_app.command("promote")
@friendly_errors
def model_promote(
    ref: Annotated[str, typer.Argument(help="NAME@VERSION")],
    stage: Annotated[str, typer.Argument(help="none, staging, production or archived")],
) -> None:
    """Move a version to another stage (none -> staging -> production -> archived)."""
    with client() as c:
        v = c.promote_model(*_ref(ref), stage)
    archived = f" (archived v{', v'.join(map(str, v['archived']))})" if v["archived"] else ""
    out.print(f"{ref} is now {v['stage']}{archived}")


@model_app.command("compare")
@friendly_errors
def model_compare(
    name: str,
    a: Annotated[int, typer.Argument(help="a version number")],
    b: Annotated[int, typer.Argument(help="the version to compare it with (DELTA: b - a)")],
    output: OutputOpt = Output.table,
) -> None:
    """Two versions' metrics side by side."""
    with client() as c:
        data = c.compare_models(name, a, b)
    if output is Output.json:
        print_json(data)
        return
    table = Table("METRIC", f"v{a}", f"v{b}", "DELTA")
    for m in data["metrics"]:
        delta = "-" if m["delta"] is None else f"{m['delta']:+.6g}"
        a_text, b_text = ("-" if x is None else str(x) for x in (m["a"], m["b"]))  # a metric one lacks
        table.add_row(m["metric"], a_text, b_text, delta)
    out.print(table)


@model_app.command("pull")
@friendly_errors
def model_pull(
    ref: Annotated[str, typer.Argument(help="NAME@VERSION or NAME@STAGE")],
    directory: Annotated[Path, typer.Argument(help="where to put the files (made if missing)")],
) -> None:
    """Download a version's files."""
    with client() as c:
        files = c.pull_model(*_version_ref(ref), directory)
    err.print(f"{plural(len(files), 'file')} of {ref} pulled into {directory}", markup=False)


@model_app.command("share")
@friendly_errors
def model_share(
    name: str,
    visibility: Annotated[str, typer.Argument(help="private, group or public")],
    group: Annotated[str | None, typer.Option("--group", help=SHARE_GROUP_HELP)] = None,
) -> None:
    """Share a model with your group, everyone, or nobody."""
    with client() as c:
        m = c.share_model(name, visibility, group)
    out.print(shared_text("model", m))


@model_app.command("rm")
@friendly_errors
def model_rm(ref: Annotated[str, typer.Argument(help="NAME (every version) or NAME@VERSION")]) -> None:
    """Delete a version or a model (refused while a job not yet ended mounts it)."""
    with client() as c:
        if "@" in ref:
            c.delete_model(*_ref(ref))
        else:
            c.delete_model(ref)
    out.print(f"{ref} deleted")


@model_app.command("finetune")
@friendly_errors
def model_finetune(
    ref: Annotated[str, typer.Argument(help="NAME, NAME@VERSION or NAME@STAGE")],
    template: Annotated[str, typer.Option("--template", help="the template whose job fine-tunes it")],
    sets: SetOpt = None,
    output: OutputOpt = Output.table,
) -> None:
    """Fine-tune from a model: a job from TEMPLATE with the version read-only at /models/NAME."""
    with client() as c:
        job = c.use_template(template, parse_sets(sets), models=[ref])
    print_json(job) if output is Output.json else _job_line(job)


def register(app: typer.Typer) -> None:
    app.add_typer(template_app, name="template")
    app.add_typer(model_app, name="model")
