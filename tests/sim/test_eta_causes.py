"""bench/eta_causes.py, the ETA error's diagnostic: its oracle modes change only what the ETA roll
reads (the schedule stays the same), and the library's functions are put back after each replay."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import corral.scheduler.diagnosis as diagnosis
from corral.scheduler import eta
from corral.sim.cluster import load_cluster
from corral.sim.synth import SynthSpec, generate

BENCH = Path(__file__).resolve().parents[2] / "bench" / "eta_causes.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("eta_causes", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["eta_causes"] = module
    spec.loader.exec_module(module)
    return module


def test_oracle_modes_keep_the_schedule_and_restore_the_library() -> None:
    causes = _load()
    cluster = load_cluster("synth")
    trace = generate(SynthSpec(jobs=500, load=1.3, seed=0), cluster)
    out = causes.one_case("synth", trace, cluster, ("none", "both", "rq0.3+sig1.5"))
    assert out["none"]["jobs"] > 10  # enough jobs waited > 5 min to compare
    for mode in ("both", "rq0.3+sig1.5"):
        assert out[mode]["same_schedule"], mode
        assert out[mode]["jobs"] == out["none"]["jobs"]
    assert out["both"]["rel"] != out["none"]["rel"]  # the oracle did reach the roll
    assert diagnosis.running_events is eta.running_events
    assert diagnosis.backfill_starts is eta.backfill_starts
    assert eta._sigma is causes._plain_sigma  # the shipped spread again
