"""The engine contract against the local engine, sandboxed and unsandboxed."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from corral.engine.local import LocalEngine
from tests.engine.contract import EngineContract
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
