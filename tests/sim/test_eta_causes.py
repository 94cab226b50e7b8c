"""bench/eta_causes.py, the ETA error's diagnostic: its oracle modes change only what the ETA roll
reads (the schedule stays the same), and the library's functions are put back after each replay."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

import corral.scheduler.diagnosis as diagnosis
from corral.scheduler import eta, runtimes
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


@pytest.mark.pure_scheduler  # the bench replaces scheduler functions (conftest.py)
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


@pytest.mark.pure_scheduler  # the bench replaces scheduler functions (conftest.py)
def test_basis_modes_change_only_user_size_estimates_and_restore_the_chain() -> None:
    """`usfX` widens only the user+size level's spread (the median, so the schedule, kept) and
    `uempN` reads that level's runs for running jobs: both reach the roll on a trace whose new
    job names fall back to the user+size level, and runtimes.estimate_from is put back."""
    causes = _load()
    cluster = load_cluster("synth")
    trace = generate(SynthSpec(jobs=500, load=1.3, seed=0), cluster)
    floor = causes._user_size_floor(1.2)
    agreeing = [("user_size", [600.0, 610.0, 620.0])]
    widened = floor(agreeing, None)
    assert widened.seconds == 610.0 and widened.basis == "user_size"
    assert widened.low_s < 400.0 and widened.high_s > 900.0  # log-spread 1.2: x/÷ 2.25 around 610
    assert floor([("name", [600.0, 610.0, 620.0])], None).low_s == 605.0  # other levels as shipped
    assert floor(agreeing, 700.0).high_s == 700.0  # still capped by the job's limit
    out = causes.one_case("synth", trace, cluster, ("none", "usf3", "uemp1"))
    for mode in ("usf3", "uemp1"):
        assert out[mode]["same_schedule"], mode
        assert out[mode]["jobs"] == out["none"]["jobs"]
    assert out["usf3"]["rel"] != out["none"]["rel"]  # the widened spreads did reach the roll
    assert out["uemp1"]["rel"] != out["none"]["rel"]
    assert runtimes.estimate_from is causes._plain_estimate_from
    assert diagnosis.running_events is eta.running_events


@pytest.mark.pure_scheduler  # the bench replaces scheduler functions (conftest.py)
def test_calibration_scored_offline_matches_the_shipped_calibration_in_the_replay() -> None:
    """`--calibrate` scores a calibration on the `nocal` rows without replaying; its shipped
    variant (size2:loglin1:500:300) gives the figure the calibrated replay (`none`) records, on
    the same schedule."""
    causes = _load()
    cluster = load_cluster("synth")
    trace = generate(SynthSpec(jobs=500, load=1.3, seed=0), cluster)
    out = causes.one_case(
        "synth", trace, cluster, ("nocal", "none"), ("size2:loglin1:500:300", "cluster:median:500:300")
    )
    assert out["none"]["same_schedule"]
    shipped = out["cal:size2:loglin1:500:300"]
    assert shipped["rel"] == out["none"]["rel"] and shipped["jobs"] == out["none"]["jobs"]
    assert shipped["rel"] != out["nocal"]["rel"]  # the calibration changed what was shown
    assert out["cal:cluster:median:500:300"]["rel"] != shipped["rel"]
    with pytest.raises(SystemExit, match="want KEY:STAT:WINDOW:A"):
        causes.parse_variant("size2:mode:500:300")


@pytest.mark.pure_scheduler  # the bench replaces scheduler functions (conftest.py)
def test_tail_modes_set_the_tail_rule_for_their_replay_and_restore_the_library() -> None:
    """`tailP:K` sets eta.remaining_s's tail rule (past its kind's P quantile, at least K x what a
    running job ran), `notail` turns it off; the replay keeps its schedule and the shipped rule
    is put back."""
    causes = _load()
    shipped = (eta.TAIL_SURVIVE, eta.TAIL_FACTOR)
    assert causes._tail_rule("tail0.9:1") == (pytest.approx(0.1), 1.0)
    assert causes._tail_rule("notail") == (eta.TAIL_SURVIVE, 0.0)
    assert causes._tail_rule("none") is None
    with pytest.raises(SystemExit, match="tailP:K"):
        causes._tail_rule("tail0.9")
    cluster = load_cluster("synth")
    trace = generate(SynthSpec(jobs=500, load=1.3, seed=0), cluster)
    out = causes.one_case("synth", trace, cluster, ("notail", "tail0.9:1"))
    assert out["tail0.9:1"]["same_schedule"]
    assert out["tail0.9:1"]["jobs"] == out["notail"]["jobs"]
    assert out["tail0.9:1"]["rel"] != out["notail"]["rel"]  # the rule did reach the roll
    assert shipped == (eta.TAIL_SURVIVE, eta.TAIL_FACTOR)
