"""Where the estimated-start error comes from (a diagnostic, never the shipped path): the default
policy's replay (no true durations for the policy) with only the ETA roll's inputs changed.

Modes (`--modes`, comma-separated; parts joined by `+`):
- `none`: the shipped estimator;
- `running`: running jobs end at their true end (cause a: their remaining times);
- `waiting`: waiting jobs hold their true remaining work (cause b: the runtimes of the jobs ahead);
- `both`: both; what is left is the order changing after submit (c: later arrivals that pass, fair
  share, preemption) and what the timelines leave out (d: nodes, quotas);
- variants of the shipped estimator: `rqX` running jobs' remaining time at quantile X (shipped:
  0.5), `wqX` waiting jobs held for the X quantile of their log-normal, `rmean` / `wmean` the
  log-normal's (conditional) mean instead of its median, `sigX` every log-spread times X, `sigwX`
  the log-spread measured from the quartiles times X (the floor SIGMA_MIN kept);
- `nocal`: the roll's own ETA, without the calibration by past outcomes (scheduler/
  eta_calibration.py; `none` has it, as shipped);
- variants that depend on the estimate's basis (runtimes.LEVELS: which level of the chain it came
  from): `usfX` the user+size estimates' log-spread at least X (their range widened around the
  median; the other levels as shipped), `uempN` a running user+size job's remaining time at least
  what that level's own runs say (the median of run - elapsed over the runs longer than it has run,
  when N or more are), else as shipped;
- the remaining time of running jobs far past their kind's runtimes (eta.remaining_s's tail rule,
  round 4): `tailP:K` past the P quantile of its kind's log-normal a running job's remaining time
  is at least K x what it has run (at an estimate's range ends, quantile q: K x elapsed x q /
  (1 - q)); shipped: `tail0.99:0.5`; `notail` the log-normal alone, as before round 4.

`--calibrate KEY:STAT:WINDOW:A,...` scores calibrations by the replay's own record offline, on the
rows of the `nocal` mode (which must be run): each job's shown wait is the roll's, corrected from
the outcomes (predicted wait, actual wait) of the jobs shown an ETA that started before it was
submitted, the last WINDOW per KEY (`cluster`; `group`, `gsize` group and size 1/2-4/5-8/9+,
`size2` GPUs rounded up to a power of two, `pred` the predicted wait's class, each falling back to
the cluster below 30 outcomes) with A seconds added to both waits; STAT: `median` (of the ratios
(actual + A) / (predicted + A)), `best` (the window's own best multiplier for the median relative
error, waits > 5 min), `loglin` (least-squares line of log(actual + A) on log(predicted + A)),
`loglin1` (its slope held in [0, 1]: the shipped one is `size2:loglin1:500:300`).

`--knob NAME=VALUE` changes the policy (a what-if: e.g. `max_preemption_attempts=0`, no
preemptions). Within one case the policy's own estimates are untouched, so every mode replays the
same schedule: checked (`same_schedule`, every job's first start equal). For the jobs that waited
> 5 min it prints the median relative error (`rel`, the issue's figure), the share shown too early
(started later than told), and the median error of the jobs that no later-submitted job passed vs
those passed by one. `ETA_DUMP=DIR` writes each run's per-job rows (id, submit, ETA, first start,
GPUs, instances, group, user, model, duration, passers) as JSON for further analysis.

    CORRAL_PURE_PYTHON=1 .venv/bin/python bench/eta_causes.py [--jobs 20000] [--seeds 0,1,2,3,4]
        [--synth-jobs 3000] [--modes none,running,waiting,both] [--knob NAME=VALUE]
        [--calibrate KEY:STAT:WINDOW:A,...]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

import corral.scheduler.diagnosis as diagnosis
from corral.scheduler import eta, eta_calibration, runtimes
from corral.scheduler.compiled_build import is_compiled
from corral.sim.cluster import ClusterSpec, load_cluster
from corral.sim.metrics import ETA_MIN_WAIT_S
from corral.sim.replay import SimConfig, SimResult, Simulator
from corral.sim.runner import parse_knobs, resolve_policy
from corral.sim.synth import SynthSpec, generate
from corral.sim.trace import Trace, first_jobs, load_trace

MODES = ("none", "running", "waiting", "both")
DUMP = __import__("os").environ.get("ETA_DUMP", "")
_state: dict[str, Any] = {"sim": None, "mode": "none", "policy": "default"}


def _knob(prefix: str) -> float | None:
    for part in _state["mode"].split("+"):
        if part.startswith(prefix) and part[len(prefix) :][:1].isdigit():
            return float(part[len(prefix) :])
    return None


def _mean_remaining(estimate: float, spread: tuple[float, float], elapsed: float) -> float:
    """E[D - elapsed | D > elapsed] for the log-normal remaining_s fits."""
    mu, sigma = math.log(estimate), eta._sigma(spread)
    nd = eta._NORMAL
    if elapsed <= 0:
        return math.exp(mu + sigma * sigma / 2)
    z = (math.log(elapsed) - mu) / sigma
    survive = 1 - nd.cdf(z)
    if survive <= 1e-12:
        return elapsed
    return max(0.0, math.exp(mu + sigma * sigma / 2) * nd.cdf(sigma - z) / survive - elapsed)


_plain_estimate_from = runtimes.estimate_from


def _user_size_floor(floor: float):  # type: ignore[no-untyped-def]
    """estimate_from with the user+size level's log-spread at least `floor` (the median kept, so
    the policy's estimates and the schedule are unchanged)."""
    half = eta.IQR_Z / 2

    def estimate_from(levels, limit):  # type: ignore[no-untyped-def]
        found = _plain_estimate_from(levels, limit)
        if found is None or found.basis != "user_size" or found.seconds <= 0:
            return found
        measured = _iqr_sigma((found.low_s, found.high_s))
        if measured >= floor:
            return found
        low, high = found.seconds * math.exp(-half * floor), found.seconds * math.exp(half * floor)
        if limit is not None:
            low, high = min(low, limit), min(high, limit)
        return runtimes.RuntimeEstimate(found.seconds, low, high, found.basis, found.runs)

    return estimate_from


def _user_size_runs(job_id: str) -> Sequence[float] | None:
    """The runs of the level a running job's estimate came from now, if that is user+size."""
    sim = _state["sim"]
    tj = sim.jobs[job_id].trace
    chain = sim.history._chain
    for key in chain.keys(tj.user, tj.name, tj.num_gpus, tj.group):
        runs = chain._runs.get(key)
        if runs is not None and len(runs) >= runtimes.MIN_RUNS[key[0]]:
            return runs if key[0] == "user_size" else None
    return None


def _empirical_events(now, running, started, gone_by, default_runtime_s, q, at_least):  # type: ignore[no-untyped-def]
    out = eta.running_events(now, running, started, gone_by, default_runtime_s, q)
    for i, (rj, per_model) in enumerate(running):
        job = rj.job
        if (gone_by and job.id in gone_by) or job.runtime_estimate is None or job.runtime_spread is None:
            continue
        runs = _user_size_runs(job.id)
        if runs is None:
            continue
        elapsed = now - rj.start_time
        longer = sorted(r - elapsed for r in runs if r > elapsed)
        if len(longer) >= at_least:
            out[i] = (max(out[i][0], now + float(np.quantile(longer, q))), per_model)
    return out


_plain_tail = (eta.TAIL_SURVIVE, eta.TAIL_FACTOR)


def _tail_rule(mode: str) -> tuple[float, float] | None:
    """The mode's (eta.TAIL_SURVIVE, eta.TAIL_FACTOR): `tailP:K` (1 - P, K), `notail` the
    log-normal alone (factor 0: before round 4); None: as shipped."""
    rule = None
    for part in mode.split("+"):
        if part == "notail":
            rule = (eta.TAIL_SURVIVE, 0.0)
        elif part.startswith("tail"):
            p, _, k = part[4:].partition(":")
            try:
                rule = (1.0 - float(p), float(k))
            except ValueError:
                raise SystemExit(f"mode {part!r}: want tailP:K, e.g. tail0.99:0.5") from None
    return rule


def _running_events(now, running, started, gone_by, default_runtime_s, q=0.5):  # type: ignore[no-untyped-def]
    emp = _knob("uemp")
    if emp is not None:
        return _empirical_events(now, running, started, gone_by, default_runtime_s, q, int(emp))
    rq = _knob("rq")
    if rq is not None:
        q = rq
    if "rmean" in _state["mode"]:
        out0: list[eta.Event] = []
        for rj, per_model in running:
            gone = gone_by.get(rj.job.id)
            est, spread = rj.job.runtime_estimate, rj.job.runtime_spread
            if gone is not None:
                out0.append((max(now, gone), per_model))
            elif est is None or spread is None or est <= 0:
                base = default_runtime_s if est is None else est
                out0.append((now + max(0.0, base - (now - rj.start_time)), per_model))
            else:
                out0.append((now + _mean_remaining(est, spread, now - rj.start_time), per_model))
        out0.extend(started)
        return out0
    if _state["mode"] not in ("running", "both"):
        return eta.running_events(now, running, started, gone_by, default_runtime_s, q)
    sim = _state["sim"]
    out: list[eta.Event] = []
    for rj, per_model in running:
        gone = gone_by.get(rj.job.id)
        if gone is not None:
            out.append((max(now, gone), per_model))
            continue
        sj = sim.jobs[rj.job.id]
        out.append((max(now, sj.last_start + sj.remaining), per_model))
    out.extend(started)
    return out


def _backfill_starts(now, free, capacity, events, waiting: Sequence[Any], default_runtime_s, in_order=False):  # type: ignore[no-untyped-def]
    if _state["mode"] in ("waiting", "both"):
        jobs = _state["sim"].jobs
        waiting = [(w[0], w[1], w[2], jobs[w[0]].remaining) for w in waiting]
    if "wmean" in _state["mode"]:
        queued = _state["sim"].queued
        out1 = []
        for w in waiting:
            j = queued.get(w[0])
            if j is not None and j.runtime_spread is not None and w[3] is not None and w[3] > 0:
                w = (w[0], w[1], w[2], _mean_remaining(w[3], j.runtime_spread, 0.0))
            out1.append(w)
        waiting = out1
    wq = _knob("wq")
    if wq is not None:
        queued = _state["sim"].queued
        out = []
        for w in waiting:
            j = queued.get(w[0])
            if j is not None and j.runtime_spread is not None and w[3] is not None:
                w = (w[0], w[1], w[2], eta.remaining_s(w[3], j.runtime_spread, 0.0, wq))
            out.append(w)
        waiting = out
    return eta.backfill_starts(now, free, capacity, events, waiting, default_runtime_s, in_order)


def passed_by_later(result: SimResult) -> Mapping[str, int]:
    """Per started job: how many jobs submitted after it started before it."""
    started = [j for j in result.jobs if not math.isnan(j.first_start)]
    started.sort(key=lambda j: j.trace.submit_time)
    starts = np.array([j.first_start for j in started])
    out: dict[str, int] = {}
    # later-submitted jobs with an earlier first start: count over the suffix (n log n by sorting)
    suffix: list[float] = []
    import bisect

    for i in range(len(started) - 1, -1, -1):
        out[started[i].trace.job_id] = bisect.bisect_left(suffix, starts[i])
        bisect.insort(suffix, starts[i])
    return out


_plain_sigma = eta._sigma


def _iqr_sigma(spread: tuple[float, float]) -> float:
    low, high = spread
    return (math.log(high) - math.log(low)) / eta.IQR_Z if low > 0 and high > low else 0.0


def _replay_with_knobs(sim: Simulator, mode: str) -> SimResult:
    """`sim` run with the scheduler functions the mode's knobs replace (sigma, tail rule,
    user-size floor, the diagnosis' event readers), only for this replay: the library's own
    functions are put back after it, whatever happens (another replay in the same process, a
    test's, sees the shipped path)."""
    scale = _knob("sig") or 1.0
    widen = _knob("sigw")  # the measured spread widened, the floor kept
    user_size_floor = _knob("usf")
    tail = _tail_rule(mode)
    try:
        if user_size_floor is not None:
            runtimes.estimate_from = _user_size_floor(user_size_floor)
        if widen is not None:
            eta._sigma = lambda spread: max(eta.SIGMA_MIN, widen * _iqr_sigma(spread))
        else:
            eta._sigma = lambda spread: _plain_sigma(spread) * scale
        if tail is not None:
            eta.TAIL_SURVIVE, eta.TAIL_FACTOR = tail
        diagnosis.running_events = _running_events
        diagnosis.backfill_starts = _backfill_starts  # type: ignore[assignment]
        result = sim.run()
    finally:
        diagnosis.running_events = eta.running_events
        diagnosis.backfill_starts = eta.backfill_starts
        eta._sigma = _plain_sigma
        eta.TAIL_SURVIVE, eta.TAIL_FACTOR = _plain_tail
        runtimes.estimate_from = _plain_estimate_from
        eta._LOG_NORMAL.clear()
        _state["sim"] = None
    return result


def one_run(trace: Trace, cluster: ClusterSpec, mode: str) -> tuple[SimResult, dict[str, Any]]:
    _state["mode"] = mode
    eta._LOG_NORMAL.clear()
    sim = Simulator(
        trace,
        cluster,
        resolve_policy(_state["policy"], _state.get("knobs")),
        policy_name=_state["policy"],
        config=SimConfig(eta_calibration="nocal" not in mode.split("+")),
    )
    _state["sim"] = sim
    if is_compiled():  # calls inside compiled code would not see the replaced functions
        raise SystemExit("eta_causes replaces scheduler functions: run it with CORRAL_PURE_PYTHON=1")
    result = _replay_with_knobs(sim, mode)
    passed = passed_by_later(result)
    rel: list[float] = []
    rel_alone: list[float] = []
    rel_passed: list[float] = []
    early = 0
    for j in result.jobs:
        if math.isnan(j.first_start) or math.isnan(j.eta):
            continue
        wait = j.first_start - j.trace.submit_time
        if wait <= ETA_MIN_WAIT_S:
            continue
        r = abs(j.eta - j.first_start) / wait
        rel.append(r)
        early += j.eta < j.first_start
        (rel_passed if passed.get(j.trace.job_id, 0) else rel_alone).append(r)

    def med(xs: list[float]) -> float | None:
        return round(float(np.median(xs)), 3) if xs else None

    rows = [
        (
            j.trace.job_id,
            j.trace.submit_time,
            j.eta,
            j.first_start,
            j.trace.num_gpus,
            j.trace.instances,
            j.trace.group,
            j.trace.user,
            j.trace.gpu_model or "",
            j.trace.duration,
            passed.get(j.trace.job_id, 0),
        )
        for j in result.jobs
    ]
    return result, {
        "rows": rows,
        "rel": med(rel),
        "jobs": len(rel),
        "too_early": round(early / len(rel), 3) if rel else None,
        "rel_not_passed": med(rel_alone),
        "n_not_passed": len(rel_alone),
        "rel_passed": med(rel_passed),
        "n_passed": len(rel_passed),
    }


CAL_KEYS = ("cluster", "group", "gsize", "size2", "pred")
CAL_STATS = ("median", "best", "loglin", "loglin1")
CAL_MIN_OUTCOMES = 30
_BEST_GRID = np.exp(np.linspace(math.log(0.1), math.log(30), 120))


def parse_variant(variant: str) -> tuple[str, str, int, float]:
    parts = variant.split(":")
    if len(parts) != 4 or parts[0] not in CAL_KEYS or parts[1] not in CAL_STATS:
        raise SystemExit(
            f"--calibrate {variant!r}: want KEY:STAT:WINDOW:A, KEY in {CAL_KEYS}, STAT in {CAL_STATS}"
        )
    return parts[0], parts[1], int(parts[2]), float(parts[3])


def _cal_keys(key: str, gpus: int, group: str, predicted: float) -> list[tuple[Any, ...]]:
    if key == "cluster":
        return [("*",)]
    if key == "group":
        return [("g", group), ("*",)]
    if key == "gsize":
        size = "1" if gpus <= 1 else "2-4" if gpus <= 4 else "5-8" if gpus <= 8 else "9+"
        return [("gs", group, size), ("g", group), ("*",)]
    if key == "size2":
        return [("s", eta_calibration.size_class(gpus)), ("*",)]
    wait_class = 0 if predicted < 600 else 1 if predicted < 3600 else 2 if predicted < 21600 else 3
    return [("p", wait_class), ("*",)]


def _cal_factor(stat: str, window: Sequence[tuple[float, float]], a: float, predicted: float) -> float:
    """The multiplier of (predicted + a) the window's outcomes (predicted, actual) give."""
    p = np.array([x for x, _ in window])
    w = np.array([y for _, y in window])
    if stat == "median":
        return float(np.median((w + a) / (p + a)))
    if stat == "best":  # minimises the median |m (p + a) - a - w| / w over the waits > 5 min
        long = w > ETA_MIN_WAIT_S
        if long.sum() < 10:
            return 1.0
        est = np.maximum(0.0, _BEST_GRID[:, None] * (p[long][None, :] + a) - a)
        cost = np.median(np.abs(est - w[long][None, :]) / w[long][None, :], axis=1)
        return float(_BEST_GRID[int(np.argmin(cost))])
    x, y = np.log(p + a), np.log(w + a)
    var = float(x.var())
    beta = float(((x - x.mean()) * (y - y.mean())).mean()) / var if var > 1e-9 else 1.0
    if stat == "loglin1":
        beta = min(1.0, max(0.0, beta))
    return math.exp(float(y.mean()) - beta * float(x.mean()) + beta * math.log(predicted + a)) / (
        predicted + a
    )


def score_calibration(rows: Sequence[Sequence[Any]], variant: str) -> dict[str, Any]:
    """The issue's figure for the roll's ETAs (rows of a `nocal` run) corrected by `variant` from
    the outcomes known at each submit (the jobs shown an ETA that had started by then)."""
    key, stat, size, a = parse_variant(variant)
    events = []
    for r in rows:  # (id, submit, eta, first start, gpus, instances, group, ...)
        if math.isnan(r[2]):
            continue
        events.append((r[1], 1, r))
        if not math.isnan(r[3]):
            events.append((r[3], 0, r))  # an outcome is known to a submit at the same instant
    events.sort(key=lambda e: (e[0], e[1]))
    windows: dict[tuple[Any, ...], deque[tuple[float, float]]] = {}
    added: dict[tuple[Any, ...], int] = {}
    best: dict[tuple[Any, ...], tuple[int, float]] = {}  # `best` is refit every 25 outcomes (cost)
    rel: list[float] = []
    early = corrected = 0
    for _, is_query, r in events:
        predicted = max(0.0, r[2] - r[1])
        keys = _cal_keys(key, r[4], r[6], predicted)
        if not is_query:
            for k in keys:
                windows.setdefault(k, deque(maxlen=size)).append((predicted, r[3] - r[1]))
                added[k] = added.get(k, 0) + 1
            continue
        shown = r[2]
        for k in keys:
            found = windows.get(k)
            if found is not None and len(found) >= CAL_MIN_OUTCOMES:
                if stat == "best":
                    fit = best.get(k)
                    if fit is None or added[k] - fit[0] >= 25:
                        fit = best[k] = (added[k], _cal_factor(stat, found, a, predicted))
                    m = fit[1]
                else:
                    m = _cal_factor(stat, found, a, predicted)
                shown, corrected = r[1] + max(0.0, m * (predicted + a) - a), corrected + 1
                break
        wait = r[3] - r[1]
        if not math.isnan(r[3]) and wait > ETA_MIN_WAIT_S:
            rel.append(abs(shown - r[3]) / wait)
            early += shown < r[3]
    return {
        "rel": round(float(np.median(rel)), 3) if rel else None,
        "jobs": len(rel),
        "too_early": round(early / len(rel), 3) if rel else None,
        "corrected_share": round(corrected / max(1, sum(e[1] for e in events)), 3),
    }


def one_case(
    label: str, trace: Trace, cluster: ClusterSpec, modes: Sequence[str], calibrations: Sequence[str] = ()
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    first: list[float] | None = None
    for mode in modes:
        result, fig = one_run(trace, cluster, mode)
        starts = [j.first_start for j in result.jobs]
        if first is None:
            first = starts
        fig["same_schedule"] = np.allclose(np.nan_to_num(first, nan=-1), np.nan_to_num(starts, nan=-1))
        rows = fig.pop("rows")
        if DUMP:
            with open(f"{DUMP}/{label.replace(' ', '_')}_{mode}.json", "w") as f:
                json.dump(rows, f)
        out[mode] = fig
        print(label, mode, fig, flush=True)
        if mode == "nocal":
            for variant in calibrations:
                out[f"cal:{variant}"] = score_calibration(rows, variant)
                print(label, f"cal:{variant}", out[f"cal:{variant}"], flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=20000, help="Philly prefix (0: skip Philly)")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--synth-jobs", type=int, default=3000)
    parser.add_argument("--load", type=float, default=1.3)
    parser.add_argument("--policy", default="default", help="another policy (a what-if)")
    parser.add_argument("--gang-share", type=float, default=SynthSpec().gang_share)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--calibrate", default="", help="KEY:STAT:WINDOW:A variants, scored on `nocal`")
    parser.add_argument("--knob", action="append", default=[], help="policy knob NAME=VALUE (a what-if)")
    args = parser.parse_args()
    _state["knobs"] = parse_knobs(args.knob)
    _state["policy"] = args.policy
    modes = [m for m in args.modes.split(",") if m]
    calibrations = [c for c in args.calibrate.split(",") if c]
    for variant in calibrations:
        parse_variant(variant)  # a bad one is refused before any replay
    if calibrations and "nocal" not in modes:
        parser.error("--calibrate scores on the rows of the `nocal` mode: add it to --modes")
    results: dict[str, Any] = {}
    synth = load_cluster("synth")
    for seed in [int(s) for s in args.seeds.split(",") if s.strip()]:
        trace = generate(
            SynthSpec(jobs=args.synth_jobs, load=args.load, gang_share=args.gang_share, seed=seed), synth
        )
        results[f"synth_{seed}"] = one_case(f"synth {seed}", trace, synth, modes, calibrations)
    if args.jobs:
        philly = first_jobs(load_trace("philly"), args.jobs)
        results["philly"] = one_case("philly", philly, load_cluster("philly"), modes, calibrations)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
