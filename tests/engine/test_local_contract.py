"""The engine contract against the local engine, sandboxed and unsandboxed."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.engine.base import FailureReason
from corral.engine.local import LocalEngine
from tests.engine.contract import EngineContract, make_attempt, wait_finished
from tests.engine.local_support import local_engine_factory
from tests.support import require, require_binary


class TestLocalContractIsolated(EngineContract):
    @pytest.fixture
    def engine_factory(self, tmp_path: Path) -> Iterator[Callable[[], LocalEngine]]:
        require_binary("bwrap")
        with local_engine_factory(tmp_path / "home") as factory:
            probe = factory()
            require(probe.capabilities().sandbox and probe.capabilities().cgroups, "bwrap and cgroups")
            yield factory

    @pytest.fixture
    def node_names(self) -> list[str]:
        return ["node-a"]


class TestLocalContractPlain(EngineContract):
    @pytest.fixture
    def engine_factory(self, tmp_path: Path) -> Iterator[Callable[[], LocalEngine]]:
        with local_engine_factory(tmp_path / "home", isolation=False) as factory:
            yield factory

    @pytest.fixture
    def node_names(self) -> list[str]:
        return ["node-a"]


def test_bwrap_is_installed_here() -> None:
    """The sandboxed contract must not silently turn into a skip on the CI machine."""
    require(shutil.which("bwrap") is not None, "bubblewrap")


def test_a_stop_at_any_moment_of_the_start_ends_the_attempt_at_once(tmp_path: Path) -> None:
    """A stop that lands between the supervisor's fork and the job's setsid() used to find no
    process group to signal: the attempt ran on for the whole 30 s grace period (about 2 in 100
    stops here, when they came 0-20 ms after the launch). Stops are swept over that window."""
    with local_engine_factory(tmp_path / "home", isolation=False) as factory:
        engine = factory()
        for i in range(80):
            attempt = make_attempt(["node-a"], "sleep 60")
            engine.launch(attempt)
            time.sleep((i % 40) * 0.0005)
            engine.stop(attempt.attempt_id, 30.0)
            status = wait_finished(engine, attempt.attempt_id, timeout=5)
            assert status.reason is FailureReason.STOPPED, f"stop {i}: {status}"
