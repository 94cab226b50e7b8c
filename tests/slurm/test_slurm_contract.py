"""The engine contract suite (tests/engine/contract.py) against the Slurm engine on a real cluster.
Multi-instance attempts spread over two nodes, so they run as one Slurm job with an srun step."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.engine.slurm import SlurmEngine
from tests.engine.contract import EngineContract
from tests.slurm.conftest import cleanup_cluster
from tests.slurm.harness import SlurmCluster
from tests.slurm.helpers import slurm_engine

pytestmark = pytest.mark.slurm


class TestSlurmContract(EngineContract):
    @pytest.fixture
    def engine_factory(self, slurm_cluster: SlurmCluster) -> Iterator[Callable[[], SlurmEngine]]:
        made: list[SlurmEngine] = []
        state_dir = slurm_cluster.new_state_dir()

        def factory() -> SlurmEngine:
            eng = slurm_engine(slurm_cluster, state_dir)
            made.append(eng)
            return eng

        yield factory
        for eng in made:
            eng.close()
        cleanup_cluster(slurm_cluster)

    @pytest.fixture
    def node_names(self) -> list[str]:
        return ["node1", "node2"]

    @pytest.fixture
    def shared_dir(self, slurm_cluster: SlurmCluster) -> Iterator[Path]:
        yield slurm_cluster.scratch_dir()  # reachable by the cluster's job accounts
