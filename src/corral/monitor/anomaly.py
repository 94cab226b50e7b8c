"""Anomaly detection over GPU readings: per-GPU robust baselines, an anomaly score per GPU and a
failure-risk score per node, both in 0..1. Pure: fed `GpuSample`s and a time, no database, no
server; the sampling loop (corral.monitor.risk) and bench/anomaly_eval.py drive the same class.

Design (docs/anomaly.md has the long form). Each GPU keeps a rolling window of its readings. The
window older than the last `recent_s` is the *baseline*; the last `recent_s` is compared to it:

- temperature and power depend on load, so they are scored as *residuals* after the utilisation
  explains what it can: `temp - slope * util`, the slope fitted per GPU by a resistant line
  (medians of the busy and the idle halves of the baseline). The residual's baseline is its
  median and MAD (robust to the spikes that a mean/stddev would chase); the score grows with the
  robust z of the recent median. Temperature also has a *trend*: the residual's slope over the
  recent window (median of pairwise slopes, robust to single outliers); a significant climb is
  projected to the failure point (`temp_limit_c`), and the sooner it would cross, the higher the
  score. This is what gives lead time on a gradual fault: the projection fires while the GPU is
  still cool enough that no threshold rule sees anything.
- correctable ECC errors: their rate in the recent window against the baseline rate (healthy
  GPUs see a few a day at most); any uncorrectable error scores 1.
- Xid events: new events in the window, weighted by whether the code points at hardware
  (79 fell off the bus, 48/63/64/74/92/94/95 memory or NVLink) or may be the application's (13, 31, 43).
- presence: a GPU that stopped answering scores at once, and one that dropped out and came back
  several times in the window (a flapping GPU or node) scores before it goes for good.

Utilisation and memory are load, not health: they have baselines only as the explanatory
variable of the residuals, never a score of their own (a job going busy is not an anomaly).

A GPU's score is its highest signal score; a node's risk combines its two highest GPU scores
(`1 - (1-a)(1-b)`), so two half-suspicious GPUs on one node weigh more than one. A GPU with fewer
than `min_baseline` baseline samples (just started, or after a restart: baselines live in memory)
is scored on the absolute signals only (lost, flapping, ECC, Xid).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from corral.monitor.gpu import GpuSample
from corral.words import plural

# Xid codes that point at the hardware rather than the application (NVIDIA's Xid catalogue).
HARDWARE_XIDS = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120})
MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution * this = its standard deviation
LOAD_BINS = 5  # load levels of 20 utilisation points each
Signal = tuple[float, str]  # (score 0..1, reason)
LOAD_STEP = 15.0  # a move of the smoothed utilisation by this many points is a load change


@dataclass(frozen=True)
class DetectorConfig:
    window_s: float = 3600.0  # readings kept per GPU (baseline + recent)
    recent_s: float = 300.0  # the part compared against the baseline
    min_baseline: int = 12  # baseline readings needed before residuals are scored
    baseline_refresh_s: float = 60.0  # baselines move slowly: refit at most this often
    learn_below: float = 0.3  # readings of a GPU scoring this or more are not learnt as normal
    ecc_window_s: float = 1800.0  # correctable errors are rare: counted over a longer window
    thermal_tau_s: float = 60.0  # temperature follows load with this lag: utilisation is smoothed so
    settle_s: float = 240.0  # after a load change, residuals are not judged for this long
    temp_limit_c: float = 90.0  # where a GPU throttles / the health check fails it
    temp_mad_floor_c: float = 1.0  # a very steady GPU does not make every 1 C look like 10 sigma
    power_mad_floor_w: float = 8.0
    z_low: float = 4.0  # robust z at which a residual starts to score ...
    z_high: float = 10.0  # ... and reaches 1
    trend_s: float = 900.0  # the temperature trend is fitted over this long
    trend_min_rise_sigma: float = 3.0  # the climb over trend_s must exceed this many baseline sigmas
    trend_horizon_s: float = 3600.0  # a projected crossing within this scores (sooner: higher)
    ecc_low: float = 3.0  # correctable errors above the baseline's expectation that start to score
    ecc_high: float = 10.0
    dropouts_high: int = 4  # drop-outs in the window that score 1 (one scores 1/4)
    app_xid_max: float = 0.5  # application Xids (13, 31, 43...) alone never make a GPU risky


@dataclass(frozen=True)
class GpuScore:
    node: str
    index: int
    score: float  # 0..1
    reasons: tuple[str, ...]  # what made the score, worst first ("" entries never)


@dataclass(frozen=True)
class NodeRisk:
    node: str
    risk: float  # 0..1
    gpus: tuple[GpuScore, ...]  # the node's GPUs, worst first

    @property
    def reasons(self) -> list[str]:
        return [f"GPU {g.index}: {r}" for g in self.gpus for r in g.reasons]


@dataclass(frozen=True, slots=True)
class _Reading:
    t: float
    present: bool
    util: float
    util_smooth: float  # utilisation smoothed with the thermal lag: what the temperature follows
    settled: bool  # no load change for settle_s: the temperature has caught up with the load
    load_bin: int  # _load_bin(util_smooth)
    temp: float
    power: float
    ecc_corrected: int
    ecc_uncorrected: int
    xids: int
    last_xid: int | None


@dataclass(frozen=True)
class _LoadLevel:
    """What a GPU reads at one load level when nothing is wrong: median and robust sigma."""

    temp: float
    temp_sigma: float
    power: float
    power_sigma: float


@dataclass
class _Baseline:
    fitted_at: float
    levels: dict[int, _LoadLevel]  # load bin (see _load_bin) -> its baseline
    ecc_rate: float  # correctable errors per second

    def level(self, r: _Reading) -> _LoadLevel | None:
        return self.levels.get(r.load_bin)


@dataclass
class _GpuState:
    readings: list[_Reading] = field(default_factory=list)  # oldest first, within window_s
    times: list[float] = field(default_factory=list)  # their times, for bisecting
    dropouts: deque[float] = field(default_factory=deque)  # when it went from present to absent
    util_smooth: float | None = None
    residual_score: float = 0.0  # the temperature/power signals' last score (gates learning)
    load_anchor: float = 0.0  # smoothed utilisation at the last load change
    load_changed_at: float = float("-inf")
    baseline: _Baseline | None = None
    score: GpuScore | None = None


class AnomalyDetector:
    """Feed it each sampling pass with `observe`; read `gpu_scores` / `node_risks`."""

    def __init__(self, config: DetectorConfig | None = None) -> None:
        self.config = config or DetectorConfig()
        self._gpus: dict[tuple[str, int], _GpuState] = {}

    def observe(self, samples: Iterable[GpuSample], now: float) -> None:
        """One sampling pass. GPUs absent from `samples` keep their last score; `forget` drops them."""
        for s in samples:
            state = self._gpus.setdefault((s.node, s.index), _GpuState())
            reading = self._reading(state, s, now)
            if state.readings and state.readings[-1].present and not reading.present:
                state.dropouts.append(now)
            state.readings.append(reading)
            state.times.append(now)
            start = now - self.config.window_s
            cut = bisect.bisect_left(state.times, start)
            if cut:
                del state.readings[:cut], state.times[:cut]
            while state.dropouts and state.dropouts[0] < start:
                state.dropouts.popleft()
            state.score = self._score(s.node, s.index, state, now)

    def forget(self, keep: Iterable[tuple[str, int]]) -> None:
        """Drop the state of GPUs not in `keep` (removed nodes)."""
        wanted = set(keep)
        for key in [k for k in self._gpus if k not in wanted]:
            del self._gpus[key]

    def gpu_scores(self) -> list[GpuScore]:
        return sorted(
            (st.score for st in self._gpus.values() if st.score is not None), key=lambda g: (g.node, g.index)
        )

    def node_risks(self) -> list[NodeRisk]:
        """Every node seen, highest risk first."""
        by_node: dict[str, list[GpuScore]] = {}
        for score in self.gpu_scores():
            by_node.setdefault(score.node, []).append(score)
        risks = [node_risk(node, scores) for node, scores in by_node.items()]
        return sorted(risks, key=lambda r: (-r.risk, r.node))

    # ------------------------------------------------------------------ scoring

    def _reading(self, state: _GpuState, s: GpuSample, now: float) -> _Reading:
        util = s.utilization_percent
        last = state.readings[-1] if state.readings else None
        if last is None or state.util_smooth is None:
            smooth = util
        else:  # first-order lag, exact for any sampling interval
            alpha = 1.0 - math.exp(-max(0.0, now - last.t) / self.config.thermal_tau_s)
            smooth = state.util_smooth + alpha * (util - state.util_smooth)
        state.util_smooth = smooth
        if abs(smooth - state.load_anchor) > LOAD_STEP:
            state.load_anchor, state.load_changed_at = smooth, now
        settled = now - state.load_changed_at >= self.config.settle_s
        return _Reading(
            t=now, present=s.present, util=util, util_smooth=smooth, settled=settled,
            load_bin=_load_bin(smooth), temp=s.temperature_c, power=s.power_w,
            ecc_corrected=s.ecc_aggregate_corrected, ecc_uncorrected=s.ecc_volatile_uncorrected,
            xids=s.xid_events_total, last_xid=s.last_xid,
        )  # fmt: skip

    def _score(self, node: str, index: int, state: _GpuState, now: float) -> GpuScore:
        cfg = self.config
        readings = state.readings
        recent = _since(state, now - cfg.recent_s)
        # Refit the baseline now and then, and never while the temperature or power looks
        # anomalous: learning a fault as the new normal would hide a slow ramp from its baseline.
        # (Only those signals gate it: a drop-out or an Xid says nothing about thermal normality.)
        if state.residual_score < cfg.learn_below and (
            state.baseline is None or now - state.baseline.fitted_at >= cfg.baseline_refresh_s
        ):
            base = [r for r in readings if r.t < now - cfg.recent_s and r.present]
            if len(base) >= cfg.min_baseline:
                state.baseline = fit_baseline(base, now, cfg)
        signals = [
            _presence_signal(readings, len(state.dropouts), cfg),
            _ecc_signal(_since(state, now - cfg.ecc_window_s), state.baseline, cfg),
            _xid_signal(readings, cfg),
        ]
        if state.baseline is not None:
            trend = [r for r in _since(state, now - cfg.trend_s) if r.present]
            residual = _residual_signals([r for r in recent if r.present], trend, state.baseline, cfg)
            state.residual_score = max((s for s, _ in residual), default=0.0)
            signals += residual
        found = sorted((s for s in signals if s[0] > 0), key=lambda s: -s[0])
        score = found[0][0] if found else 0.0
        return GpuScore(node, index, round(score, 4), tuple(reason for _, reason in found))


def _since(state: _GpuState, start: float) -> list[_Reading]:
    """The readings at or after `start`."""
    return state.readings[bisect.bisect_left(state.times, start) :]


def node_risk(node: str, scores: Sequence[GpuScore]) -> NodeRisk:
    ordered = tuple(sorted(scores, key=lambda g: (-g.score, g.index)))
    top = [g.score for g in ordered[:2]] + [0.0, 0.0]
    return NodeRisk(node, round(1.0 - (1.0 - top[0]) * (1.0 - top[1]), 4), ordered)


# ---------------------------------------------------------------- baselines (pure functions)


def robust_center(values: Sequence[float], floor: float) -> tuple[float, float]:
    """(median, sigma estimated from the MAD, at least `floor`)."""
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return med, max(floor, MAD_TO_SIGMA * mad)


def pairwise_slope(ts: Sequence[float], ys: Sequence[float]) -> float:
    """Median of the slopes between each point and the one half a window later: a cheap
    Theil-Sen estimate that a few outliers do not move."""
    n = len(ts)
    half = n // 2
    if half < 2:
        return 0.0
    slopes = [
        (ys[i + half] - ys[i]) / (ts[i + half] - ts[i]) for i in range(n - half) if ts[i + half] > ts[i]
    ]
    return statistics.median(slopes) if slopes else 0.0


def _load_bin(util: float) -> int:
    return min(LOAD_BINS - 1, max(0, int(util * LOAD_BINS / 100.0)))


def fit_baseline(base: Sequence[_Reading], now: float, cfg: DetectorConfig) -> _Baseline:
    """Per load level, the median and MAD of the settled readings; levels with too few readings
    are left out (a load the GPU has not shown yet is not judged)."""
    by_bin: dict[int, list[_Reading]] = {}
    for r in base:
        if r.settled:
            by_bin.setdefault(r.load_bin, []).append(r)
    levels = {}
    for key, rows in by_bin.items():
        if len(rows) >= cfg.min_baseline:
            temp, temp_sigma = robust_center([r.temp for r in rows], cfg.temp_mad_floor_c)
            power, power_sigma = robust_center([r.power for r in rows], cfg.power_mad_floor_w)
            levels[key] = _LoadLevel(temp, temp_sigma, power, power_sigma)
    span = base[-1].t - base[0].t
    errors = max(0, base[-1].ecc_corrected - base[0].ecc_corrected)
    return _Baseline(fitted_at=now, levels=levels, ecc_rate=errors / span if span > 0 else 0.0)


# ---------------------------------------------------------------- signals: (score 0..1, reason)


def _ramp(value: float, low: float, high: float) -> float:
    return min(1.0, max(0.0, (value - low) / (high - low)))


def _residual_signals(
    recent: Sequence[_Reading], trend_window: Sequence[_Reading], b: _Baseline, cfg: DetectorConfig
) -> list[Signal]:
    """Temperature level and trend, power level, each against the baseline of the load level."""
    if len(recent) < 3 or not recent[-1].settled:
        return []  # the load just changed: the temperature is still catching up
    known = [(r, lv) for r in recent if r.settled and (lv := b.level(r)) is not None]
    if len(known) < 3 or known[-1][0] is not recent[-1]:
        return []  # a load level the baseline has not seen yet: nothing to compare with
    temps = [(r.temp - lv.temp) / lv.temp_sigma for r, lv in known]  # in sigmas of its level
    z_temp = statistics.median(temps[-3:])  # three readings: one noisy sample is not a shift
    out = [(_ramp(z_temp, cfg.z_low, cfg.z_high), f"temperature {z_temp:+.1f} sigma above its load baseline")]
    last, level = known[-1]
    trend = [(r, lv) for r in trend_window if r.settled and (lv := b.level(r)) is not None]
    slope = pairwise_slope([r.t for r, _ in trend], [r.temp - lv.temp for r, lv in trend])  # C/s
    rise = slope * (trend[-1][0].t - trend[0][0].t)
    if slope > 0 and rise >= cfg.trend_min_rise_sigma * level.temp_sigma:
        # Headroom at full load: an idle GPU that heats up fails the first job that makes it busy.
        hottest = max(lv.temp for lv in b.levels.values())
        eta = max(0.0, cfg.temp_limit_c - (last.temp - level.temp + hottest)) / slope
        score = _ramp(cfg.trend_horizon_s - eta, 0.0, cfg.trend_horizon_s * 0.5)
        climb = f"temperature climbing {slope * 60:.2f} C/min"
        out.append((score, f"{climb}, {cfg.temp_limit_c:g} C at full load in ~{eta / 60:.0f} min"))
    z_power = statistics.median((r.power - lv.power) / lv.power_sigma for r, lv in known[-3:])
    power = f"power {z_power:+.1f} sigma off its load baseline"
    out.append((_ramp(abs(z_power), cfg.z_low, cfg.z_high), power))
    return out


def _ecc_signal(recent: Sequence[_Reading], b: _Baseline | None, cfg: DetectorConfig) -> tuple[float, str]:
    if not recent:
        return 0.0, ""
    if recent[-1].ecc_uncorrected > 0:
        return 1.0, plural(recent[-1].ecc_uncorrected, "uncorrectable ECC error")
    new = max(0, recent[-1].ecc_corrected - recent[0].ecc_corrected)
    expected = (b.ecc_rate if b is not None else 0.0) * (recent[-1].t - recent[0].t)
    excess = new - expected
    reason = f"{new} correctable ECC errors in the last {_span(recent)}"
    return _ramp(excess, cfg.ecc_low, cfg.ecc_high), reason


def _xid_signal(readings: Sequence[_Reading], cfg: DetectorConfig) -> tuple[float, str]:
    if len(readings) < 2:
        return 0.0, ""
    new = readings[-1].xids - readings[0].xids
    if new <= 0:
        return 0.0, ""
    code = readings[-1].last_xid
    # 13/31/43 and friends are often the application's own fault: they weigh less, and alone
    # they never reach the alarm threshold.
    score = min(1.0, new) if code in HARDWARE_XIDS else min(cfg.app_xid_max, 0.2 * new)
    return score, f"{plural(new, 'Xid event')} in the last {_span(readings)}, last Xid {code}"


def _presence_signal(readings: Sequence[_Reading], dropouts: int, cfg: DetectorConfig) -> tuple[float, str]:
    """A GPU out for two readings in a row is lost; one missed read is half that. Drop-outs that
    came back count too: a flapping GPU or node scores before it goes for good."""
    flapping = min(1.0, dropouts / cfg.dropouts_high)
    if readings and not readings[-1].present:
        lost = len(readings) >= 2 and not readings[-2].present
        return max(flapping, 1.0 if lost else 0.5), "GPU not answering"
    return flapping, f"dropped out {plural(dropouts, 'time')} in the last {_span(readings)}"


def _span(readings: Sequence[_Reading]) -> str:
    return f"{(readings[-1].t - readings[0].t) / 60:.0f} min"
