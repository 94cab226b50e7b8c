"""Job commands: submit, retry, ls, show, why, logs, events, cancel, metrics, hold, release,
label (cli/job_labels.py), rm.

Read commands and `submit` take `-o json` and then print exactly the JSON the API returned.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import (
    Output,
    OutputOpt,
    ago,
    client,
    err,
    error_line,
    friendly_errors,
    out,
    plain,
    print_json,
    when,
)
from corral.cli.job_labels import label
from corral.domain import span_text, start_text
from corral.sdk import TERMINAL_STATES, Client, CorralError
from corral.words import plural


def gpus_of(job: dict[str, Any]) -> int:
    tasks = job.get("spec", {}).get("tasks", {})
    return sum(
        int(t.get("instances", 1)) * int(t.get("resources", {}).get("gpus", 0)) for t in tasks.values()
    )


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
        int | None,
        typer.Option(
            "--from-job",
            help="submit a copy of this job's spec (a clone; not of an environment's build job)",
        ),
    ] = None,
    hold: Annotated[
        bool,
        typer.Option("--hold", help="queue it held: it is never scheduled until `corral release JOB`"),
    ] = False,
    label: Annotated[
        list[str] | None,
        typer.Option(
            "--label", "-l", metavar="NAME=VALUE", help="a label added to the spec's (repeat for more)"
        ),
    ] = None,
) -> None:
    """Submit a job spec, or a copy of an earlier job's (`--from-job 42`)."""
    if (file is None) == (from_job is None):
        raise CorralError("give a spec file (or '-') or --from-job JOB, one of them")
    labels = label_filter(label)
    bare = [name for name, value in labels.items() if value is None]
    if bare:
        raise CorralError(f"label {bare[0]!r} has no value: give -l {bare[0]}=VALUE")
    text = None
    if file is not None:
        text = sys.stdin.read() if str(file) == "-" else _read(file)
    with client() as c:
        snapshot = _upload(c, code)
        if text is not None:
            job = c.submit(text, code=snapshot, hold=hold, labels=labels)
        else:
            assert from_job is not None
            job = c.submit_from_job(from_job, code=snapshot, hold=hold, labels=labels)
        job = _wait_for(c, job, wait=wait, output=output)
    _report_submitted(job, wait=wait, output=output)


@friendly_errors
def retry(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    wait: Annotated[
        bool, typer.Option("--wait", help="wait until the new job ends; exit 1 unless it succeeded")
    ] = False,
    hold: Annotated[
        bool,
        typer.Option("--hold", help="queue it held: it is never scheduled until `corral release JOB`"),
    ] = False,
    output: OutputOpt = Output.table,
) -> None:
    """Submit a copy of a job that has ended (failed, cancelled or succeeded) as a new job, and
    print its id: `corral submit --from-job JOB` for an ended job (Slurm's `scontrol requeue`).
    A job still queued or running is refused: it has not ended, so there is nothing to retry."""
    with client() as c:
        job = _wait_for(c, c.retry(job_id, hold=hold), wait=wait, output=output)
    _report_submitted(job, wait=wait, output=output, copy_of=job_id)


def _upload(c: Client, code: Path | None) -> str | None:
    """Upload `code` (if given) as a code snapshot, saying what was sent; its id."""
    if code is None:
        return None
    upload = c.upload_code(code)
    err.print(
        f"code: {plural(upload.files, 'file')}, {plural(upload.total_bytes, 'byte')}; "
        f"uploaded {plural(upload.uploaded_bytes, 'byte')} (snapshot {upload.id[:12]})"
    )
    return upload.id


def _wait_for(c: Client, job: dict[str, Any], *, wait: bool, output: Output) -> dict[str, Any]:
    """The submitted `job`, and with `wait` the job once it has ended."""
    if not wait:
        return job
    if output is Output.table:
        err.print(f"job {job['id']} submitted; waiting for it to end ...")
    return c.wait(job["id"])


def _report_submitted(job: dict[str, Any], *, wait: bool, output: Output, copy_of: int | None = None) -> None:
    """The new job (its JSON with -o json), and with `wait` exit 1 unless it succeeded."""
    if output is Output.json:
        print_json(job)
    else:
        copy = f", a copy of job {copy_of}" if copy_of is not None else ""
        out.print(
            f"job [bold]{job['id']}[/bold] ({job['name']}) {state_text(job)} in group {job['group']}{copy}",
            markup=True,
        )
    if wait and job["state"] != "succeeded":
        if output is Output.table and job.get("reason"):
            err.print(f"reason: {job['reason']}")  # as `corral show` says it: why it failed
        raise typer.Exit(1)


def state_text(job: dict[str, Any]) -> str:
    """A job's state as `ls` and `submit` print it: "queued (held)" while it is held."""
    return f"{job['state']} (held)" if job.get("hold") else job["state"]


def _read(file: Path) -> str:
    try:
        return file.read_text()
    except OSError as exc:
        raise CorralError(f"cannot read {file}: {exc.strerror}")


LabelOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        "-l",
        metavar="NAME=VALUE",
        help="jobs carrying this label (NAME alone: any value); repeat for all of several",
    ),
]


def label_filter(values: list[str] | None) -> dict[str, str | None]:
    """`-l experiment=e1 -l trial` -> {"experiment": "e1", "trial": None}; the server checks the
    names and values. One name twice is refused: no job carries two values of one label."""
    labels: dict[str, str | None] = {}
    for text in values or []:
        key, sep, value = text.partition("=")
        if key in labels:
            raise CorralError(f"label {key!r} is given twice (-l): a job has one value per label")
        labels[key] = value if sep else None
    return labels


def labels_text(job: dict[str, Any], leave_out: frozenset[str] = frozenset()) -> str:
    """ "experiment=e1,trial=7": a job's labels on one line, but those named in `leave_out`."""
    return ",".join(f"{k}={v}" for k, v in (job.get("labels") or {}).items() if k not in leave_out)


@friendly_errors
def ls(
    state: Annotated[str | None, typer.Option(help="e.g. queued,running")] = None,
    user: Annotated[str | None, typer.Option()] = None,
    group: Annotated[str | None, typer.Option()] = None,
    label: LabelOpt = None,
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
            labels=label_filter(label),
            sort=sort,
            order="asc" if asc else "desc",
            limit=limit,
            offset=offset,
        )
    if output is Output.json:
        print_json(page)
        return
    # The LABELS column only when some job has a label besides those filtered by with a value
    # (the same on every row), folded rather than cut at the terminal's width.
    same = frozenset(k for k, v in label_filter(label).items() if v is not None)
    labelled = any(labels_text(job, same) for job in page["items"])
    table = Table("ID", "NAME", "STATE", "USER", "GROUP", "GPUS", "ATTEMPTS", "SUBMITTED", box=None)
    if labelled:
        table.add_column("LABELS", overflow="fold")
    for job in page["items"]:
        row = [
            str(job["id"]),
            job["name"],
            state_text(job),
            job["user"],
            job["group"],
            str(gpus_of(job)),
            str(len(job["attempts"])),
            ago(job["created_at"]),
        ]
        table.add_row(*row, *([labels_text(job, same)] if labelled else []))
    out.print(table)
    shown = len(page["items"])
    out.print(f"{shown} of {plural(page['total'], 'job')}" + (f" (from offset {offset})" if offset else ""))


def budgets_line(job: dict[str, Any]) -> str:
    """What the retry rules have counted, in words: own failures against `retries`, platform
    losses against the cap the server applies to the next one like the latest (its lost-requeue
    budget, or a failure category's own lower cap: launch_failed's 2, as the reason line says);
    preemptions cost neither. It read "failures 0 of 1 retries  platform losses 0 of 3 requeues"."""
    failures, losses = job.get("own_failures", 0), job.get("platform_losses", 0)
    cap = job.get("platform_loss_cap")
    cap = job.get("lost_requeue_budget") if cap is None else cap
    said = [
        f"{'no failure yet' if not failures else plural(failures, 'failure')}"
        f" ({'no retry' if not job['retries'] else plural(job['retries'], 'retry', 'retries')} allowed)",
        ("no platform loss yet" if not losses else plural(losses, "platform loss", "platform losses"))
        + ("" if cap is None else f" ({'no requeue' if not cap else plural(cap, 'requeue')} allowed)"),
        "no preemption" if not job.get("preemptions") else plural(job["preemptions"], "preemption"),
    ]
    return ", ".join(said)


@friendly_errors
def show(job_id: Annotated[int, typer.Argument(metavar="JOB")], output: OutputOpt = Output.table) -> None:
    """Show a job: state, attempts, why it is pending, queue position and estimated start, and
    the notifications its spec's `notify` sent (each event, how and whether it went out)."""
    with client() as c:
        job = c.job(job_id)
        notes = c.notifications(job_id) if job.get("spec", {}).get("notify") else []
    if output is Output.json:
        print_json(job)
        return
    out.print(
        f"[bold]job {job['id']}[/bold] {job['name']}  state: [bold]{job['state']}[/bold]"
        + (
            "  (cancel requested)"
            if job["cancel_requested"] and job["state"] not in ("cancelled", "failed", "succeeded")
            else ""
        ),
        markup=True,
    )
    out.print(
        f"user {job['user']}  group {job['group']}  priority {job['priority']}  GPUs {gpus_of(job)}  "
        f"retries {job['retries']}"
    )
    out.print(f"submitted {when(job['created_at'])}")
    if job.get("labels"):
        out.print(f"labels {labels_text(job)}", highlight=False)
    out.print(budgets_line(job))
    if job.get("hold") and job["hold"].get("admin"):
        out.print("held by an admin: only an admin can release it")
    if job.get("reason"):
        out.print(f"reason: {job['reason']}")
    _print_diagnosis(job.get("diagnosis"))
    if job["attempts"]:
        _print_attempts(job["attempts"])
        _print_failures(job)
    else:
        out.print("no attempts yet")
    _print_watch(job.get("watch"))
    _print_notifications(job.get("spec", {}).get("notify"), notes)


def _print_notifications(notify: dict[str, Any] | None, notes: list[dict[str, Any]]) -> None:
    """The spec's `notify` and, for each event it sent, where it went and whether it arrived."""
    if not notify:
        return
    if not notify.get("on"):
        out.print("notify: nothing (the spec opts out of its owner's default)", highlight=False)
        return
    to = ", ".join(notify.get("to") or []) or "all your contacts"
    out.print(f"notify: {', '.join(notify.get('on', []))} to {to}", highlight=False)
    unsent = {
        "no_contact": "no contact of the kinds asked for",
        "failed": "could not be prepared (its events say why)",
    }
    for note in notes:
        sent = "; ".join(
            f"{d['kind']} {d['state']}" + (f" ({plain(d['last_error'])})" if d["last_error"] else "")
            for d in note["deliveries"]
        )
        how = sent or unsent.get(note["state"], "waiting to go")
        out.print(f"  {note['event']} {when(note['at'])}: {how}", highlight=False)


def _print_attempts(attempts: list[dict[str, Any]]) -> None:
    """Each attempt as a few key/value lines, its two times on one line of their own (56
    characters): a table of eight columns with two full times wrapped them at 80 columns."""
    for a in attempts:
        code = "" if a["exit_code"] is None else f"  exit {a['exit_code']}"
        out.print(f"attempt {a['number']}  {a['state']}{code}", highlight=False)
        gpus = ",".join(f"{g['node']}:{g['index']}" for g in a["gpus"]) or "-"
        out.print(f"  nodes {','.join(a['nodes']) or '-'}  GPUs {gpus}", highlight=False)
        out.print(f"  started {when(a['started_at'])}  ended {when(a['ended_at'])}", highlight=False)
        reason = ": ".join(part for part in (a["reason"], a["message"]) if part)
        if reason:
            out.print(f"  reason: {reason}", highlight=False)


def _print_failures(job: dict[str, Any]) -> None:
    """The exit-spec's verdict on each failed attempt: reason, category, message and fix."""
    for a in job["attempts"]:
        f = a.get("failure")
        if not f:
            continue
        message = plain(f["message"])
        out.print(
            f"attempt {a['number']}: [bold]{plain(f['reason'])}[/bold] ({plain(f['category'])}) {message}",
            markup=True,
        )
        if f.get("evidence"):
            out.print(f"  log: {f['evidence']}")
        out.print(f"  fix: {f['fix']}")


def _print_watch(watch: dict[str, Any] | None) -> None:
    if not watch:
        return
    if watch.get("suspected_hang"):
        done = f"; action: {watch['action']}" if watch.get("action") else ""
        out.print(f"[red]suspected hang[/red]: {plain(watch['suspected_hang'])}{plain(done)}", markup=True)
    if watch.get("stragglers"):
        out.print(f"stragglers: {watch['stragglers']}")


def _print_diagnosis(diag: dict[str, Any] | None) -> None:
    if not diag:
        return
    if diag.get("unschedulable"):
        out.print("[red]this job cannot run on the cluster as it stands[/red]", markup=True)
    for reason in diag.get("reasons", []):
        out.print(
            f"why pending: {plain(reason.get('message'))} "
            f"[dim]({plain(reason.get('code'))}, {plain(reason.get('source'))})[/dim]",
            markup=True,
            highlight=False,
        )
    if diag.get("queue_position") is not None:
        out.print(f"queue position: {diag['queue_position']} (the order the scheduler takes waiting jobs)")
    out.print(f"estimated start: {start_line(diag)}", highlight=False)


def start_line(diag: dict[str, Any]) -> str:
    """ "2026-11-28 03:10 (in ~2 h 10 min (likely 1 h 30 min to 3 h))", or why there is none."""
    if diag.get("unschedulable"):
        return "never, as the cluster stands"
    if diag.get("held"):  # on hold, or held back by its quota or cap: the reasons say which
        if any(r.get("code") == "on_hold" for r in diag.get("reasons", [])):
            return "none while it is held (see why pending)"
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
    if job["state"] == "preempted" and job.get("cancel_requested"):  # stopping, then cancelled
        why = job.get("reason") or "cancel requested"
        out.print(f"job {job['id']} is being stopped ({why}): it ends cancelled once it has stopped")
        return
    if job["state"] == "preempted":  # stopping within its grace, then back in the queue
        why = job.get("reason") or "preempted"
        out.print(
            f"job {job['id']} is being preempted ({why}): it goes back to the queue once it has stopped"
        )
        return
    if job["state"] not in ("queued", "scheduled", "starting"):
        state = f"has ended ({job['state']})" if job["state"] in TERMINAL_STATES else f"is {job['state']}"
        out.print(f"job {job['id']} {state}: it is not waiting")  # not "job 3 is succeeded"
        return
    out.print(f"[bold]job {job['id']}[/bold] {job['name']} is {job['state']}", markup=True)
    live = job["attempts"][-1] if job["state"] != "queued" and job.get("attempts") else None
    if live is not None:  # placed: what the engine says of it (Slurm's pending reason), if anything
        nodes = ", ".join(live.get("nodes") or []) or "its nodes"
        out.print(f"placed on {nodes}; {plain(live.get('message') or 'its processes are being started')}")
    elif not job.get("diagnosis"):
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
            "limit": "its max_runtime; no history yet",
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
            for text in c.follow_logs(job_id, attempt=attempt, rank=rank):
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


# Whose jobs `-l` acts on: yours unless asked (labels are free text; another user's may match).
WhoseUserOpt = Annotated[
    str | None,
    typer.Option(
        "--user",
        help="with -l: that user's jobs, not yours (admins; group admins: in their groups)",
    ),
]
AllUsersOpt = Annotated[
    bool,
    typer.Option("--all-users", help="with -l: every user's jobs you may act on, not only yours"),
]
# `metrics -l` only reads: what you can see decides, as for `corral ls` (nothing refused).
SeenUserOpt = Annotated[str | None, typer.Option("--user", help="with -l: that user's jobs you can see")]
AllSeenOpt = Annotated[bool, typer.Option("--all-users", help="with -l: every job you can see")]


def _whose_only_with_labels(label: list[str] | None, user: str | None, all_users: bool) -> None:
    if not label and (user is not None or all_users):
        raise CorralError("--user and --all-users go with -l NAME=VALUE; a job id names the job itself")


@friendly_errors
def cancel(
    job_id: Annotated[int | None, typer.Argument(metavar="[JOB]")] = None,
    label: LabelOpt = None,
    reason: Annotated[
        str | None, typer.Option("--reason", help="why, shown after who cancelled it (`corral show`)")
    ] = None,
    user: WhoseUserOpt = None,
    all_users: AllUsersOpt = False,
    output: OutputOpt = Output.table,
) -> None:
    """Cancel a job (queued jobs end at once; running ones are stopped), or with `-l NAME=VALUE`
    every live job of yours that carries the labels (an experiment's trials; others' with
    --user NAME or --all-users: admins, group admins for every job in their groups, a former
    member's included)."""
    if (job_id is None) == (not label):
        raise CorralError("give a job id or labels (-l NAME=VALUE), one of them")
    _whose_only_with_labels(label, user, all_users)
    if job_id is None:
        _cancel_by_labels(label_filter(label), reason, output, user, all_users)
        return
    with client() as c:
        job = c.cancel(job_id, reason=reason)
    if output is Output.json:
        print_json(job)
    elif job["state"] == "cancelled":
        out.print(f"job {job_id} cancelled")
    else:
        out.print(f"job {job_id} is {job['state']}; it is being stopped")


def _cancel_by_labels(
    labels: dict[str, str | None], reason: str | None, output: Output, user: str | None, all_users: bool
) -> None:
    with client() as c:
        done = c.cancel_by_labels(labels, reason=reason, user=user, all_users=all_users)
    if output is Output.json:
        print_json(done)
        return
    for item in done["items"]:
        out.print(item["message"], highlight=False, markup=False, soft_wrap=True)
    selector = ",".join(k if v is None else f"{k}={v}" for k, v in labels.items())
    whose = " (every user's)" if all_users else f" of {user}" if user else " of yours"
    out.print(f"{plural(done['matched'], 'live job')}{whose} with {selector}", highlight=False, markup=False)
    if done.get("more"):
        out.print("more jobs match than one request cancels: run it again for the rest", markup=False)


@friendly_errors
def metrics(
    job_id: Annotated[int | None, typer.Argument(metavar="[JOB]")] = None,
    label: LabelOpt = None,
    points: Annotated[bool, typer.Option("--points", help="every point, not only the latest values")] = False,
    user: SeenUserOpt = None,
    all_users: AllSeenOpt = False,
    output: OutputOpt = Output.table,
) -> None:
    """The metrics a job reported (lines it appended to $CORRAL_OUTPUTS/metrics.jsonl, e.g. with
    corral.sdk.report_metrics): each metric's latest value, or with --points every point. With
    `-l NAME=VALUE` instead of a job: the latest values of every job of yours carrying the labels
    (--user NAME: that user's; --all-users: every one you can see; never refused, unlike `cancel -l`)."""
    if (job_id is None) == (not label):
        raise CorralError("give a job id or labels (-l NAME=VALUE), one of them")
    _whose_only_with_labels(label, user, all_users)
    if job_id is None:
        _metrics_by_labels(label_filter(label), output, user, all_users)
        return
    with client() as c:
        body = c.metrics(job_id)
    if output is Output.json:
        print_json(body)
        return
    if body.get("error"):
        raise CorralError(f"job {job_id}: {body['error']}")
    if not body["points"]:
        out.print(f"job {job_id} has reported no metrics (none in $CORRAL_OUTPUTS/{body['file']})")
        return
    if points:
        names = list(dict.fromkeys(n for p in body["points"] for n in p["values"]))
        table = Table("STEP", *(n.upper() for n in names), box=None)
        for p in body["points"]:
            step = "" if p["step"] is None else str(p["step"])
            table.add_row(step, *(f"{p['values'][n]:g}" if n in p["values"] else "" for n in names))
    else:
        table = Table("METRIC", "LATEST", box=None)
        for name, value in body["latest"].items():
            table.add_row(name, f"{value:g}")
    out.print(table, highlight=False)
    notes = [plural(len(body["points"]), "point")]
    if body["skipped"]:
        notes.append(f"{plural(body['skipped'], 'line')} skipped (not an object of names to numbers)")
    if body["truncated"]:
        notes.append("only the file's latest points")
    out.print("; ".join(notes))


def _metrics_by_labels(
    labels: dict[str, str | None], output: Output, user: str | None, all_users: bool
) -> None:
    """One row per job: id, state, its last step and each metric's latest value."""
    with client() as c:
        items = c.metrics_of(labels=labels, tail=1, user=user, all_users=all_users)
    if output is Output.json:
        print_json(items)
        return
    names = list(dict.fromkeys(n for item in items for n in item["latest"]))
    same = frozenset(k for k, v in labels.items() if v is not None)
    table = Table("ID", "STATE", "LABELS", "STEP", *(n.upper() for n in names), box=None)
    for item in items:
        last = item["points"][-1]["step"] if item["points"] else None
        latest = item["latest"]
        table.add_row(
            str(item["job_id"]),
            item["state"],
            labels_text(item, same),
            "" if last is None else str(last),
            *(f"{latest[n]:g}" if n in latest else "" for n in names),
        )
    out.print(table, highlight=False)
    out.print(plural(len(items), "job"))


@friendly_errors
def rm(job_ids: Annotated[list[int], typer.Argument(metavar="JOB...", help="finished jobs")]) -> None:
    """Delete finished jobs and their logs (yours; admins: anyone's). Exit 1 if any was refused."""
    with client() as c:

        def delete(job_id: int) -> str:
            c.delete(job_id)
            return f"job {job_id} deleted"

        if _each_job(job_ids, delete):
            raise typer.Exit(1)


@friendly_errors
def events(
    job_id: Annotated[int, typer.Argument(metavar="JOB")],
    skip: Annotated[
        int,
        typer.Option("--skip", min=0, help="leave out the newest N events (counted from the newest)"),
    ] = 0,
    before: Annotated[
        int | None,
        typer.Option(
            "--before",
            min=1,
            metavar="EVENT",
            help="only events older than event id EVENT: page back through a long history (the line "
            "under the table names it; stays put while the job adds events)",
        ),
    ] = None,
    output: OutputOpt = Output.table,
) -> None:
    """A job's history: when it was submitted, held, released, placed, started, relabelled,
    requeued, ended. Its newest 500 events, oldest first, and how many earlier ones are not shown
    (-o json: {"events": [...], "earlier_events": N}, as GET /jobs/{id} names them). A server that
    does not count them (an old one): with a full page, "earlier_events": null and "more_events"
    saying that more may exist and how to see them, as the line under the table does."""
    with client() as c:
        rows, earlier = c.events_page(job_id, skip=skip, before=before)
        uncounted = None if earlier is not None else _uncounted_events_line(c.url, job_id, rows)
    if output is Output.json:  # the count too: a script must tell a history cut short (review113 #7)
        shown: dict[str, object] = {"events": rows, "earlier_events": earlier}
        if uncounted is not None:  # review115 #3: a full page of an uncounting server is no whole history
            shown["more_events"] = uncounted
        print_json(shown)
        return
    table = Table("TIME", "KIND", "STATE", "MESSAGE", box=None)
    for event in rows:
        moved = [s for s in (event.get("from_state"), event.get("to_state")) if s]
        state = " -> ".join(moved) if len(set(moved)) > 1 else (moved[0] if moved else "")
        table.add_row(when(event["at"]), event["kind"], state, plain(event["message"]))
    out.print(table, highlight=False)
    out.print(f"{plural(len(rows), 'event')}")
    if uncounted is not None:
        out.print(uncounted, highlight=False, markup=False, soft_wrap=True)
    elif earlier:  # an older server's events have no id (None) and it pages by --skip only
        back = f"--skip {skip + len(rows)}" if rows[0]["id"] is None else f"--before {rows[0]['id']}"
        out.print(f"{plural(earlier, 'earlier event')} not shown: corral events {job_id} {back}")


def _uncounted_events_line(url: str, job_id: int, rows: list[dict[str, Any]]) -> str:
    """What `corral events` says of a full page from a server that did not count the events
    before it (review115 #3): more may exist, and how to see them there. Events with ids come
    from a current server whose count a proxy dropped (it pages by --before); without ids it is
    one of the oldest, which shows at most 500 events and pages by neither --before nor --skip."""
    if rows and rows[0]["id"] is not None:
        return (
            f"the server did not say how many events come before these: more may exist: "
            f"corral events {job_id} --before {rows[0]['id']}"
        )
    return (
        f"the Corral server at {url} did not say how many events job {job_id} has and shows "
        f"{len(rows)} at most: more may exist, and it cannot page to them: upgrade the server to see them"
    )


def _each_job(job_ids: list[int], act: Callable[[int], str]) -> int:
    """`act` on each job once (`rm 5 5`: once; the second found no job 5 and exited 1), printing
    the line it returns, or its refusal on a line of its own. Returns how many were refused."""
    failed = 0
    for job_id in dict.fromkeys(job_ids):
        try:
            out.print(act(job_id), highlight=False, markup=False, soft_wrap=True)
        except CorralError as exc:
            if exc.status_code in (None, 401):  # unreachable server, bad credentials: stop at once
                raise
            failed += 1
            # "job 7: no job with id 7" said it twice: the id only where the answer lacks it
            named = re.search(rf"\b{job_id}\b", exc.message)
            error_line(exc.message if named else f"job {job_id}: {exc.message}")
    return failed


JobsArg = Annotated[list[int] | None, typer.Argument(metavar="[JOB...]", show_default=False)]


@friendly_errors
def hold(
    job_ids: JobsArg = None, label: LabelOpt = None, user: WhoseUserOpt = None, all_users: AllUsersOpt = False
) -> None:
    """Hold queued jobs back: they keep their place and history but are never scheduled until
    `corral release`; or with `-l NAME=VALUE` every queued job of yours that carries the labels
    (others' with --user NAME or --all-users, as for `cancel -l`). An admin's hold only an admin
    releases. Exit 1 if any was refused."""
    _hold_or_release("hold", job_ids, label, user, all_users)


@friendly_errors
def release(
    job_ids: JobsArg = None, label: LabelOpt = None, user: WhoseUserOpt = None, all_users: AllUsersOpt = False
) -> None:
    """Release held jobs: they are schedulable again at once; or with `-l NAME=VALUE` every queued
    job of yours that carries the labels (others' with --user NAME or --all-users). Exit 1 if any
    was refused."""
    _hold_or_release("release", job_ids, label, user, all_users)


def _hold_or_release(
    verb: str, job_ids: list[int] | None, label: list[str] | None, user: str | None, all_users: bool
) -> None:
    """Each job's answer on a line (a refusal on stderr); exit 1 if any was refused."""
    if bool(job_ids) == bool(label):
        raise CorralError("give job ids or labels (-l NAME=VALUE), one of them")
    _whose_only_with_labels(label, user, all_users)
    with client() as c:
        if job_ids:
            act = c.hold_job if verb == "hold" else c.release_job
            if _each_job(job_ids, lambda job_id: str(act(job_id)["message"])):
                raise typer.Exit(1)
            return
        labels = label_filter(label)
        act_set = c.hold_by_labels if verb == "hold" else c.release_by_labels
        done = act_set(labels, user=user, all_users=all_users)
    for item in done["items"]:
        if item["outcome"] == "refused":
            error_line(item["message"])
        else:
            out.print(item["message"], highlight=False, markup=False, soft_wrap=True)
    selector = ",".join(k if v is None else f"{k}={v}" for k, v in labels.items())
    out.print(f"{plural(done['matched'], 'queued job')} with {selector}", highlight=False)
    if done.get("more"):
        out.print(f"more jobs match than one request acts on: run `corral {verb} -l` again", highlight=False)
    if any(item["outcome"] == "refused" for item in done["items"]):
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add the job commands to the root `corral` app."""
    app.command()(submit)
    app.command()(retry)
    app.command()(ls)
    app.command()(show)
    app.command()(why)
    app.command()(logs)
    app.command()(events)
    app.command()(cancel)
    app.command()(metrics)
    app.command()(hold)
    app.command()(release)
    app.command()(label)
    app.command()(rm)
