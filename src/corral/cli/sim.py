"""`corral sim`: replay a GPU-cluster trace through Corral's scheduler; `corral sim compare`: several
policies on the same trace and cluster."""

from __future__ import annotations

import json
import math
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from corral.cli import sim_jobs_out
from corral.words import plural

if TYPE_CHECKING:
    from corral.cli.sim_live import LiveRequest

sim_app = typer.Typer(
    help="Replay a GPU-cluster trace through Corral's scheduler (discrete-event simulation).",
    invoke_without_command=True,
    pretty_exceptions_enable=False,
)

TRACE_HELP = "philly, openb, openb-gpuspec33, or a CSV in the generic trace format (docs/simulator.md)"
CLUSTER_HELP = "a CLUSTER.yaml, or a shipped example: philly, openb, openb-small, synth"


ORACLE_HELP = (
    "give every policy the trace's true durations as runtime estimates (a bound, not a real "
    "scheduler; default: estimates from history and user limits). NAME-oracle does it for one policy"
)

# `sim`'s options that take more than a line, declared apart to keep its signature short: first
# those of a trace's replay, then those of --from-cluster (corral.cli.sim_live).
PolicyOption = Annotated[
    str | None,
    typer.Option(
        "--policy",
        "-p",
        help="default, fifo, fifo-backfill, sjf, las; NAME-oracle: with true durations "
        "(default: default; with --from-cluster: the cluster's own)",
    ),
]
PlacementOption = Annotated[
    str | None, typer.Option("--placement", help="bestfit, spread or random (default: the policy's)")
]
CheckpointIntervalOption = Annotated[
    float, typer.Option("--checkpoint-interval", help="seconds between checkpoints; 0 = none")
]
CycleIntervalOption = Annotated[
    float, typer.Option("--cycle-interval", help="seconds between cycles; 0 = every event")
]
EtaIntervalOption = Annotated[
    float,
    typer.Option(
        "--eta-interval",
        help="speed option: read new jobs' estimated starts at most once per this many simulated "
        "seconds (0 = in each job's first cycle, as scored by default); the ETA error then scores "
        "the estimate shown at the first read after submit",
    ),
]
CheckpointOnPreemptOption = Annotated[
    bool,
    typer.Option("--checkpoint-on-preempt", help="a preempted job saves its work within its stop grace"),
]
PrivateBaselineOption = Annotated[
    bool, typer.Option("--private-baseline", help="also replay each group on a private cluster")
]
JobsOutOption = Annotated[
    Path | None,
    typer.Option(
        "--jobs-out", help="CSV of every job event: time, job, submit/start/preempt/stop/finish/reject"
    ),
]
SEED_HELP = "seeds what is random in a replay: node failures (--node-mtbf-h), random placement"
CompareKnobOption = Annotated[
    list[str],
    typer.Option(
        "--knob",
        help="NAME=VALUE: a policy knob for every policy compared (as the cluster file's "
        "policy_knobs; las_thresholds=3600,36000, starvation_s=0, ...; defaults: docs/scheduler.md)",
    ),
]
KnobOption = Annotated[
    list[str],
    typer.Option(
        "--knob",
        help="NAME=VALUE: a policy knob (backfill_depth, las_thresholds=3600,36000, starvation_s, "
        "max_preemptions, ...; each with its default: docs/scheduler.md)",
    ),
]
FromClusterOption = Annotated[
    bool,
    typer.Option(
        "--from-cluster",
        help="admins: replay the platform's own job history under the current settings and under "
        "--policy / --quota changes; per-group queueing before and after",
    ),
]
SinceOption = Annotated[
    str, typer.Option("--since", help="--from-cluster: jobs submitted since (30d, 12h, ISO time)")
]
AnonymiseOption = Annotated[
    bool, typer.Option("--anonymise", help="--from-cluster: users, groups and job names as pseudonyms")
]
UnfinishedOption = Annotated[
    bool,
    typer.Option("--unfinished", help="--from-cluster: also jobs still running or waiting (censored)"),
]
QuotaOption = Annotated[
    list[str],
    typer.Option(
        "--quota",
        help="--from-cluster: GROUP=GUARANTEED[:MAX] or GROUP@MODEL=GUARANTEED[:MAX] "
        "(repeatable; MAX none = no limit)",
    ),
]
SaveTraceOption = Annotated[
    Path | None,
    typer.Option(
        "--save-trace", help="--from-cluster: only write the trace CSV here (and FILE.cluster.yaml)"
    ),
]


def _config(
    checkpoint: float, oracle: bool, mtbf_h: float | None, repair_h: float, seed: int, **kw: Any
) -> Any:
    from corral.sim.replay import SimConfig

    times = {
        "--checkpoint-interval": checkpoint,
        "--node-mtbf-h": mtbf_h or 0.0,
        "--node-repair-h": repair_h,
        "--cycle-interval": kw.get("cycle_interval_s", 0.0),
        "--eta-interval": kw.get("eta_interval_s", 0.0),
    }
    for option, value in times.items():  # click's ranges let nan and inf through
        if not math.isfinite(value) or value < 0:
            _fail(f"{option} must be a finite number >= 0, not {value}")
    return SimConfig(
        checkpoint_interval_s=checkpoint,
        oracle_runtime=oracle,
        node_mtbf_s=mtbf_h * 3600 if mtbf_h else None,
        node_repair_s=repair_h * 3600,
        seed=seed,
        **kw,
    )


def _load(trace: str, cluster: str, max_jobs: int | None, speedup: float) -> tuple[Any, Any]:
    from corral.sim.cluster import ClusterError, load_cluster
    from corral.sim.trace import TraceError, first_jobs, load_trace, speed_up_arrivals

    try:
        loaded = speed_up_arrivals(load_trace(trace), speedup)
        return (first_jobs(loaded, max_jobs) if max_jobs else loaded), load_cluster(cluster)
    except (TraceError, ClusterError) as exc:
        _fail(str(exc))


def _console() -> Console:
    """Wide tables stay readable when piped (Rich would wrap them at 80 columns)."""
    console = Console()
    return console if console.is_terminal else Console(width=220)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)  # plain echo: Rich would wrap long file paths
    raise typer.Exit(2)


def _print_summary(summary: dict[str, Any], console: Console) -> None:
    from corral.sim.report import compare_table

    console.print(
        compare_table(
            [summary],
            f"{summary['trace']} on {summary['cluster']} ({plural(summary['cluster_gpus'], 'GPU')})",
        )
    )
    table = Table(title="per group")
    for column in (
        "group",
        "jobs",
        "avg queue s",
        "avg JCT h",
        "run share",
        "slowdown",
        "share held",
        "private GPUs",
        "private avg queue s",
    ):
        table.add_column(column, justify="left" if column == "group" else "right")
    for group, g in summary["per_group"].items():
        private = g.get("private_avg_queue_s")
        table.add_row(
            group,
            f"{g['jobs']:,.0f}",
            f"{g['avg_queue_s']:,.0f}",
            f"{g['avg_jct_s'] / 3600:,.2f}",
            f"{g['run_share']:.3f}",
            f"{g.get('slowdown', 1.0):.2f}",
            f"{g.get('guarantee_held', 1.0):.1%}",
            str(g.get("private_gpus", "-")),
            "-" if private is None else f"{private:,.0f}",
        )
    console.print(table)
    for note in summary["notes"]:
        console.print(f"note: {note}", markup=False)
    for r in summary["rejected"]:
        console.print(f"[yellow]rejected[/yellow] {escape(str(r['job_id']))}: {escape(r['why'])}")
    if summary["jobs_rejected"] > len(summary["rejected"]):
        console.print(f"... {plural(summary['jobs_rejected'], 'job')} rejected in all")
    if summary["jobs_unfinished"]:
        examples = ", ".join(summary["unfinished"][:5])
        console.print(
            f"[yellow]{plural(summary['jobs_unfinished'], 'job')} never finished[/yellow] (e.g. {examples}); "
            "counted in JCT and queueing up to the replay's end (censored)"
        )


@sim_app.callback()
def sim(
    ctx: typer.Context,
    trace: str = typer.Option(None, "--trace", "-t", help=TRACE_HELP),
    cluster: str = typer.Option(None, "--cluster", "-c", help=CLUSTER_HELP),
    policy: PolicyOption = None,
    placement: PlacementOption = None,
    checkpoint_interval: CheckpointIntervalOption = 1800.0,
    cycle_interval: CycleIntervalOption = 0.0,
    eta_interval: EtaIntervalOption = 0.0,
    checkpoint_on_preempt: CheckpointOnPreemptOption = False,
    oracle: bool = typer.Option(False, "--oracle-runtime/--no-oracle-runtime", help=ORACLE_HELP),
    node_mtbf_h: float = typer.Option(
        None, "--node-mtbf-h", help="mean hours between failures of a node (default or 0: none)"
    ),
    node_repair_h: float = typer.Option(1.0, "--node-repair-h", help="hours a failed node stays down"),
    seed: int = typer.Option(0, "--seed", help=SEED_HELP),
    private: PrivateBaselineOption = False,
    max_jobs: int = typer.Option(None, "--max-jobs", min=1, help="replay only the first N jobs"),
    speedup: float = typer.Option(1.0, "--arrival-speedup", help="divide submit times by this (more load)"),
    out: Path = typer.Option(None, "--out", help="directory for summary.json and plots"),
    jobs_out: JobsOutOption = None,
    knob: KnobOption = [],  # noqa: B006 (typer copies it; never mutated)
    output: str = typer.Option("table", "--output", "-o", help="table or json"),
    from_cluster: FromClusterOption = False,
    since: SinceOption = "30d",
    anonymise: AnonymiseOption = False,
    unfinished: UnfinishedOption = False,
    quota: QuotaOption = [],  # noqa: B006 (typer copies it; never mutated)
    save_trace: SaveTraceOption = None,
) -> None:
    """Replay TRACE on CLUSTER with POLICY and print the figures; or, with --from-cluster, the
    live platform's own history under its current settings and under changed ones."""
    if ctx.invoked_subcommand is not None:
        return
    if output not in ("table", "json"):
        _fail(f"unknown output {output!r}; use table or json")
    config = _config(
        checkpoint_interval,
        oracle,
        node_mtbf_h,
        node_repair_h,
        seed,
        cycle_interval_s=cycle_interval,
        eta_interval_s=eta_interval,
        checkpoint_on_preempt=checkpoint_on_preempt,
        record_events=jobs_out is not None,
    )
    replay_only = bool(private or max_jobs or speedup != 1.0 or jobs_out)
    live_only = bool(quota or save_trace or unfinished or anonymise)
    _check_mode(from_cluster, bool(trace or cluster), replay_only, live_only)
    _save_trace_alone(save_trace, {"--quota": quota, "--policy": policy, "--placement": placement}, knob, out)
    _not_an_input({"--jobs-out": jobs_out}, {"--trace": trace, "--cluster": cluster})
    if not from_cluster and (not trace or not cluster):
        _fail("--trace and --cluster are required (see corral sim --help)")
    with _results_where({"--jobs-out": jobs_out, "--save-trace": save_trace}, {"--out": out}) as keep:
        if jobs_out and (refused := sim_jobs_out.refusal(jobs_out)):
            _fail(refused)
        if from_cluster:
            from corral.cli.sim_live import LiveRequest

            live = LiveRequest(
                since, anonymise, unfinished, policy, placement, quota, save_trace, out, output
            )
            _replay_cluster(live, config, knob)
            return
        policy_name = policy or "default"
        spec = f"{policy_name}:{placement}" if placement else policy_name
        result, summary = _replay_trace(trace, cluster, spec, config, knob, max_jobs, speedup, private)
        written = None
        if jobs_out and not summary["jobs"]:  # refused next: the rejected jobs and why, kept
            failed = sim_jobs_out.write(result, jobs_out)
            if failed:  # said, and the refusal still follows
                typer.echo(f"error: {failed}", err=True)
            else:
                keep(jobs_out)
                written = jobs_out
        _refuse_if_nothing_ran([summary], max_jobs, written)
        _write_results(result, summary, jobs_out, out, output)


def _refuse_if_nothing_ran(
    summaries: list[dict[str, Any]], max_jobs: int | None, jobs_out: Path | None = None
) -> None:
    """A trace none of whose jobs the cluster can ever run (too wide for every node, GPU models it
    lacks, more than a group's quota) printed a table of zeros, exit 0, and `compare` added that
    the policies were too alike to tell apart. Refused instead, with the rejections' reasons; of
    "the first N jobs" where --max-jobs cut the trace short; `jobs_out`: where every rejection
    was written."""
    if any(s["jobs"] for s in summaries):
        return
    first = summaries[0]
    example: dict[str, str] = {}  # the first job of each reason
    for r in first["rejected"]:
        example.setdefault(r["why"], str(r["job_id"]))
    shown = "; ".join(f"{job}: {why}" for why, job in list(example.items())[:3])
    whose = "" if len(summaries) == 1 else " under any policy"
    count = first["jobs_rejected"]
    trace = first["trace"]
    first_only = max_jobs is not None and count >= max_jobs  # the trace may have more
    if count == 1:
        which = f"the {'first' if first_only else 'only'} job of trace {trace} cannot"
    else:
        which = f"none of the {'first ' if first_only else ''}{count:,} jobs of trace {trace} can"
    all_in = f" (every job's reason is in {jobs_out})" if jobs_out else ""
    _fail(
        f"{which} run on cluster {first['cluster']} "
        f"({plural(first['cluster_gpus'], 'GPU')}){whose}; e.g. {shown}{all_in}"
    )


def _save_trace_alone(
    save_trace: Path | None, changes: dict[str, object], knob: list[str], out: Path | None
) -> None:
    """`--save-trace` only exports (the trace and the current cluster); the options of a replay
    were read and dropped without a word: a `--quota` change was not in the saved cluster, and
    `--out` was made and left empty."""
    if save_trace is None:
        return
    given = [option for option, value in {**changes, "--knob": knob, "--out": out}.items() if value]
    if given:
        _fail(
            f"--save-trace only writes the trace and the cluster as they are; {', '.join(given)} "
            f"{'belongs' if len(given) == 1 else 'belong'} to a replay: leave "
            f"{'it' if len(given) == 1 else 'them'} out, or replay with --out DIR (which writes "
            "trace.csv and cluster.yaml too)"
        )


def _not_an_input(files: dict[str, Path | None], inputs: dict[str, str | None]) -> None:
    """A result written over the trace or cluster file it was read from: the input would be lost."""
    for option, path in files.items():
        for name, given in inputs.items():
            if (
                path is not None
                and given
                and Path(given).is_file()
                and os.path.realpath(path) == os.path.realpath(given)  # (no raise on a link loop)
            ):
                _fail(f"{option} {path}: is the {name} file, which it would overwrite; give another name")


@contextmanager
def _results_where(
    files: dict[str, Path | None], folders: dict[str, Path | None]
) -> Iterator[Callable[[Path], None]]:
    """Make where the results go (`_writable`) for the run inside the block. A run that fails
    (bad input, a refusal by the server, no jobs, Ctrl-C) leaves nothing half-done: the folders
    this run made are removed with what it wrote into them; a folder that was there is kept, and
    so is one above a file the block gave to the function it is handed (written whole, kept
    whatever follows: the rejections of a replay refused as having nothing to run)."""
    made: list[Path] = []

    def keep(written: Path) -> None:
        made[:] = [folder for folder in made if not written.absolute().is_relative_to(folder.absolute())]

    try:
        _writable(files, folders, made)
        yield keep
    except typer.Exit as exc:
        if exc.exit_code:
            _remove_made(made)
        raise
    except BaseException:
        _remove_made(made)
        raise


def _remove_made(made: list[Path]) -> None:
    for folder in reversed(made):
        shutil.rmtree(folder, ignore_errors=True)


def _outermost_missing(folder: Path) -> Path | None:
    """The outermost folder of `folder`'s path not there yet: what mkdir(parents=True) makes."""
    missing = None
    for step in (folder, *folder.parents):
        if step.exists() or step.is_symlink():
            break
        missing = step
    return missing


def _writable(files: dict[str, Path | None], folders: dict[str, Path | None], made: list[Path]) -> None:
    """Make where the results go before a replay that may take minutes: a path that cannot be
    written (a file where a folder goes, no permission) fails now with one line, not after the
    replay with a traceback and the replay lost. `made` gets each folder this made."""
    for option, path in (*files.items(), *folders.items()):
        if path is None:
            continue
        folder = path if option in folders else path.parent
        missing = _outermost_missing(folder)
        try:
            folder.mkdir(parents=True, exist_ok=True)
            if missing is not None:
                made.append(missing)
            if option not in folders and path.is_dir():
                _fail(f"{option} {path}: is a folder; give a file name")
        except FileExistsError as exc:
            _fail(f"{option} {path}: cannot make the folder {exc.filename}: a file of that name is there")
        except OSError as exc:
            _fail(f"{option} {path}: cannot write there ({exc.strerror or exc})")


def _check_mode(from_cluster: bool, trace_given: bool, replay_only: bool, live_only: bool) -> None:
    """Refuse the options of the other mode: `--from-cluster` replays the platform's own jobs and
    nodes; without it, a trace on a cluster."""
    if from_cluster and trace_given:
        _fail("--from-cluster replays the platform's own jobs and nodes: leave out --trace and --cluster")
    if from_cluster and replay_only:
        _fail(
            "--private-baseline, --max-jobs, --arrival-speedup and --jobs-out do not go with --from-cluster"
        )
    if not from_cluster and live_only:
        _fail("--quota, --save-trace, --unfinished and --anonymise go with --from-cluster")


def _replay_cluster(request: LiveRequest, config: Any, knob: list[str]) -> None:
    """`corral sim --from-cluster`: the platform's own history (corral.cli.sim_live)."""
    from corral.cli.sim_live import run_from_cluster
    from corral.sim.runner import PolicyError, parse_knobs

    try:
        knobs = parse_knobs(knob)
    except PolicyError as exc:
        _fail(str(exc))
    run_from_cluster(request, config, knobs, _console())


def _replay_trace(
    trace: str,
    cluster: str,
    spec: str,
    config: Any,
    knob: list[str],
    max_jobs: int | None,
    speedup: float,
    private: bool,
) -> tuple[Any, dict[str, Any]]:
    """One replay of a trace and its summary (with each group's private-cluster figures)."""
    from corral.sim.metrics import summarize
    from corral.sim.runner import PolicyError, parse_knobs, private_baseline, simulate

    loaded_trace, loaded_cluster = _load(trace, cluster, max_jobs, speedup)
    try:
        knobs = parse_knobs(knob)
        result = simulate(loaded_trace, loaded_cluster, spec, config, knobs)
        summary = summarize(result)
        if private:  # the same policy, knobs included, on each group's private cluster
            for group, figures in private_baseline(loaded_trace, loaded_cluster, spec, config, knobs).items():
                summary["per_group"].setdefault(group, {}).update(figures)
    except PolicyError as exc:
        _fail(str(exc))
    return result, summary


def _write_results(
    result: Any, summary: dict[str, Any], jobs_out: Path | None, out: Path | None, output: str
) -> None:
    """The job events CSV, summary.json and plots where asked; the summary on stdout."""
    from corral.sim.report import write_plots

    if jobs_out and (failed := sim_jobs_out.write(result, jobs_out)):
        _fail(failed)
    if out:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        write_plots([result], out)
    if output == "json":
        typer.echo(json.dumps(summary))
    else:
        from corral.scheduler.compiled_build import describe

        _print_summary(summary, _console())
        typer.echo(f"scheduler: {describe()}")


def _compare_specs(policies: str, output: str, knob: list[str]) -> tuple[list[str], dict[str, Any]]:
    """`compare`'s policies and knobs, each checked before the first replay (a typo in the last
    policy used to fail only after the replays before it, minutes on a whole trace), and its
    output format."""
    from corral.sim.runner import PolicyError, parse_knobs, resolve_policy

    if output not in ("table", "markdown", "json"):
        _fail(f"unknown output {output!r}; use table, markdown or json")
    specs = [p.strip() for p in policies.split(",") if p.strip()]
    if not specs:
        _fail("--policies: give at least one policy, e.g. default,fifo")
    try:
        knobs = parse_knobs(knob)
        for spec in specs:
            resolve_policy(spec, knobs)
    except PolicyError as exc:
        _fail(str(exc))
    return specs, knobs


def _replay_each(
    trace: Any, cluster: Any, specs: list[str], config: Any, knobs: dict[str, Any], max_jobs: int | None
) -> tuple[list[Any], list[dict[str, Any]]]:
    """One replay per policy, with its summary; nothing to compare when no policy ran a job
    (`max_jobs`: the trace's cut, --max-jobs, for the refusal's words)."""
    from corral.sim.metrics import summarize
    from corral.sim.runner import PolicyError, simulate

    results, summaries = [], []
    for spec in specs:
        try:
            result = simulate(trace, cluster, spec, config, knobs)
        except PolicyError as exc:
            _fail(str(exc))
        results.append(result)
        summaries.append(summarize(result))
    _refuse_if_nothing_ran(summaries, max_jobs)
    return results, summaries


@sim_app.command()
def compare(
    trace: str = typer.Option(..., "--trace", "-t", help=TRACE_HELP),
    cluster: str = typer.Option(..., "--cluster", "-c", help=CLUSTER_HELP),
    policies: str = typer.Option(
        "default,fifo,fifo-backfill,sjf,las,sjf-oracle",
        "--policies",
        help="comma-separated; NAME, NAME:PLACEMENT, NAME-oracle (true durations: a bound)",
    ),
    checkpoint_interval: CheckpointIntervalOption = 1800.0,
    checkpoint_on_preempt: CheckpointOnPreemptOption = False,
    cycle_interval: CycleIntervalOption = 0.0,
    eta_interval: EtaIntervalOption = 0.0,
    oracle: bool = typer.Option(False, "--oracle-runtime/--no-oracle-runtime", help=ORACLE_HELP),
    seed: int = typer.Option(0, "--seed", help=SEED_HELP),
    max_jobs: int = typer.Option(None, "--max-jobs", min=1, help="replay only the first N jobs"),
    speedup: float = typer.Option(1.0, "--arrival-speedup", help="divide submit times by this (more load)"),
    knob: CompareKnobOption = [],  # noqa: B006 (typer copies it; never mutated)
    out: Path = typer.Option(None, "--out", help="directory for the PNG plots and summaries.json"),
    output: str = typer.Option("table", "--output", "-o", help="table, markdown or json"),
) -> None:
    """Replay the same trace and cluster under several policies; print one row per policy."""
    from corral.sim.report import compare_markdown, compare_table, compare_warnings, write_plots

    specs, knobs = _compare_specs(policies, output, knob)
    config = _config(
        checkpoint_interval,
        oracle,
        None,
        1.0,
        seed,
        cycle_interval_s=cycle_interval,
        eta_interval_s=eta_interval,
        checkpoint_on_preempt=checkpoint_on_preempt,
    )
    with _results_where({}, {"--out": out}):
        loaded_trace, loaded_cluster = _load(trace, cluster, max_jobs, speedup)
        results, summaries = _replay_each(loaded_trace, loaded_cluster, specs, config, knobs, max_jobs)
        if out:
            (out / "summaries.json").write_text(json.dumps(summaries, indent=2))
            for path in write_plots(results, out):
                Console(stderr=True).print(f"wrote {path}")
    if output == "json":
        typer.echo(json.dumps([{k: v for k, v in s.items() if k != "per_group"} for s in summaries]))
    elif output == "markdown":
        typer.echo(compare_markdown(summaries))
    else:
        title = f"{loaded_trace.name} on {loaded_cluster.name} ({plural(loaded_cluster.total_gpus, 'GPU')})"
        _console().print(compare_table(summaries, title))
    for warning in compare_warnings(summaries):  # on stderr: JSON and markdown on stdout stay clean
        typer.echo(f"warning: {warning}", err=True)


@sim_app.command()
def synth(
    out_text: str = typer.Option(
        ..., "--out", help="the trace CSV to write (generic format; a file, not a directory)"
    ),
    cluster: str = typer.Option("synth", "--cluster", "-c", help=CLUSTER_HELP + "; sizes the load"),
    jobs: int = typer.Option(9000, "--jobs", min=1, help="how many jobs"),
    load: float = typer.Option(1.3, "--load", help="offered GPU-time / cluster GPU-time over the arrivals"),
    size_mix: str = typer.Option("1:45,2:15,4:20,8:20", "--size-mix", help="single-node GPUS:WEIGHT,..."),
    gang_share: float = typer.Option(0.25, "--gang-share", help="share of multi-node gang jobs"),
    gang_instances: str = typer.Option("2:50,4:35,8:15", "--gang-instances", help="NODES:WEIGHT,..."),
    constrained_share: float = typer.Option(0.33, "--constrained-share", help="share naming GPU models"),
    bursty: str | None = typer.Option(
        None,
        "--bursty",
        help="comma-separated groups that submit in bursts (default: burst, if the cluster has it)",
    ),
    burst_share: float = typer.Option(0.15, "--burst-share", help="share of jobs submitted in bursts"),
    burst_size: str = typer.Option("20-60", "--burst-size", help="jobs per burst, LOW-HIGH"),
    diurnal: float = typer.Option(0.5, "--diurnal", help="day/night swing of the arrival rate, 0-<1"),
    estimate_share: float = typer.Option(0.5, "--estimate-share", help="share of jobs with a user limit"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Write a synthetic trace sized against CLUSTER (load, size mix, gangs, GPU-model
    constraints, bursty tenants, day/night arrivals); replay it with `corral sim --trace OUT`."""
    from corral.sim.cluster import ClusterError, load_cluster
    from corral.sim.synth import SynthError, SynthSpec, generate, parse_mix
    from corral.sim.trace import write_generic_csv

    out = _a_file("--out", out_text)
    _not_an_input({"--out": out}, {"--cluster": cluster})
    try:
        low, sep, high = burst_size.partition("-")
        if not sep or not low.strip().isdigit() or not high.strip().isdigit():
            raise SynthError(f"--burst-size: {burst_size!r} is not LOW-HIGH (e.g. 20-60)")
        spec = SynthSpec(
            jobs=jobs,
            load=load,
            size_mix=parse_mix(size_mix, "--size-mix"),
            gang_share=gang_share,
            gang_instances=parse_mix(gang_instances, "--gang-instances"),
            constrained_share=constrained_share,
            bursty=tuple(g.strip() for g in ("burst" if bursty is None else bursty).split(",") if g.strip()),
            burst_share=burst_share,
            burst_size=(int(low), int(high)),
            diurnal=diurnal,
            estimate_share=estimate_share,
            seed=seed,
        )
        loaded = load_cluster(cluster)
        named = {g.name for g in loaded.groups}
        unknown = [g for g in spec.bursty if g not in named] if bursty is not None else []
        if unknown:  # the default `burst` is skipped on a cluster without it; a named group is not
            groups = ", ".join(sorted(named))
            raise SynthError(
                f"--bursty: cluster {loaded.name} has no group {unknown[0]!r}; its groups: {groups}"
            )
        made = generate(spec, loaded)
    except SynthError as exc:
        _fail(_as_synth_option(str(exc)))
    except ClusterError as exc:
        _fail(str(exc))
    with _results_where({"--out": out}, {}):
        write_generic_csv(made.jobs, out)
    for note in made.notes:
        typer.echo(f"wrote {out}: {note}")


def _a_file(option: str, text: str) -> Path:
    """A file to write, refused when it names a directory: `--out traces/` wrote a file named
    `traces` (a Path drops the trailing slash), and an existing directory failed on opening it."""
    if text.endswith("/") or Path(text).is_dir():
        example = Path(text) / "trace.csv"
        _fail(f"{option} {text}: is a directory; give the file to write in it, e.g. {example}")
    return Path(text)


def _as_synth_option(message: str) -> str:
    """A SynthSpec error names the field (`load must be > 0`, `size_mix: 16 GPUs is ...`), as the
    benches that build one want; on the command line, the option (`--load`, `--size-mix`)."""
    import dataclasses

    from corral.sim.synth import SynthSpec

    first, rest = message.split(" ", 1) if " " in message else (message, "")
    field = first.rstrip(":")
    if field in {f.name for f in dataclasses.fields(SynthSpec)}:
        return f"--{field.replace('_', '-')}{first[len(field) :]} {rest}".rstrip()
    return message


def register(app: typer.Typer) -> None:
    """Add `corral sim` and `corral sim compare` to the root `corral` app."""
    app.add_typer(sim_app, name="sim")
