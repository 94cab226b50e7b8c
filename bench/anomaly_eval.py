"""Anomaly detector vs the static threshold rules, on labelled fault scenarios.

    .venv/bin/python -m bench.anomaly_eval            # tuning + evaluation seeds (~5 min of CPU)
    .venv/bin/python -m bench.anomaly_eval --quick    # fewer scenarios (a smoke run)
    .venv/bin/python -m bench.anomaly_eval --quiet    # figures only, no line per scenario

Each scenario is one node with `GPUS` virtual GPUs sampled every `STEP_S` seconds under normal
load (each GPU alternates busy and idle jobs; its temperature follows the load with a lag and
noise; power is noisy; healthy GPUs now and then see a correctable ECC error, an application Xid
(13/31) or one missed read). A faulty scenario adds one fault at `fault_start`, injected through
the virtual GPU provider's own chaos model (`corral.monitor.gpu.merge_fault` + `fault_reading`,
what `corral chaos gpu ...` writes and the server samples):

- temp_ramp (gradual): `temperature_ramp_c_per_s`; failure = the GPU's noise-free temperature
  reaches 90 C (the health check's limit, where it throttles and jobs fail);
- ecc_creep (gradual): correctable errors arriving at a Poisson rate; failure = the first
  uncorrectable error, after N of them;
- flapping (gradual): all the node's GPUs drop out `flap_down_s` every `flap_period_s`;
  failure = the node drops out for good;
- gpu_drop (abrupt): one GPU falls off the bus; failure = at once (no lead time is possible, so
  it counts for precision/recall but not for lead time).

Both detectors see only the sample stream (never the labels):
- the anomaly detector (corral.monitor.anomaly), run in-process over the simulated stream, and
  alarming like the shipped rule CorralNodeFailureRisk: node risk >= RISK_THRESHOLD for RISK_FOR_S;
- the static rules as shipped in deploy/prometheus/rules/corral-hardware.yml: temperature > 85 C
  for 5 m, uncorrectable ECC > 0, GPU absent for 1 m, any Xid in the last 10 m.

A scenario's first alarm onset counts as a detection when it lies in [fault_start, failure +
GRACE_S]; an onset on a healthy scenario, or before a faulty one's fault started, is a false
alarm. precision = detections / (detections + false alarms); recall = detections / faulty
scenarios; lead time = failure - detection, median over detected gradual faults. Tuning seeds
(used while choosing DetectorConfig and the threshold) and evaluation seeds (reported) are
disjoint and printed; the last line is one JSON object with the evaluation figures.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from corral.monitor.anomaly import AnomalyDetector  # noqa: E402
from corral.monitor.gpu import GpuRef, GpuSample, fault_reading, merge_fault  # noqa: E402

GPUS = 4
STEP_S = 10.0  # the server's default sample interval
HEALTHY_S = 3 * 3600.0
AFTER_FAILURE_S = 10 * 60.0
GRACE_S = 5 * 60.0
RISK_THRESHOLD = 0.6  # deploy/prometheus/rules/corral-anomaly.yml
RISK_FOR_S = 60.0
FAILURE_TEMP_C = 90.0
KINDS = ("healthy", "healthy", "temp_ramp", "ecc_creep", "flapping", "gpu_drop")
GRADUAL = ("temp_ramp", "ecc_creep", "flapping")
TUNING_SEEDS = range(1000, 1060)

EVAL_SEEDS = range(2000, 2150)


@dataclass
class Scenario:
    seed: int
    kind: str
    fault_gpu: int
    fault_start: float
    params: dict[str, float]
    failure: float | None = None  # set by the simulation (the label; detectors never see it)

    def describe(self) -> str:
        p = " ".join(f"{k}={v:g}" for k, v in self.params.items())
        start = f" start={self.fault_start / 60:.0f}m gpu={self.fault_gpu}" if self.kind != "healthy" else ""
        return f"seed={self.seed} {self.kind}{start} {p}".rstrip()


def make_scenario(seed: int) -> Scenario:
    rng = random.Random(seed)
    kind = rng.choice(KINDS)
    start = rng.uniform(40, 70) * 60.0
    params: dict[str, float] = {}
    if kind == "temp_ramp":
        params["c_per_min"] = round(rng.uniform(0.2, 1.0), 2)
    elif kind == "ecc_creep":
        params["per_min"] = round(rng.uniform(0.3, 2.0), 2)
        params["errors_to_failure"] = rng.randint(20, 60)
    elif kind == "flapping":
        params["period_s"] = round(rng.uniform(120, 480))
        params["down_s"] = round(rng.uniform(10, 30))
        params["fails_after_min"] = round(rng.uniform(15, 45))
    return Scenario(seed, kind, rng.randrange(GPUS), start, params)


# ---------------------------------------------------------------- normal load + faults


@dataclass
class GpuLoad:
    """One healthy GPU's workload and physics (what the fault entry's plain fields say)."""

    rng: random.Random
    ambient: float
    heat_per_util: float
    tau_s: float
    idle_power: float
    busy: bool = False
    switch_at: float = 0.0
    clean_temp: float = 0.0

    def step(self, t: float) -> dict[str, Any]:
        if t >= self.switch_at:
            self.busy = not self.busy if t > 0 else self.rng.random() < 0.6
            self.switch_at = t + self.rng.uniform(10, 90 if self.busy else 40) * 60.0
        util = min(100.0, max(0.0, self.rng.gauss(92, 5))) if self.busy else max(0.0, self.rng.gauss(1, 1))
        target = self.ambient + self.heat_per_util * util
        if t == 0:
            self.clean_temp = target
        self.clean_temp += (1 - math.exp(-STEP_S / self.tau_s)) * (target - self.clean_temp)
        return {
            "utilization_percent": util,
            "temperature_c": self.clean_temp + self.rng.gauss(0, 0.7),
            "power_w": self.idle_power + 2.5 * util + self.rng.gauss(0, 6),
            "memory_used_mib": 60000.0 if self.busy else 500.0,
        }


def _healthy_noise(rng: random.Random, entry: dict[str, Any], t: float) -> dict[str, Any]:
    """Rare events healthy GPUs also show; none of them fails a job."""
    if rng.random() < STEP_S / (6 * 3600):  # a correctable ECC error every ~6 h
        entry = merge_fault(entry, t, ecc_corrected=1)
    if rng.random() < STEP_S / (20 * 3600):  # an application Xid every ~20 h
        entry = merge_fault(entry, t, xid=rng.choice((13, 31)))
    return entry


def simulate(sc: Scenario) -> Iterator[tuple[float, list[GpuSample]]]:
    """The sample stream of the scenario; sets `sc.failure` when the fault starts failing jobs."""
    rng = random.Random(sc.seed * 7919 + 1)
    refs = [GpuRef("node-a", i, f"GPU-virt-{sc.seed}-{i}", 81920) for i in range(GPUS)]
    loads = [
        GpuLoad(rng, rng.uniform(30, 40), rng.uniform(0.35, 0.5), rng.uniform(40, 90), rng.uniform(40, 60))
        for _ in refs
    ]
    faults: list[dict[str, Any]] = [{} for _ in refs]
    end = HEALTHY_S if sc.kind == "healthy" else math.inf  # a fault runs until it fails
    ecc_since_start = 0
    t = 0.0
    while t <= end:
        for i, load in enumerate(loads):
            faults[i] = _healthy_noise(rng, merge_fault(faults[i], t, **load.step(t)), t)
        if sc.kind != "healthy" and t >= sc.fault_start and sc.failure is None:
            ecc_since_start = _inject(sc, faults, loads, rng, t, ecc_since_start)
            if sc.failure is not None:
                end = sc.failure + AFTER_FAILURE_S
        missed = {i for i in range(GPUS) if rng.random() < 1 / 3000}  # one missed NVML read
        samples = [fault_reading(ref, faults[i], t) for i, ref in enumerate(refs)]
        yield t, [_missing(s) if i in missed else s for i, s in enumerate(samples)]
        t += STEP_S


def _missing(s: GpuSample) -> GpuSample:
    return GpuSample(node=s.node, index=s.index, uuid=s.uuid, present=False)


def _inject(
    sc: Scenario, faults: list[dict[str, Any]], loads: list[GpuLoad], rng: random.Random, t: float, ecc: int
) -> int:
    """Apply the fault at time t (through the chaos model); returns the ECC errors crept so far."""
    g, first = sc.fault_gpu, t - sc.fault_start < STEP_S
    if sc.kind == "temp_ramp":
        if first:
            faults[g] = merge_fault(faults[g], t, temperature_ramp_c_per_s=sc.params["c_per_min"] / 60.0)
        offset = sc.params["c_per_min"] / 60.0 * (t - faults[g]["temperature_ramp_since"])
        if loads[g].clean_temp + offset >= FAILURE_TEMP_C:
            sc.failure = t
    elif sc.kind == "ecc_creep":
        arrivals = _poisson(rng, sc.params["per_min"] * STEP_S / 60.0)
        faults[g] = merge_fault(faults[g], t, ecc_corrected=arrivals) if arrivals else faults[g]
        ecc += arrivals
        if ecc >= sc.params["errors_to_failure"]:
            faults[g] = merge_fault(faults[g], t, ecc_uncorrected=1)
            sc.failure = t
    elif sc.kind == "flapping":
        if first:
            for i in range(GPUS):
                faults[i] = merge_fault(
                    faults[i], t, flap_period_s=sc.params["period_s"], flap_down_s=sc.params["down_s"]
                )
        if t - sc.fault_start >= sc.params["fails_after_min"] * 60.0:
            for i in range(GPUS):
                faults[i] = merge_fault(faults[i], t, lost=True)
            sc.failure = t
    elif sc.kind == "gpu_drop":
        faults[g] = merge_fault(faults[g], t, lost=True)
        sc.failure = t
    return ecc


def _poisson(rng: random.Random, lam: float) -> int:
    n, p, limit = 0, 1.0, math.exp(-lam)
    while True:
        p *= rng.random()
        if p <= limit:
            return n
        n += 1


# ---------------------------------------------------------------- the two detectors


class StaticRules:
    """deploy/prometheus/rules/corral-hardware.yml's GPU rules, evaluated on each sample."""

    def __init__(self) -> None:
        self.hot_since: dict[int, float] = {}
        self.lost_since: dict[int, float] = {}
        self.xid_at: dict[int, float] = {}
        self.xids: dict[int, int] = {}

    def firing(self, t: float, samples: list[GpuSample]) -> bool:
        fire = False
        for s in samples:
            i = s.index
            if s.present:
                self.lost_since.pop(i, None)
                hot = s.temperature_c > 85.0  # CorralGpuTemperatureHigh, for: 5m
                fire |= hot and t - self.hot_since.setdefault(i, t) >= 300.0
                if not hot:
                    self.hot_since.pop(i, None)
                if s.xid_events_total > self.xids.get(i, 0):  # CorralGpuXid: increase over 10m > 0
                    self.xid_at[i] = t
                self.xids[i] = max(self.xids.get(i, 0), s.xid_events_total)
                fire |= s.ecc_volatile_uncorrected > 0  # CorralGpuEccErrors, for: 0m
            else:  # CorralGpuLost: present == 0 for 1m
                fire |= t - self.lost_since.setdefault(i, t) >= 60.0
            fire |= t - self.xid_at.get(i, -1e9) <= 600.0
        return fire


class DetectorRule:
    """CorralNodeFailureRisk: corral_node_failure_risk > RISK_THRESHOLD for RISK_FOR_S."""

    def __init__(self, threshold: float = RISK_THRESHOLD) -> None:
        self.detector = AnomalyDetector()
        self.threshold = threshold
        self.above_since: float | None = None
        self.why: list[str] = []

    def firing(self, t: float, samples: list[GpuSample]) -> bool:
        self.detector.observe(samples, t)
        risks = self.detector.node_risks()
        if risks and risks[0].risk > self.threshold:
            if self.above_since is None:
                self.above_since, self.why = t, risks[0].reasons[:2]
            return t - self.above_since >= RISK_FOR_S
        self.above_since = None
        return False


@dataclass
class Outcome:
    scenario: Scenario
    onsets: dict[str, list[float]] = field(default_factory=dict)  # detector name -> alarm onsets
    why: list[str] = field(default_factory=list)  # the detector's reasons at its first alarm


def run_scenario(sc: Scenario) -> Outcome:
    rules: dict[str, DetectorRule | StaticRules] = {"detector": DetectorRule(), "static": StaticRules()}
    was = dict.fromkeys(rules, False)
    out = Outcome(sc, {name: [] for name in rules})
    for t, samples in simulate(sc):
        for name, rule in rules.items():
            now = rule.firing(t, samples)
            if now and not was[name]:
                out.onsets[name].append(t)
                if isinstance(rule, DetectorRule) and not out.why:
                    out.why = rule.why
            was[name] = now
    return out


def score(outcomes: list[Outcome], name: str) -> dict[str, Any]:
    tp = fp = faulty = 0
    leads: list[float] = []
    leads_by_kind: dict[str, list[float]] = {}
    for o in outcomes:
        sc, onsets = o.scenario, o.onsets[name]
        if sc.kind == "healthy":
            fp += 1 if onsets else 0
            continue
        faulty += 1
        assert sc.failure is not None, sc.describe()
        fp += 1 if any(t < sc.fault_start for t in onsets) else 0
        hits = [t for t in onsets if sc.fault_start <= t <= sc.failure + GRACE_S]
        if hits:
            tp += 1
            if sc.kind in GRADUAL:
                leads.append(sc.failure - hits[0])
                leads_by_kind.setdefault(sc.kind, []).append(sc.failure - hits[0])
    return {
        "precision": round(tp / (tp + fp), 3) if tp + fp else 0.0,
        "recall": round(tp / faulty, 3) if faulty else 0.0,
        "false_alarms": fp,
        "detected": tp,
        "faulty": faulty,
        "median_lead_s": round(statistics.median(leads), 1) if leads else None,
        "median_lead_s_by_kind": {
            k: round(statistics.median(v), 1) for k, v in sorted(leads_by_kind.items())
        },
    }


def evaluate(seeds: range, verbose: bool) -> dict[str, dict[str, Any]]:
    outcomes = []
    for seed in seeds:
        outcome = run_scenario(make_scenario(seed))
        outcomes.append(outcome)
        if verbose:
            sc = outcome.scenario
            fail = f" failure={sc.failure / 60:.1f}m" if sc.failure is not None else ""
            first = {k: (f"{v[0] / 60:.1f}m" if v else "-") for k, v in outcome.onsets.items()}
            print(
                f"  {sc.describe()}{fail} first alarm: detector {first['detector']} static {first['static']}"
            )
            print(f"      {outcome.why}")
    return {name: score(outcomes, name) for name in ("detector", "static")}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a third of the scenarios")
    parser.add_argument("--quiet", action="store_true", help="no line per scenario (parameters, alarms)")
    parser.add_argument("--tuning-only", action="store_true", help="while tuning: no evaluation seeds")
    args = parser.parse_args()
    tuning = range(TUNING_SEEDS.start, TUNING_SEEDS.start + (20 if args.quick else len(TUNING_SEEDS)))
    evaluation = range(EVAL_SEEDS.start, EVAL_SEEDS.start + (50 if args.quick else len(EVAL_SEEDS)))
    print(f"scenarios: {GPUS} GPUs per node, a sample every {STEP_S:g} s, kinds {sorted(set(KINDS))}")
    print(
        f"detector alarm: node risk > {RISK_THRESHOLD} for {RISK_FOR_S:g} s;"
        f" grace after failure {GRACE_S:g} s"
    )
    started = time.perf_counter()
    results = {}
    if args.tuning_only:
        print(f"tuning seeds: {tuning.start}..{tuning.stop - 1}")
        for name, figures in evaluate(tuning, not args.quiet).items():
            print(f"  tuning     {name:8} {json.dumps(figures)}")
        return
    for label, seeds in (("tuning", tuning), ("evaluation", evaluation)):
        print(f"{label} seeds: {seeds.start}..{seeds.stop - 1}")
        results[label] = evaluate(seeds, not args.quiet)
        for name, figures in results[label].items():
            print(f"  {label:10} {name:8} {json.dumps(figures)}")
    det, static = results["evaluation"]["detector"], results["evaluation"]["static"]
    lead_ratio = None
    if det["median_lead_s"] is not None and static["median_lead_s"]:
        lead_ratio = round(det["median_lead_s"] / static["median_lead_s"], 2)
    print(
        f"evaluation: detector vs static median lead {det['median_lead_s']} s vs {static['median_lead_s']} s"
    )
    print(f"wall time {time.perf_counter() - started:.1f} s")
    print(
        json.dumps(
            {
                "bench": "anomaly_eval",
                "evaluation_seeds": [evaluation.start, evaluation.stop - 1],
                "tuning_seeds": [tuning.start, tuning.stop - 1],
                "detector": det,
                "static": static,
                "lead_ratio": lead_ratio,  # null when the static rules' median lead is 0 or less
                "lead_ratio_by_kind": {
                    kind: round(lead / static["median_lead_s_by_kind"][kind], 2)
                    for kind, lead in det["median_lead_s_by_kind"].items()
                    if static["median_lead_s_by_kind"].get(kind, 0) > 0
                },
                "targets_met": det["recall"] >= 0.9
                and det["precision"] >= 0.9
                and (
                    static["median_lead_s"] is None
                    or det["median_lead_s"] >= 2 * max(static["median_lead_s"], 0)
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
