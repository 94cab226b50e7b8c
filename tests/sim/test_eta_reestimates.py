"""bench/eta_reestimates.py, the calibration scored on re-estimates: reading the extra rolls leaves
the schedule and the first estimates as the shipped replay has them, its `fade` is the shipped
eta_calibration.faded, and the replay's own diagnose is put back after it."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from corral.scheduler.eta_calibration import faded
from corral.sim import replay
from corral.sim.cluster import load_cluster
from corral.sim.metrics import summarize
from corral.sim.replay import SimConfig
from corral.sim.runner import simulate
from corral.sim.synth import SynthSpec, generate

BENCH = Path(__file__).resolve().parents[2] / "bench" / "eta_reestimates.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eta_reestimates", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["eta_reestimates"] = module
    spec.loader.exec_module(module)
    return module


def test_the_variants_of_one_sample() -> None:
    bench = _load()
    waits = bench.shown_waits(60.0, 3000.0, 540.0, 100.0)
    assert waits["roll"] == 60.0 and waits["shipped"] == 3000.0
    assert waits["fade"] == faded(60.0, 3000.0, 540.0) == pytest.approx(60.0 + 0.1 * 2940.0)
    assert waits["until_first"] == 60.0  # waited 540 s, past its first predicted 100 s
    assert bench.shown_waits(60.0, 3000.0, 50.0, 100.0)["until_first"] == 3000.0
    assert bench.shown_waits(60.0, None, 50.0, 100.0) == dict.fromkeys(bench.VARIANTS, 60.0)


@pytest.mark.pure_scheduler  # the bench replaces the replay's diagnose (conftest.py)
def test_sampling_re_estimates_keeps_the_first_estimates_and_restores_the_replay() -> None:
    bench = _load()
    cluster = load_cluster("synth")
    trace = generate(SynthSpec(jobs=500, load=1.3, seed=0), cluster)
    shipped = replay._SimSink.diagnose
    out = bench.one_case("synth", trace, cluster, 600.0, 50)
    assert replay._SimSink.diagnose is shipped
    plain = summarize(simulate(trace, cluster, "default", SimConfig(), {"eta_roll": "backfill"}))
    assert out["first_estimate"] == plain["eta_rel_err_median"]
    assert out["scored"] > 50  # enough re-estimates read and scored to compare
    assert out["shipped"] != out["roll"]  # the calibration did correct them
