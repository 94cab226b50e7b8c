from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from corral.cli.main import app
from corral.sim.trace import write_generic_csv

from .helpers import trace

REQUIRED_KEYS = {
    "jobs",
    "avg_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "p99_queue_s",
    "makespan_s",
    "gpu_alloc_rate",
    "jain_fairness",
    "eta_median_abs_err_s",
    "wall_s",
}


def _files(tmp_path: Path) -> tuple[Path, Path]:
    csv = tmp_path / "t.csv"
    write_generic_csv(trace(("a", 0, 100, 4), ("b", 1, 50, 4), ("c", 2, 10, 1)).jobs, csv)
    yaml = tmp_path / "c.yaml"
    yaml.write_text("pools: [{name: n, count: 1, gpus_per_node: 4}]\ngroups: [{name: g, guaranteed: 4}]\n")
    return csv, yaml


def test_sim_json_output_has_the_documented_keys(tmp_path: Path) -> None:
    csv, yaml = _files(tmp_path)
    res = CliRunner().invoke(
        app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--policy", "fifo", "-o", "json"]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout.strip().splitlines()[-1])
    assert set(data) >= REQUIRED_KEYS
    assert data["jobs"] == 3 and data["makespan_s"] == 160.0
    assert data["avg_queue_s"] == (0 + 99 + 148) / 3


def test_sim_compare_prints_a_row_per_policy_and_writes_plots(tmp_path: Path) -> None:
    csv, yaml = _files(tmp_path)
    out = tmp_path / "plots"
    args = ["sim", "compare", "--trace", str(csv), "--cluster", str(yaml), "--policies", "fifo,sjf,las"]
    res = CliRunner().invoke(app, [*args, "--out", str(out)])
    assert res.exit_code == 0, res.output
    for policy in ("fifo", "sjf", "las"):
        assert policy in res.stdout
    for name in ("jct_cdf.png", "queue_cdf.png", "gpu_alloc.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_compare_reads_estimates_at_the_eta_interval(tmp_path: Path) -> None:
    """`compare` takes --eta-interval as `sim` does: read once an hour, the two jobs that waited
    started before any read after their submit, so neither was shown an estimate."""
    csv, yaml = _files(tmp_path)
    args = ["sim", "compare", "--trace", str(csv), "--cluster", str(yaml), "--policies", "fifo", "-o", "json"]
    shown = []
    for extra in ([], ["--eta-interval", "3600"]):
        res = CliRunner().invoke(app, [*args, *extra])
        assert res.exit_code == 0, res.output
        shown.append(json.loads(res.stdout.strip().splitlines()[-1])[0]["eta_jobs"])
    assert shown == [2, 0]


def test_bad_inputs_give_clear_errors(tmp_path: Path) -> None:
    csv, yaml = _files(tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("submit_time,duration,num_gpus,group\n0,10,x,g\n")
    runner = CliRunner()
    res = runner.invoke(app, ["sim", "--trace", str(bad), "--cluster", str(yaml)])
    assert res.exit_code == 2 and "bad.csv: line 2: column 'num_gpus'" in res.output
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--policy", "nope"])
    assert res.exit_code == 2 and "unknown policy 'nope'" in res.output
    res = runner.invoke(app, ["sim", "--trace", str(csv)])
    assert res.exit_code == 2 and "--cluster are required" in res.output
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--eta-interval", "-1"])
    assert res.exit_code == 2 and "--eta-interval" in res.output
    for option, value in (("--eta-interval", "inf"), ("--cycle-interval", "nan"), ("--cycle-interval", "-5")):
        res = runner.invoke(app, ["sim", "--trace", str(csv), "--cluster", str(yaml), option, value])
        assert res.exit_code == 2 and f"{option} must be a finite number >= 0" in res.output, res.output
    res = runner.invoke(app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--arrival-speedup", "-1"])
    assert res.exit_code == 2 and "(--arrival-speedup) must be positive and finite, got -1" in res.output


def test_nan_and_inf_knobs_are_refused_by_name(tmp_path: Path) -> None:
    """`--knob default_runtime_s=nan` ended in a traceback at the first cycle (cannot convert float
    NaN to integer); `starvation_s=nan`, `grace_s=inf` and `las_thresholds=nan` were taken
    silently (a nan passes `< 0`), turning the guard off or never stopping a victim."""
    csv, yaml = _files(tmp_path)
    for knob in ("default_runtime_s=nan", "starvation_s=nan", "grace_s=inf", "las_thresholds=3600,nan"):
        res = CliRunner().invoke(app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--knob", knob])
        name = knob.partition("=")[0]
        assert res.exit_code == 2 and f"{name} must be >= 0 and finite" in res.output, (knob, res.output)


def test_output_paths_are_checked_before_the_replay(tmp_path: Path) -> None:
    """`--jobs-out` in a folder that did not exist, or `--out` where a file is, ended the command
    with a traceback (FileNotFoundError, FileExistsError) after the whole replay, losing it."""
    csv, yaml = _files(tmp_path)
    (tmp_path / "taken").write_text("")
    base = ["sim", "--trace", str(csv), "--cluster", str(yaml)]
    res = CliRunner().invoke(app, [*base, "--jobs-out", str(tmp_path / "new" / "jobs.csv"), "-o", "json"])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "new" / "jobs.csv").read_text().startswith("time,job_id,event")
    cases = [
        [*base, "--out", str(tmp_path / "taken")],
        ["sim", "compare", "--trace", str(csv), "--cluster", str(yaml), "--out", str(tmp_path / "taken")],
        ["sim", "synth", "--out", str(tmp_path / "taken" / "t.csv"), "--jobs", "5"],
    ]
    for args in cases:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "a file of that name is there" in res.output, (args, res.output)
    res = CliRunner().invoke(app, [*base, "--jobs-out", str(tmp_path)])
    assert res.exit_code == 2 and "is a folder; give a file name" in res.output, res.output


def test_a_failed_run_removes_the_folders_it_made_and_keeps_those_that_were_there(tmp_path: Path) -> None:
    """A replay that failed (a missing trace, a bad knob) left the `--out` folder it had made
    before the replay behind, empty, and so `--jobs-out`'s and `synth --out`'s new folders."""
    csv, yaml = _files(tmp_path)
    base = ["sim", "--trace", str(csv), "--cluster", str(yaml)]
    failing = [
        [
            "sim",
            "--trace",
            str(tmp_path / "missing.csv"),
            "--cluster",
            str(yaml),
            "--out",
            str(tmp_path / "a" / "b"),
        ],
        [
            *base,
            "--knob",
            "no_such_knob=1",
            "--out",
            str(tmp_path / "a"),
            "--jobs-out",
            str(tmp_path / "ev" / "j.csv"),
        ],
        [
            "sim",
            "compare",
            "--trace",
            str(tmp_path / "missing.csv"),
            "--cluster",
            str(yaml),
            "--out",
            str(tmp_path / "a"),
        ],
        [
            "sim",
            "synth",
            "--cluster",
            "no-such-cluster",
            "--out",
            str(tmp_path / "a" / "t.csv"),
            "--jobs",
            "5",
        ],
    ]
    for args in failing:
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 2 and "error:" in res.output, (args, res.output)
        assert not (tmp_path / "a").exists() and not (tmp_path / "ev").exists(), args
    kept = tmp_path / "kept"
    (kept / "inner").mkdir(parents=True)
    (kept / "notes.txt").write_text("mine")
    res = CliRunner().invoke(app, [*base, "--knob", "no_such_knob=1", "--out", str(kept / "inner")])
    assert res.exit_code == 2 and (kept / "inner").is_dir() and (kept / "notes.txt").read_text() == "mine"
    res = CliRunner().invoke(app, [*base, "--out", str(tmp_path / "a" / "b"), "-o", "json"])
    assert res.exit_code == 0 and (tmp_path / "a" / "b" / "summary.json").is_file(), res.output


def test_a_result_is_not_written_over_the_trace_or_cluster_it_reads(tmp_path: Path) -> None:
    """`corral sim --trace t.csv --jobs-out t.csv` replaced the trace with the job events, and
    `corral sim synth --cluster c.yaml --out c.yaml` the cluster file with the trace, silently."""
    csv, yaml = _files(tmp_path)
    trace_text, cluster_text = csv.read_text(), yaml.read_text()
    res = CliRunner().invoke(
        app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--jobs-out", str(csv)]
    )
    assert res.exit_code == 2 and "is the --trace file, which it would overwrite" in res.output, res.output
    res = CliRunner().invoke(app, ["sim", "synth", "--cluster", str(yaml), "--out", str(yaml), "--jobs", "5"])
    assert res.exit_code == 2 and "is the --cluster file, which it would overwrite" in res.output, res.output
    assert csv.read_text() == trace_text and yaml.read_text() == cluster_text


def test_compare_checks_its_policies_and_output_before_any_replay(tmp_path: Path, monkeypatch: Any) -> None:
    """A typo in the last of `--policies` failed only after every replay before it (minutes each
    on a whole trace); `--policies ''` printed an empty table and `-o xml` the table, exit 0."""
    import corral.sim.runner

    csv, yaml = _files(tmp_path)
    replays: list[str] = []
    real = corral.sim.runner.simulate
    monkeypatch.setattr(
        corral.sim.runner, "simulate", lambda tr, cl, spec, *a: replays.append(spec) or real(tr, cl, spec, *a)
    )
    base = ["sim", "compare", "--trace", str(csv), "--cluster", str(yaml)]
    for extra, error in (
        (["--policies", "default,fifo,sjff"], "unknown policy 'sjff'"),
        (["--policies", " , "], "--policies: give at least one policy"),
        (["-o", "xml"], "unknown output 'xml'; use table, markdown or json"),
    ):
        res = CliRunner().invoke(app, [*base, *extra])
        assert res.exit_code == 2 and error in res.output, (extra, res.output)
    assert replays == []


def test_from_cluster_checks_policy_and_knobs_before_fetching(monkeypatch: Any) -> None:
    """`--from-cluster --policy sjff` (or a bad --placement or knob value) fetched the whole
    history and replayed it under the current settings before failing on the changed policy."""
    import corral.cli.sim_live

    def fetch(request: Any) -> Any:
        raise AssertionError("fetched")

    monkeypatch.setattr(corral.cli.sim_live, "_fetch", fetch)
    for extra, error in (
        (["--policy", "sjff"], "unknown policy 'sjff'"),
        (["--placement", "diagonal"], "unknown placement 'diagonal'; use one of bestfit, spread, random"),
        (["--knob", "grace_s=nan"], "grace_s must be >= 0 and finite"),
    ):
        res = CliRunner().invoke(app, ["sim", "--from-cluster", *extra])
        assert res.exit_code == 2 and error in res.output, (extra, res.output)


def test_options_of_the_other_mode_are_refused_by_name(tmp_path: Path) -> None:
    """A trace's replay and --from-cluster each refuse the other's options, before any work."""
    cases = [
        (["--from-cluster", "--trace", "t.csv"], "leave out --trace and --cluster"),
        (["--from-cluster", "--jobs-out", "j.csv"], "--jobs-out do not go with --from-cluster"),
        (["--from-cluster", "--private-baseline"], "--jobs-out do not go with --from-cluster"),
        (["--trace", "t.csv", "--cluster", "c.yaml", "--quota", "g=1"], "go with --from-cluster"),
        (["--trace", "t.csv", "--cluster", "c.yaml", "--save-trace", "x.csv"], "go with --from-cluster"),
    ]
    for args, error in cases:
        res = CliRunner().invoke(app, ["sim", *args])
        assert res.exit_code == 2 and error in res.output, (args, res.output)


def test_shipped_trace_and_cluster_by_name() -> None:
    res = CliRunner().invoke(
        app, ["sim", "--trace", "philly", "--cluster", "philly", "--max-jobs", "300", "-o", "json"]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout.strip().splitlines()[-1])
    assert data["jobs"] + data["jobs_unfinished"] + data["jobs_rejected"] == 300
    assert data["jobs_rejected"] == 0 and data["cluster_gpus"] == 752
    assert any("first 300 jobs" in note for note in data["notes"])


def test_compare_warns_when_no_job_waited(tmp_path: Path) -> None:
    """A trace cut short (here one job) never queues: every policy must agree, so say why."""
    csv, yaml = _files(tmp_path)
    # sjf-oracle: plain sjf has no history to order these three jobs by, so it would agree with fifo
    args = ["sim", "compare", "--trace", str(csv), "--cluster", str(yaml), "--policies", "fifo,sjf-oracle"]
    res = CliRunner().invoke(app, [*args, "--max-jobs", "1", "-o", "json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)) == 2  # stdout stays valid JSON
    assert "no job waited under any policy: the cluster is larger than the load" in res.stderr
    assert "1 job on 4 GPUs" in res.stderr and "--arrival-speedup" in res.stderr
    res = CliRunner().invoke(app, args)  # jobs do wait here: no warning
    assert res.exit_code == 0 and "warning" not in res.stderr, res.stderr


def test_compare_warns_when_policies_give_identical_results(tmp_path: Path) -> None:
    csv = tmp_path / "serial.csv"  # jobs wait, but there is only ever one way to run them
    write_generic_csv(trace(("a", 0, 100, 4), ("b", 1, 100, 4)).jobs, csv)
    _, yaml = _files(tmp_path)
    args = ["sim", "compare", "--trace", str(csv), "--cluster", str(yaml), "--policies", "fifo,sjf"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "every policy gave identical results" in res.stderr


def test_help_names_every_shipped_trace_and_cluster() -> None:
    # The help strings are written out (the CLI does not import the simulator to start), so this
    # keeps them in step with what load_trace / load_cluster accept.
    from corral.cli.sim import CLUSTER_HELP, TRACE_HELP
    from corral.sim.cluster import SHIPPED_CLUSTERS
    from corral.sim.trace import SHIPPED_TRACES

    assert [c for c in SHIPPED_CLUSTERS if c not in CLUSTER_HELP] == []
    assert [t for t in SHIPPED_TRACES if t not in TRACE_HELP] == []


def test_a_trace_none_of_whose_jobs_can_run_is_refused_with_the_reasons(tmp_path: Path) -> None:
    """Every job too wide for every node: `sim` printed a table of zeros, exit 0, and `compare`
    added that the policies were too alike to tell apart (use --arrival-speedup)."""
    csv = tmp_path / "wide.csv"
    write_generic_csv(trace(("a", 0, 100, 8), ("b", 1, 50, 16)).jobs, csv)
    _, yaml = _files(tmp_path)
    out = tmp_path / "plots"
    for command in (["sim"], ["sim", "compare", "--policies", "fifo,sjf", "--out", str(out)]):
        res = CliRunner().invoke(app, [*command, "--trace", str(csv), "--cluster", str(yaml)])
        assert res.exit_code == 2, res.output
        assert "none of the 2 jobs of trace wide.csv can run on cluster" in res.stderr
        assert "e.g. a: task worker needs 8 GPUs, 1 CPU" in res.stderr, res.stderr  # not "8 GPU GPUs"
        assert "the largest node has 4" in res.stderr
        assert "identical results" not in res.output
    assert not out.exists()
    write_generic_csv(trace(("a", 0, 100, 8)).jobs, csv)  # one job: not "none of the 1 job"
    res = CliRunner().invoke(app, ["sim", "--trace", str(csv), "--cluster", str(yaml)])
    assert res.exit_code == 2 and "the only job of trace wide.csv cannot run on cluster" in res.stderr
    # --max-jobs cut the trace short: not "the only job" nor "none of the N jobs" of the trace
    write_generic_csv(trace(("a", 0, 100, 8), ("b", 1, 50, 16), ("c", 2, 10, 12)).jobs, csv)
    cuts = {
        "1": "the first job of trace wide.csv cannot",
        "2": "none of the first 2 jobs of trace wide.csv can",
    }
    for cut, said in cuts.items():
        for command in (["sim"], ["sim", "compare", "--policies", "fifo,sjf"]):
            args = [*command, "--trace", str(csv), "--cluster", str(yaml), "--max-jobs", cut]
            res = CliRunner().invoke(app, args)
            assert res.exit_code == 2 and f"{said} run on cluster" in res.stderr, res.output
    res = CliRunner().invoke(app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--max-jobs", "5"])
    assert res.exit_code == 2 and "none of the 3 jobs of trace wide.csv can" in res.stderr, res.output


def test_compare_shows_rejected_jobs_and_warns_when_policies_replay_different_jobs(tmp_path: Path) -> None:
    """A job over its group's quota with borrowing off is rejected by a policy with quotas and run
    by one without: compare's `jobs` column quietly differed, with nothing saying why."""
    csv = tmp_path / "t.csv"
    write_generic_csv(trace(("big", 0, 100, 4), ("small", 5, 10, 1)).jobs, csv)
    yaml = tmp_path / "c.yaml"
    yaml.write_text(
        "pools: [{name: n, count: 2, gpus_per_node: 4}]\n"
        "groups: [{name: g, guaranteed: 2, borrowing: false}, {name: h, guaranteed: 6}]\n"
    )
    args = ["sim", "compare", "--trace", str(csv), "--cluster", str(yaml), "--policies", "default,fifo"]
    res = CliRunner().invoke(app, [*args, "-o", "markdown"])
    assert res.exit_code == 0, res.output
    head, _, default, fifo = res.stdout.strip().splitlines()[:4]
    assert head.startswith("| policy | jobs | rejected |")
    assert default.startswith("| default | 1 | 1 |") and fifo.startswith("| fifo | 2 | 0 |")
    assert "the policies replayed different jobs: rejected default 1, fifo 0" in res.stderr
    res = CliRunner().invoke(app, [*args[:-1], "fifo,sjf", "-o", "json"])
    assert res.exit_code == 0 and "different jobs" not in res.stderr, res.stderr


def test_save_trace_refuses_the_options_of_a_replay_before_fetching(tmp_path: Path, monkeypatch: Any) -> None:
    """`--save-trace` only exports: a `--quota` change given with it was not in the saved cluster,
    and `--out DIR` was made and left empty, both without a word."""
    import corral.cli.sim_live

    def fetch(request: Any) -> Any:
        raise AssertionError("fetched")

    monkeypatch.setattr(corral.cli.sim_live, "_fetch", fetch)
    saved, out = tmp_path / "live.csv", tmp_path / "whatif"
    for extra, named in (
        (["--quota", "vision=2"], "--quota belongs to a replay: leave it out"),
        (
            ["--policy", "fifo", "--knob", "starvation_s=60"],
            "--policy, --knob belong to a replay: leave them out",
        ),
        (["--out", str(out)], "--out belongs to a replay"),
    ):
        res = CliRunner().invoke(app, ["sim", "--from-cluster", "--save-trace", str(saved), *extra])
        assert res.exit_code == 2 and "--save-trace only writes the trace" in res.stderr, res.output
        assert named in res.stderr, res.stderr
    assert not out.exists() and not saved.exists()


def test_compare_takes_knobs_and_checkpoint_on_preempt_for_every_policy(tmp_path: Path) -> None:
    """`sim` had --knob and --checkpoint-on-preempt, `sim compare` neither: LAS levels or the
    default policy's knobs could be compared only through a cluster file. A 4-GPU job arrives
    while a 2-GPU job runs on the 4-GPU node: LAS (threshold 100 GPU-s) preempts it at 50 s."""
    _, yaml = _files(tmp_path)
    csv = tmp_path / "demote.csv"
    write_generic_csv(trace(("long", 0, 1000, 2), ("wide", 100, 10, 4)).jobs, csv)
    args = ["sim", "compare", "--trace", str(csv), "--cluster", str(yaml), "--policies", "las,fifo"]
    figures = {}
    knob = ["--knob", "las_thresholds=100"]
    for extra in ([], knob, [*knob, "--checkpoint-on-preempt"]):
        res = CliRunner().invoke(app, [*args, "--checkpoint-interval", "0", *extra, "-o", "json"])
        assert res.exit_code == 0, res.output
        las, fifo = json.loads(res.stdout)
        assert fifo["preemptions"] == 0
        figures[len(extra)] = (las["preemptions"], las["lost_work_gpu_h"])
    assert figures[0] == (0, 0.0)  # the default thresholds (3,600 GPU-s and up): nothing to demote
    assert figures[2][0] == 1 and figures[2][1] > 0  # demoted and preempted: no checkpoint, work lost
    assert figures[3] == (1, 0.0)  # saved when signalled
    res = CliRunner().invoke(app, [*args, "--knob", "las_thresholdz=1"])
    assert res.exit_code == 2 and "--knob 'las_thresholdz=1': use NAME=VALUE" in res.stderr


def test_from_cluster_refuses_a_window_none_of_whose_jobs_fits_the_nodes_now(monkeypatch: Any) -> None:
    """Every job of the window asks for a GPU model whose nodes are gone (replaced by others): the
    what-if printed two tables of zeros and a per-group table of dashes, exit 0."""
    import corral.cli.sim_live

    jobs = [
        {
            "submit_time": i,
            "duration": 60,
            "num_gpus": 1,
            "group": "g",
            "gpu_model": "V100",
            "job_id": f"j{i}",
        }
        for i in range(3)
    ]
    pools = [{"name": "a", "count": 1, "gpus_per_node": 4, "gpu_model": "A100"}]
    export = {
        "jobs": jobs,
        "since": 0.0,
        "notes": [],
        "policy": "default",
        "cluster": {"name": "live", "pools": pools, "groups": [{"name": "g", "guaranteed": 4}]},
    }
    monkeypatch.setattr(corral.cli.sim_live, "_fetch", lambda request: export)
    res = CliRunner().invoke(app, ["sim", "--from-cluster", "--quota", "g=2"])
    assert res.exit_code == 2, res.output
    assert (
        "none of the 3 jobs since 1970-01-01 00:00:00 UTC can run on the cluster as it is now" in res.stderr
    )
    assert (
        "(4 GPUs), nor with the changes asked for (g: guaranteed 2); with them, "
        "e.g. j0: task worker asks for GPU model V100; this cluster has A100"
    ) in " ".join(res.stderr.split())
    assert "j1:" not in res.stderr  # one job per reason
    plain = CliRunner().invoke(app, ["sim", "--from-cluster"])  # nothing changed: the current replay's
    assert plain.exit_code == 2, plain.output
    assert "(4 GPUs); e.g. j0: task worker asks" in plain.stderr


def test_from_cluster_shows_a_what_if_whose_changes_let_jobs_the_current_settings_reject_run(
    monkeypatch: Any,
) -> None:
    """review110 #4: group g guarantees 2 GPUs without borrowing and its jobs ask for 4: the
    current settings reject every job, and asking what a quota of 4 or fifo would do is exactly
    the question; it was refused as a window whose jobs cannot run."""
    import corral.cli.sim_live

    jobs = [
        {"submit_time": i, "duration": 60, "num_gpus": 4, "group": "g", "job_id": f"j{i}"} for i in range(3)
    ]
    pools = [{"name": "a", "count": 2, "gpus_per_node": 4, "gpu_model": "A100"}]
    groups = [{"name": "g", "guaranteed": 2, "borrowing": False}]
    export = {
        "jobs": jobs,
        "since": 0.0,
        "notes": [],
        "policy": "default",
        "cluster": {"name": "live", "pools": pools, "groups": groups},
    }
    monkeypatch.setattr(corral.cli.sim_live, "_fetch", lambda request: export)
    for change in (["--quota", "g=4"], ["--policy", "fifo"]):
        res = CliRunner().invoke(app, ["sim", "--from-cluster", *change, "-o", "json"])
        assert res.exit_code == 0, res.output
        report = json.loads(res.stdout)
        current, changed = report["summaries"]
        assert (current["jobs"], changed["jobs"]) == (0, 3), report["summaries"]
    res = CliRunner().invoke(app, ["sim", "--from-cluster"])  # the current settings alone: refused
    assert res.exit_code == 2
    assert "none of the 3 jobs" in res.stderr and "its group's quota can never admit it" in res.stderr


def test_synth_refuses_an_out_that_names_a_directory(tmp_path: Path) -> None:
    """`corral sim synth --out traces/` wrote a file named `traces`."""
    res = CliRunner().invoke(app, ["sim", "synth", "--out", f"{tmp_path / 'traces'}/", "--jobs", "5"])
    assert res.exit_code == 2, res.output
    assert f"--out {tmp_path / 'traces'}/: is a directory; give the file to write in it" in res.stderr
    assert not (tmp_path / "traces").exists()
    res = CliRunner().invoke(app, ["sim", "synth", "--out", str(tmp_path), "--jobs", "5"])
    assert res.exit_code == 2 and f"--out {tmp_path}: is a directory" in res.stderr, res.output
    res = CliRunner().invoke(app, ["sim", "synth", "--out", str(tmp_path / "t.csv"), "--jobs", "5"])
    assert res.exit_code == 0 and (tmp_path / "t.csv").is_file(), res.output


def test_jobs_out_is_written_when_a_replay_is_refused_as_having_nothing_to_run(tmp_path: Path) -> None:
    """rough14 #3: the refusal wrote no `--jobs-out`, which is where every rejected job's reason
    is (the refusal shows the first few), and removed the folder it had made for it."""
    csv = tmp_path / "wide.csv"
    write_generic_csv(trace(("a", 0, 100, 8), ("b", 1, 50, 16)).jobs, csv)
    _, yaml = _files(tmp_path)
    jobs = tmp_path / "new" / "jobs.csv"
    out = tmp_path / "plots"
    args = ["sim", "--trace", str(csv), "--cluster", str(yaml), "--jobs-out", str(jobs), "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2 and "none of the 2 jobs of trace wide.csv can run on cluster" in res.stderr
    assert f"(every job's reason is in {jobs})" in res.stderr
    assert [p.name for p in jobs.parent.iterdir()] == ["jobs.csv"]  # written beside it, renamed
    rows = jobs.read_text().splitlines()
    assert rows[0] == "time,job_id,event,nodes,gpus,reason"
    assert [row.split(",")[1:3] for row in rows[1:]] == [["a", "reject"], ["b", "reject"]]
    assert "needs 8 GPUs" in rows[1] and "needs 16 GPUs" in rows[2]
    assert not out.exists()  # the summary and plots folder, made for this run, still removed


def test_a_jobs_out_that_cannot_be_written_is_one_line_before_the_replay(tmp_path: Path) -> None:
    """review112 #9: a --jobs-out whose folder is there but which cannot be opened (here in
    /proc/self) ended the command with a traceback (exit 1) after the replay; review113 #1: it
    is refused before the replay (which can take minutes), so the refusal of a trace with
    nothing to run does not follow."""
    csv, yaml = _files(tmp_path)
    jobs_out = "/proc/self/jobs.csv"
    res = CliRunner().invoke(
        app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--jobs-out", jobs_out]
    )
    assert isinstance(res.exception, SystemExit), res.exception  # not a traceback
    assert res.exit_code == 2 and f"--jobs-out {jobs_out}: cannot write it (" in res.stderr, res.output
    wide = tmp_path / "wide.csv"
    write_generic_csv(trace(("a", 0, 100, 8), ("b", 1, 50, 16)).jobs, wide)
    res = CliRunner().invoke(
        app, ["sim", "--trace", str(wide), "--cluster", str(yaml), "--jobs-out", jobs_out]
    )
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines() == [
        f"error: --jobs-out {jobs_out}: cannot write it (No such file or directory)"
    ]
    unwritable = tmp_path / "locked"
    unwritable.mkdir(mode=0o500)
    if not os.access(unwritable, os.W_OK):  # (root may write anywhere)
        res = CliRunner().invoke(
            app,
            ["sim", "--trace", str(wide), "--cluster", str(yaml), "--jobs-out", str(unwritable / "j.csv")],
        )
        assert res.exit_code == 2 and "cannot write it (Permission denied)" in res.stderr, res.output
        assert "none of the 2 jobs" not in res.stderr


def test_jobs_out_writes_through_a_symlink_and_keeps_the_file_mode(tmp_path: Path) -> None:
    """review113 #1: the CSV made beside the path and renamed over it replaced a symlink with a
    plain file (its target kept the old run's rows) and gave a 0600 file umask's 0644."""
    csv, yaml = _files(tmp_path)
    target = tmp_path / "results" / "jobs.csv"
    target.parent.mkdir()
    target.write_text("old\n")
    target.chmod(0o600)
    link = tmp_path / "link.csv"
    link.symlink_to(target)
    res = CliRunner().invoke(
        app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--jobs-out", str(link)]
    )
    assert res.exit_code == 0, res.output
    assert link.is_symlink() and link.resolve() == target
    assert target.read_text().startswith("time,job_id,event,nodes,gpus,reason\n")
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["jobs.csv"]  # no part left beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "link.csv", "results", "t.csv"]


def test_jobs_out_writes_into_a_pipe_given_as_a_dev_fd_path(tmp_path: Path) -> None:
    """review113 #1: `--jobs-out /dev/fd/N` (bash's `>(gzip > j.gz)`) was refused after the
    replay: a file cannot be made in /dev/fd to rename over it. Written into, as opened."""
    csv, yaml = _files(tmp_path)
    read_end, write_end = os.pipe()
    try:
        res = CliRunner().invoke(
            app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--jobs-out", f"/dev/fd/{write_end}"]
        )
        os.close(write_end)
        write_end = -1
        with os.fdopen(read_end, encoding="utf-8") as pipe:
            read_end = -1
            rows = pipe.read().splitlines()
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    assert res.exit_code == 0, res.output
    assert rows[0] == "time,job_id,event,nodes,gpus,reason" and len(rows) > 3


def test_jobs_out_in_dev_shm_is_a_file_and_a_symlink_loop_is_one_line(tmp_path: Path) -> None:
    """review114 #1, #2, #4: every path in /dev was written in place, so a new file in /dev/shm
    was refused as missing; a process's own streams are still written into (renaming over what
    /dev/stdout leads to would replace the file stdout writes to); a symlink loop was a
    traceback before the replay."""
    from corral.cli.sim_jobs_out import in_place as _jobs_out_in_place

    assert not _jobs_out_in_place(Path("/dev/shm/corral-no-such-file.csv"))
    for streams in ("/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"):
        assert _jobs_out_in_place(Path(streams)), streams
    csv, yaml = _files(tmp_path)
    loop = tmp_path / "loop.csv"
    loop.symlink_to(loop)
    res = CliRunner().invoke(
        app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--jobs-out", str(loop)]
    )
    assert isinstance(res.exception, SystemExit), res.exception  # not a traceback
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines() == [
        f"error: --jobs-out {loop}: cannot write it (Too many levels of symbolic links)"
    ]


def test_jobs_out_refuses_a_socket_first_and_writes_into_a_file_it_may_not_replace(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """review114 #3: a UNIX socket passed the up-front check and failed after the replay (open()
    of a socket: ENXIO); another account's file in a sticky folder (/tmp) passed it too, and its
    rename failed (EPERM: only its owner may replace it; root may, so the refusal is injected
    here): it is written into instead, as a file that is its own mount is."""
    import errno
    import socket

    csv, yaml = _files(tmp_path)
    listening = socket.socket(socket.AF_UNIX)
    try:
        listening.bind(str(tmp_path / "s.sock"))
        res = CliRunner().invoke(
            app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--jobs-out", str(tmp_path / "s.sock")]
        )
    finally:
        listening.close()
    assert res.exit_code == 2, res.output
    assert res.stderr.strip().splitlines() == [
        f"error: --jobs-out {tmp_path / 's.sock'}: cannot write it (it is a socket)"
    ]
    target = tmp_path / "theirs.csv"
    target.write_text("old\n")

    def owner_only(src: Any, dst: Any) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "replace", owner_only)
    res = CliRunner().invoke(
        app, ["sim", "--trace", str(csv), "--cluster", str(yaml), "--jobs-out", str(target)]
    )
    assert res.exit_code == 0, res.output
    assert target.read_text().startswith("time,job_id,event,nodes,gpus,reason\n")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".part")) == []
