"""The simulator's exceptions, in one module that is not compiled: mypyc compiles no subclass of
ValueError or RuntimeError (corral.scheduler.compiled_build). Each module that raises one imports
it from here, so `from corral.sim.trace import TraceError` and the like still work."""


class ClusterError(ValueError):
    """A cluster file that cannot be used; the message names the file and the entry."""


class PolicyError(ValueError):
    """A policy name, placement or knob that does not exist."""


class SimulationError(RuntimeError):
    """The scheduler returned a plan the cluster cannot carry out (a scheduler bug)."""


class SynthError(ValueError):
    """A synthetic-workload spec that cannot be generated; the message names the parameter."""


class TraceError(ValueError):
    """A trace that cannot be loaded; the message names the file, line and column when it can."""
