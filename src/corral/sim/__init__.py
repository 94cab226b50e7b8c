"""Trace-driven simulator: replays GPU-cluster traces through Corral's scheduler library.

    from corral.sim import load_trace, load_cluster, simulate, summarize
    result = simulate(load_trace("philly"), load_cluster("philly"), "default")
    print(summarize(result)["avg_jct_s"])

See docs/simulator.md.
"""

# First, before any submodule is imported: the compiled modules if the build is current, else pure
# Python for all (corral.scheduler.compiled_build).
from corral.scheduler.compiled_build import activate as _activate_compiled_build

_activate_compiled_build("sim", __path__)


from corral.sim.cluster import ClusterError, ClusterSpec, load_cluster, parse_cluster
from corral.sim.metrics import summarize
from corral.sim.replay import CycleRecord, SimConfig, SimResult, SimulationError, Simulator
from corral.sim.runner import PolicyError, private_baseline, resolve_policy, simulate
from corral.sim.trace import Trace, TraceError, TraceJob, load_generic_csv, load_trace

__all__ = [
    "ClusterError",
    "ClusterSpec",
    "CycleRecord",
    "PolicyError",
    "SimConfig",
    "SimResult",
    "SimulationError",
    "Simulator",
    "Trace",
    "TraceError",
    "TraceJob",
    "load_cluster",
    "load_generic_csv",
    "load_trace",
    "parse_cluster",
    "private_baseline",
    "resolve_policy",
    "simulate",
    "summarize",
]
