"""The Gittins-index size order (gittins.py, Profile.size_key = "gittins")."""

from __future__ import annotations

import dataclasses
import math

import pytest

from corral.scheduler import ANY_MODEL, PROFILES
from corral.scheduler.admission import size_class
from corral.scheduler.gittins import gittins_class, gittins_size_s, unit_index
from corral.scheduler.types import Job
from tests.scheduler.builders import gpu_node, group, job, plan_for, snap

DEFAULT = PROFILES["default"]
GITTINS = dataclasses.replace(DEFAULT, size_key="gittins")


def estimated(
    job_id: str,
    median: float,
    spread: tuple[float, float] | None,
    gpus: int = 1,
    submit: float = 0.0,
    attained: float = 0.0,
) -> Job:
    """A job whose runtime estimate is `median` with the quartiles `spread` (runtimes.py)."""
    made = job(job_id, gpus=gpus, submit=submit, runtime=median, attained=attained)
    return dataclasses.replace(made, runtime_spread=spread)


def test_a_certain_runtime_has_the_index_one_over_its_runtime() -> None:
    assert unit_index(0.01, 0.0) == pytest.approx(1.0, rel=0.01)
    # nearly done: after 90% of a near-certain runtime, the rest is a tenth of it
    assert unit_index(0.01, 0.9) == pytest.approx(10.0, rel=0.02)


def test_a_larger_median_at_an_equal_spread_ranks_later() -> None:
    sizes = [gittins_size_s(estimated("j", m, (m / 2, m * 2)), 3600.0) for m in (60.0, 600.0, 6000.0)]
    assert sizes[0] < sizes[1] < sizes[2]
    assert sizes[1] == pytest.approx(10 * sizes[0])  # scale-free: the index is 1 / the median
    classes = [gittins_class(estimated("j", m, (m / 2, m * 2)), 3600.0) for m in (60.0, 600.0, 6000.0)]
    assert classes[0] < classes[1] < classes[2]


def test_a_wide_spread_at_an_equal_median_ranks_earlier_for_a_new_job() -> None:
    """Past a log-spread of about 1.3 the chance that the job is short outweighs its long mean; up
    to there the index is about 1 / the mean, which grows with the spread (measured and stated
    in docs/simulator.md), so the property holds for wide spreads only."""
    sigmas = (1.6, 2.0, 2.5, 3.0, 4.0)
    indices = [unit_index(s, 0.0) for s in sigmas]
    assert indices == sorted(indices) and len(set(indices)) == len(indices)
    # from quartiles: 1 h median, quartiles a factor 4 and a factor 40 either way (sigma 2.1, 5.5)
    narrow = gittins_size_s(estimated("n", 3600.0, (900.0, 14400.0)), 3600.0)
    wide = gittins_size_s(estimated("w", 3600.0, (90.0, 144000.0)), 3600.0)
    assert wide < narrow


def test_service_attained_without_finishing_ranks_a_heavy_tailed_job_later() -> None:
    spread = (900.0, 14400.0)
    fresh = gittins_size_s(estimated("f", 3600.0, spread), 3600.0)
    ran = gittins_size_s(estimated("r", 3600.0, spread, attained=4 * 3600.0), 3600.0)
    assert ran > 2 * fresh
    # without a spread the estimate is taken as the remaining work: attained service is not read
    assert gittins_size_s(estimated("r", 3600.0, None, attained=4 * 3600.0), 3600.0) == gittins_size_s(
        estimated("f", 3600.0, None), 3600.0
    )


def test_the_index_is_per_gpu() -> None:
    one = gittins_size_s(estimated("a", 3600.0, (900.0, 14400.0)), 3600.0)
    four = gittins_size_s(estimated("b", 3600.0, (900.0, 14400.0), gpus=4), 3600.0)
    assert four == pytest.approx(4 * one)
    # GPU-time, as in size_class: a job without an estimate counts as default_runtime_s
    unknown = gittins_size_s(job("u", runtime=None), 7200.0)
    assert unknown == gittins_size_s(estimated("k", 7200.0, None), 7200.0)
    assert math.isfinite(unknown)


def test_the_knob_orders_a_user_jobs_by_the_gittins_class() -> None:
    """A 10-minute job with a narrow history against a 25-minute median whose runs spread from
    1 minute to 5 hours: by median the first goes first, by Gittins index the second (likely short)."""
    steady = estimated("steady", 600.0, (500.0, 700.0), submit=10)
    erratic = estimated("erratic", 1500.0, (60.0, 18000.0), submit=0)
    assert size_class(steady, 3600.0) < size_class(erratic, 3600.0)
    assert gittins_class(erratic, 3600.0) < gittins_class(steady, 3600.0)
    s = snap([gpu_node("n", gpus=1)], [erratic, steady], [group("g", guaranteed={ANY_MODEL: 1})])
    assert [a.job_id for a in plan_for(s, DEFAULT, now=100).assignments] == ["steady"]
    assert [a.job_id for a in plan_for(s, GITTINS, now=100).assignments] == ["erratic"]


def test_the_size_key_knob_parses_and_is_checked() -> None:
    from corral.sim.runner import PolicyError, parse_knobs

    assert parse_knobs(["size_key=gittins"]) == {"size_key": "gittins"}
    with pytest.raises(PolicyError, match="size_key is one of median, gittins"):
        parse_knobs(["size_key=mean"])
    with pytest.raises(ValueError, match="unknown size_key"):
        dataclasses.replace(DEFAULT, size_key="mean")
    assert DEFAULT.size_key == "median"
