"""OOM through Slurm's own memory enforcement (task/cgroup, ConstrainRAMSpace) on a one-node
cluster of its own: an instance over its memory request ends FAILED with reason OOM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.engine.base import AttemptPhase, FailureReason
from tests.slurm.harness import SlurmCluster, missing_binaries
from tests.slurm.helpers import FINISHED, attempt, instance, slurm_engine, wait_for
from tests.support import require

pytestmark = pytest.mark.slurm

GROW = "python3 -c 'a = bytearray({mib} * 1024 * 1024); print(len(a) // 2**20, \"MiB\")'"


@pytest.fixture(scope="module")
def oom_cluster() -> Iterator[SlurmCluster]:
    missing = missing_binaries()
    require(not missing, f"Slurm/munge programs {missing}")
    require(Path("/sys/fs/cgroup/memory/cgroup.procs").exists(), "a cgroup v1 memory hierarchy")
    with SlurmCluster(nodes=1, memory_cgroups=True) as cluster:
        yield cluster


def test_over_memory_is_oom(oom_cluster: SlurmCluster) -> None:
    engine = slurm_engine(oom_cluster)
    engine.launch(attempt("401.1", instance("node1", GROW.format(mib=400), memory_mib=100)))
    engine.launch(attempt("402.1", instance("node1", GROW.format(mib=10), memory_mib=100)))
    oom = wait_for(engine, "401.1", FINISHED, timeout_s=30)
    assert (oom.phase, oom.reason) == (AttemptPhase.FAILED, FailureReason.OOM), oom
    assert oom.exit_code == 137  # SIGKILL from the kernel's OOM killer
    fits = wait_for(engine, "402.1", FINISHED, timeout_s=30)
    assert fits.phase is AttemptPhase.SUCCEEDED, fits
    assert engine.logs("402.1").data == b"10 MiB\n"
    engine.close()
