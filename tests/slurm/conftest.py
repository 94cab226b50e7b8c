"""Fixtures: one real Slurm cluster per test session (munged, slurmctld, 3 slurmd x 4 fake GPUs),
and a fresh SlurmEngine per test with its own state dir."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest

from corral.engine.slurm import SlurmEngine
from corral.engine.slurm import engine as slurm_engine_module
from corral.engine.slurm.cli import CliResult, SlurmCli
from corral.scheduler.types import NodeState
from tests.slurm.harness import TEST_ACCOUNTS, SlurmCluster, missing_binaries
from tests.slurm.helpers import HeldClock, slurm_engine
from tests.support import require

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    require(not missing, f"Slurm/munge programs {missing}")
    with SlurmCluster(nodes=3, gpus_per_node=4, cpus_per_node=4, memory_mib=4000) as cluster:
        yield cluster


@pytest.fixture
def engine(slurm_cluster: SlurmCluster) -> Iterator[SlurmEngine]:
    eng = slurm_engine(slurm_cluster)
    yield eng
    eng.close()
    cleanup_cluster(slurm_cluster)


@pytest.fixture
def squeue_calls(engine: SlurmEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, ...]]]:
    """Every squeue argv the engine runs, and what it printed (its last item)."""
    calls: list[tuple[str, ...]] = []
    real = SlurmCli.run

    def recording(self: SlurmCli, tool: str, *args: str, **kwargs: object) -> CliResult:
        result = real(self, tool, *args, **kwargs)  # type: ignore[arg-type]
        if tool == "squeue":
            calls.append((*args, result.stdout))
        return result

    monkeypatch.setattr(SlurmCli, "run", recording)
    yield calls


def cleanup_cluster(cluster: SlurmCluster) -> None:
    """Leave the shared cluster as found: no jobs, every node up and not drained."""
    env = cluster.env
    for account in ("root", *TEST_ACCOUNTS.values()):
        subprocess.run(["scancel", f"--user={account}"], env=env, capture_output=True, timeout=15)
    for name in cluster.node_names:
        if cluster.nodes[name].wrapper is None:
            cluster.start_node(name, wait=False)
    subprocess.run(
        ["scontrol", "update", f"nodename={','.join(cluster.node_names)}", "state=resume"],
        env=env,
        capture_output=True,
        timeout=15,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        busy = subprocess.run(
            ["squeue", "-h", "-t", "PENDING,RUNNING,COMPLETING,CONFIGURING", "-o", "%i"],
            env=env,
            capture_output=True,
            text=True,
            timeout=15,
        ).stdout.strip()
        if not busy and all(s == "idle" for s in cluster.node_states().values()):
            return
        time.sleep(0.1)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> HeldClock:
    """The Slurm engine module's clock, held still until the test moves it (helpers.HeldClock)."""
    held = HeldClock()
    monkeypatch.setattr(slurm_engine_module, "time", held)
    return held


@pytest.fixture
def drained_node3(engine: SlurmEngine) -> str:
    """A node where a job pinned to it pends (ReqNodeNotAvail) until it is resumed (the engine
    fixture's clean-up resumes it)."""
    engine.set_node_state("node3", NodeState.CORDONED, "pending-poll test")
    return "node3"
