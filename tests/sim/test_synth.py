"""`corral sim synth`: the generated workload has the properties its spec asks for."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.scheduler import check_fits_anywhere
from corral.sim.cluster import load_cluster, parse_cluster
from corral.sim.replay import _probe_job
from corral.sim.synth import SynthError, SynthSpec, generate, parse_mix
from corral.sim.trace import load_generic_csv


def test_synth_trace_matches_its_spec_and_is_reproducible() -> None:
    cluster = load_cluster("synth")
    spec = SynthSpec(jobs=1500, load=1.4, gang_share=0.3, constrained_share=0.4, seed=3)
    trace = generate(spec, cluster)
    assert trace == generate(spec, cluster)  # same seed, same trace
    assert trace != generate(SynthSpec(jobs=1500, load=1.4, seed=4), cluster)
    jobs = trace.jobs
    assert len(jobs) == 1500
    window = jobs[-1].submit_time - jobs[0].submit_time
    offered = sum(j.num_gpus * j.duration for j in jobs) / (cluster.total_gpus * window)
    assert offered == pytest.approx(1.4, rel=0.1)  # the last arrival ends the window
    gangs = sum(j.instances > 1 for j in jobs) / len(jobs)
    assert 0.2 <= gangs <= 0.35  # infer (T4-only) jobs are never gangs
    assert sum(j.gpu_model is not None for j in jobs) / len(jobs) >= 0.4
    assert all(j.gpu_model == "T4" and j.num_gpus <= 4 for j in jobs if j.group == "infer")
    # the bursty tenant submits runs of the same job name a second apart
    burst = [j for j in jobs if j.group == "burst"]
    assert len(burst) == pytest.approx(0.15 * 1500, abs=1)
    same_name = Counter(j.name for j in burst)
    assert max(same_name.values()) >= 20
    # user limits never cut a run short
    assert all(j.max_runtime_s is None or j.max_runtime_s >= j.duration for j in jobs)
    assert any(j.max_runtime_s is not None for j in jobs)


def test_bad_synth_specs_name_the_parameter() -> None:
    cluster = load_cluster("synth")
    with pytest.raises(SynthError, match="load must be > 0"):
        generate(SynthSpec(load=0), cluster)
    with pytest.raises(SynthError, match="gang_share"):
        generate(SynthSpec(gang_share=1.5), cluster)
    with pytest.raises(SynthError, match="--size-mix"):
        parse_mix("1:x", "--size-mix")


def test_nan_and_inf_in_a_synth_spec_are_refused_by_name(tmp_path: Path) -> None:
    """`--size-mix 1:nan` (or a weight inf) ended in a traceback from random.choices ('Total of
    weights must be finite'); `--load inf` wrote a trace with every job submitted at time 0."""
    out = tmp_path / "t.csv"
    for option, value, error in (
        ("--size-mix", "1:nan,2:1", "error: --size-mix needs positive sizes"),
        ("--gang-instances", "2:inf", "error: --gang-instances needs positive sizes"),
        ("--load", "inf", "error: --load must be > 0 and finite"),
        # the option named as typed, not SynthSpec's field (`load must be`, `gang_share must be`)
        ("--load", "-1", "error: --load must be > 0 and finite, got -1"),
        ("--gang-share", "1.5", "error: --gang-share must be between 0 and 1, got 1.5"),
        ("--estimate-share", "-0.1", "error: --estimate-share must be between 0 and 1"),
        ("--diurnal", "1", "error: --diurnal must be in [0, 1), got 1"),
        ("--burst-size", "60-20", "error: --burst-size must be LOW-HIGH with 1 <= LOW <= HIGH"),
    ):
        res = CliRunner().invoke(app, ["sim", "synth", "--out", str(out), "--jobs", "20", option, value])
        assert res.exit_code == 2 and error in res.output, (option, value, res.output)


def test_cli_writes_a_trace_the_simulator_reads(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    args = ["sim", "synth", "--out", str(out), "--jobs", "300", "--load", "1.5", "--seed", "1"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    loaded = load_generic_csv(out)
    assert len(loaded.jobs) == 300
    assert loaded.jobs == generate(SynthSpec(jobs=300, load=1.5, seed=1), load_cluster("synth")).jobs
    bad = CliRunner().invoke(app, ["sim", "synth", "--out", str(out), "--burst-size", "9"])
    assert bad.exit_code == 2 and "--burst-size" in bad.output


def test_a_size_no_node_can_place_is_refused_at_generation(tmp_path: Path) -> None:
    """`--size-mix 16:1` on 8-GPU nodes wrote 8-GPU jobs without a word (the size was cut to the
    widest node's width), and a gang of more whole nodes than the cluster has was written for the
    replay to reject every one: both are refused at generation, naming the size and the nodes."""
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(
        app, ["sim", "synth", "--out", str(out), "--jobs", "20", "--size-mix", "8:1,16:1"]
    )
    assert res.exit_code == 2, res.output
    assert "--size-mix: 16 GPUs is more than a node of cluster synth has (the largest: 8 GPUs" in res.output
    assert "multi-node gangs" in res.output and not out.exists()
    with pytest.raises(
        SynthError, match="a gang of 100 whole 8-GPU nodes cannot be placed: cluster synth has 72"
    ):
        generate(SynthSpec(jobs=20, gang_instances={2: 1, 100: 1}), load_cluster("synth"))
    # No gangs asked for: gang_instances is not used, so not checked.
    assert (
        len(generate(SynthSpec(jobs=20, gang_share=0, gang_instances={100: 1}), load_cluster("synth")).jobs)
        == 20
    )


def test_a_constrained_gang_is_pinned_only_to_a_model_with_nodes_enough() -> None:
    """A gang naming a GPU model was pinned to any model whose nodes were wide enough, however
    few: 4-node gangs on a model of 2 nodes, which the replay rejects ('needs 32 GPUs in all')."""
    cluster = parse_cluster(
        {
            "pools": [
                {"name": "h", "count": 2, "gpus_per_node": 8, "gpu_model": "H100"},
                {"name": "a", "count": 8, "gpus_per_node": 8, "gpu_model": "A100"},
            ],
            "groups": [{"name": "g", "guaranteed": 16}],
        },
        "small.yaml",
    )
    spec = SynthSpec(jobs=200, gang_share=1.0, gang_instances={4: 1}, constrained_share=1.0, bursty=())
    jobs = generate(spec, cluster).jobs
    assert all(j.instances == 4 for j in jobs)
    assert {j.gpu_model for j in jobs} == {"A100"}
    nodes = cluster.build_nodes()
    assert all(not check_fits_anywhere(_probe_job(j), nodes) for j in jobs)


def test_a_bursty_group_the_cluster_lacks_is_refused(tmp_path: Path) -> None:
    """`corral sim synth --bursty brust` (a typo) wrote a trace without a single burst and said
    nothing; a group named with --bursty must be the cluster's. The default, `burst`, is still
    skipped on a cluster without it, and `--bursty ''` means no bursts."""
    out = tmp_path / "t.csv"
    base = ["sim", "synth", "--out", str(out), "--jobs", "20"]
    res = CliRunner().invoke(app, [*base, "--bursty", "brust"])
    assert res.exit_code == 2, res.output
    assert "--bursty: cluster synth has no group 'brust'; its groups: burst, infer" in res.output
    assert not out.exists()
    assert CliRunner().invoke(app, [*base, "--cluster", "philly"]).exit_code == 0
    assert CliRunner().invoke(app, [*base, "--bursty", ""]).exit_code == 0
    quiet = load_generic_csv(out).jobs
    assert quiet == generate(SynthSpec(jobs=20, bursty=()), load_cluster("synth")).jobs


def test_cli_says_one_job_not_one_jobs(tmp_path: Path) -> None:
    out = tmp_path / "t.csv"
    res = CliRunner().invoke(app, ["sim", "synth", "--out", str(out), "--jobs", "1"])
    assert res.exit_code == 0 and "synthetic: 1 job, load 1.3" in res.output, res.output


def test_the_notes_give_the_shares_the_trace_has_not_those_asked_for(tmp_path: Path) -> None:
    """`--constrained-share 0.33` wrote a trace in which about 40% of the jobs name a GPU model
    (every job of `infer`, whose guarantee names only T4, does), with nothing saying so."""
    out = tmp_path / "t.csv"
    args = ["sim", "synth", "--out", str(out), "--jobs", "400", "--seed", "2", "--constrained-share", "0.33"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    jobs = load_generic_csv(out).jobs
    named = sum(j.gpu_model is not None for j in jobs) / len(jobs)
    gangs = sum(j.instances > 1 for j in jobs) / len(jobs)
    assert named > 0.36  # more than asked for: infer's jobs all name T4
    assert all(j.gpu_model == "T4" and j.instances == 1 for j in jobs if j.group == "infer")
    said = " ".join(res.output.split())
    assert (
        f"as generated: {gangs:.1%} multi-node gangs, {named:.1%} naming a GPU model (infer: every job"
        in said
    )
    assert "15.0% in bursts" in said
