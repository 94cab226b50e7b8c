"""The estimated-start calibration by past outcomes (corral.scheduler.eta_calibration), worked out
by hand: with A = ADDITIVE_S = 300 s, outcomes whose actual + A is k x (predicted + A) give the
line log(actual + A) = log k + log(predicted + A), so a new prediction p is shown k (p + A) - A."""

from __future__ import annotations

import pytest

from corral.scheduler.eta_calibration import ADDITIVE_S, EtaCalibration, faded, size_class

A = ADDITIVE_S


def test_size_classes_are_gpus_rounded_up_to_a_power_of_two_and_cpu_jobs_their_own() -> None:
    assert [size_class(g) for g in (0, 1, 2, 3, 4, 5, 8, 9, 64)] == [0, 1, 2, 4, 4, 8, 8, 16, 64]


def test_too_little_history_leaves_the_estimate_as_the_roll_gave_it() -> None:
    cal = EtaCalibration(min_outcomes=3)
    assert cal.corrected_wait(1, 600.0) is None
    cal.record(1, 600.0, 2100.0)
    cal.record(1, 600.0, 2100.0)
    assert cal.corrected_start(1000.0, 1, 1600.0) == 1600.0  # 2 outcomes < 3: unchanged


def test_jobs_that_started_three_times_later_than_told_make_the_next_estimate_later() -> None:
    cal = EtaCalibration(min_outcomes=3)
    for predicted in (100.0, 900.0, 3300.0):  # actual + A = 3 (predicted + A) each time
        cal.record(4, predicted, 3 * (predicted + A) - A)
    assert cal.outcomes() == 3
    # the line's slope is 1 (every ratio the same): a plain factor of 3 on (p + A)
    assert cal.corrected_wait(4, 1700.0) == pytest.approx(3 * (1700.0 + A) - A)
    assert cal.corrected_start(10_000.0, 3, 11_700.0) == pytest.approx(10_000.0 + 5700.0)  # class 4 too


def test_a_class_without_enough_outcomes_falls_back_to_the_cluster() -> None:
    cal = EtaCalibration(min_outcomes=3)
    for predicted in (100.0, 900.0, 3300.0):
        cal.record(8, predicted, 2 * (predicted + A) - A)  # 8-GPU jobs: twice as long as told
    # a 1-GPU job: no 1-GPU outcomes, the cluster's fit (the 8-GPU ones) is used
    assert cal.corrected_wait(1, 700.0) == pytest.approx(2 * (700.0 + A) - A)
    for predicted in (100.0, 900.0, 3300.0):
        cal.record(1, predicted, predicted)  # 1-GPU jobs: started when told
    assert cal.corrected_wait(1, 700.0) == pytest.approx(700.0)  # its own class now
    assert cal.corrected_wait(8, 700.0) == pytest.approx(2 * (700.0 + A) - A)


def test_the_slope_is_held_at_most_one_and_at_least_zero() -> None:
    """Waits that were the same however long the prediction (slope 0): every new prediction is
    shown that wait. Waits growing faster than predicted (slope > 1) are not extrapolated: slope 1,
    the mean log-ratio."""
    flat = EtaCalibration(min_outcomes=3)
    for predicted in (0.0, 1000.0, 10_000.0):
        flat.record(1, predicted, 2000.0)
    assert flat.corrected_wait(1, 50_000.0) == pytest.approx(2000.0)
    steep = EtaCalibration(min_outcomes=2)
    steep.record(1, 0.0, 0.0)  # x = log 300, y = log 300
    steep.record(1, 2700.0, 89_700.0)  # x = log 3000, y = log 90_000: slope 1 + log 30 / log 10
    # slope held at 1: the mean of log ratios, log(sqrt(30)), a factor of sqrt(30) on (p + A)
    assert steep.corrected_wait(1, 0.0) == pytest.approx(30**0.5 * A - A)
    down = EtaCalibration(min_outcomes=2)
    down.record(1, 0.0, 2700.0)
    down.record(1, 2700.0, 0.0)  # a negative slope: held at 0, the mean log of actual + A
    assert down.corrected_wait(1, 99_999.0) == pytest.approx((300.0 * 3000.0) ** 0.5 - A)


def test_the_window_keeps_only_the_latest_outcomes() -> None:
    cal = EtaCalibration(window=3, min_outcomes=3)
    for _ in range(3):
        cal.record(1, 600.0, 10 * (600.0 + A) - A)
    for _ in range(3):
        cal.record(1, 600.0, 600.0)  # the platform caught up: the old ones are out of the window
    assert cal.outcomes() == 3
    assert cal.corrected_wait(1, 600.0) == pytest.approx(600.0)


def test_a_negative_wait_counts_as_none_and_a_corrected_wait_is_never_negative() -> None:
    cal = EtaCalibration(min_outcomes=3)
    for _ in range(3):
        cal.record(1, 600.0, -50.0)  # started before it was shown (clocks): waited 0
    assert cal.corrected_wait(1, 600.0) == pytest.approx(0.0)
    assert cal.corrected_wait(1, -10.0) == pytest.approx(0.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 0}, "need 1 <= min_outcomes <= window, got window=0"),
        ({"window": 10, "min_outcomes": 11}, "got window=10, min_outcomes=11"),
        ({"additive_s": 0.0}, "additive_s must be > 0 seconds, got 0.0"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EtaCalibration(**kwargs)  # type: ignore[arg-type]


def test_fits_taken_once_correct_as_the_calibration_does() -> None:
    cal = EtaCalibration(min_outcomes=3)
    assert not cal.fits().corrects() and cal.fits().corrected_wait(4, 600.0) is None
    for predicted, actual in ((60.0, 600.0), (600.0, 3000.0), (1200.0, 9000.0)):
        cal.record(4, predicted, actual)
    cal.record(1, 60.0, 60.0)  # class 1 below min_outcomes: the cluster's line
    fits = cal.fits()
    assert fits.corrects()
    for gpus in (1, 4, 8):
        for predicted in (0.0, 30.0, 5000.0):
            assert fits.corrected_wait(gpus, predicted) == cal.corrected_wait(gpus, predicted)
    cal.record(4, 60.0, 60_000.0)  # taken before: unchanged by later outcomes
    assert fits.corrected_wait(4, 600.0) != cal.corrected_wait(4, 600.0)


def test_a_re_estimate_is_corrected_less_as_the_job_waits() -> None:
    cal = EtaCalibration(min_outcomes=3)
    for predicted, actual in ((60.0, 3000.0), (600.0, 6000.0), (1200.0, 9000.0)):
        cal.record(4, predicted, actual)
    fits = cal.fits()
    fitted = cal.corrected_wait(4, 60.0)
    assert fitted is not None and fitted > 1000.0
    assert fits.corrected_wait(4, 60.0, elapsed_s=0.0) == fitted  # the first estimate: in full
    # weight predicted / (elapsed + predicted): 60 s ahead after 540 s waited -> a tenth of the fit
    assert fits.corrected_wait(4, 60.0, elapsed_s=540.0) == pytest.approx(60.0 + 0.1 * (fitted - 60.0))
    # a job near its start after a long wait: close to the roll's own, not the fit's long wait
    late = fits.corrected_wait(4, 60.0, elapsed_s=36_000.0)
    assert late is not None and late < 70.0
    assert faded(60.0, fitted, 0.0) == fitted and faded(0.0, fitted, 10.0) == 0.0
