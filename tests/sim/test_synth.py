"""`corral sim synth`: the generated workload has the properties its spec asks for."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app
from corral.sim.cluster import load_cluster
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
        ("--size-mix", "1:nan,2:1", "size_mix needs positive sizes"),
        ("--gang-instances", "2:inf", "gang_instances needs positive sizes"),
        ("--load", "inf", "load must be > 0 and finite"),
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
