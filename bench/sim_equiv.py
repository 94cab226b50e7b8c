"""Per-job fingerprints of replays, to check that a speed change is exact (docs/simulator.md, Speed).

For each case prints two hashes and the replay's CPU seconds: `jobs`, over every job's first start,
end, ETA as shown, preemptions and total wait (what earlier rounds compared), and `events`, over
every submit, start, preemption, stop and end with the nodes and GPUs it held (the node sets).
Floats are hashed by their exact bits (`float.hex`). Run it on the code before and after a change:
equal hashes for every case, or the change is not exact.

    .venv/bin/python bench/sim_equiv.py [--eta-reuse S] philly:8000:fifo deep:3000:default:2.0 ...

`--eta-reuse S` sets the knob `eta_reuse_s` for every case (default: each profile's own, `default`
60 s since the sixteenth round, the others 0). The kept roll moves only the ETAs, so the `events`
hash is the same at every value; the fifteenth round's `jobs` hashes of `default` cases are at 0.

A case is `philly:JOBS:POLICY` (the first JOBS jobs of the Philly trace on the philly cluster) or
`deep:JOBS:POLICY:LOAD[:SEED]` (a `corral sim synth` trace on the synth cluster, as
bench/sim_replay.py's deep case).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import time

from corral.scheduler.compiled_build import is_compiled
from corral.sim.cluster import ClusterSpec, load_cluster
from corral.sim.replay import SimConfig, SimResult
from corral.sim.runner import simulate
from corral.sim.synth import SynthSpec, generate
from corral.sim.trace import Trace, first_jobs, load_trace


def case_inputs(case: str) -> tuple[Trace, ClusterSpec, str]:
    """The trace, cluster and policy a case names; a clear error for a malformed one."""
    parts = case.split(":")
    try:
        if parts[0] == "philly" and len(parts) == 3:
            return first_jobs(load_trace("philly"), int(parts[1])), load_cluster("philly"), parts[2]
        if parts[0] == "deep" and len(parts) in (4, 5):
            cluster = load_cluster("synth")
            seed = int(parts[4]) if len(parts) == 5 else 0
            spec = SynthSpec(jobs=int(parts[1]), load=float(parts[3]), seed=seed)
            return generate(spec, cluster), cluster, parts[2]
    except ValueError as exc:
        raise SystemExit(f"case {case!r}: {exc}") from exc
    raise SystemExit(f"case {case!r}: expected philly:JOBS:POLICY or deep:JOBS:POLICY:LOAD[:SEED]")


def fingerprints(result: SimResult) -> tuple[str, str]:
    """(jobs hash, events hash), 12 hex digits each."""
    jobs = hashlib.sha256()
    for sj in sorted(result.jobs, key=lambda j: j.trace.job_id):
        fields = (sj.first_start, sj.end, sj.eta, float(sj.preemptions), sj.waited_s)
        line = sj.trace.job_id + "|" + "|".join(float(x).hex() for x in fields) + "\n"
        jobs.update(line.encode())
    events = hashlib.sha256()
    for e in result.events:
        line = f"{float(e.time).hex()}|{e.job_id}|{e.event}|{e.nodes}|{e.gpus}|{e.reason}\n"
        events.update(line.encode())
    return jobs.hexdigest()[:12], events.hexdigest()[:12]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", help="philly:JOBS:POLICY or deep:JOBS:POLICY:LOAD[:SEED]")
    parser.add_argument(
        "--eta-reuse", type=float, default=None, help="the eta_reuse_s knob in s (default: each profile's)"
    )
    args = parser.parse_args()
    if args.eta_reuse is not None and (not math.isfinite(args.eta_reuse) or args.eta_reuse < 0):
        parser.error(f"--eta-reuse must be a finite number >= 0 of seconds, got {args.eta_reuse}")
    knobs = {} if args.eta_reuse is None else {"eta_reuse_s": args.eta_reuse}
    config = SimConfig(record_events=True)
    print(f"compiled: {is_compiled()}")
    for case in args.cases:
        trace, cluster, policy = case_inputs(case)
        cpu = time.process_time()
        result = simulate(trace, cluster, policy, config, knobs)
        cpu = time.process_time() - cpu
        jobs_hash, events_hash = fingerprints(result)
        print(f"{case}: jobs {jobs_hash} events {events_hash} ({result.cycles:,} cycles, CPU {cpu:.1f} s)")


if __name__ == "__main__":
    main()
