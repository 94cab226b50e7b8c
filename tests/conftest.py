"""The `pure_scheduler` marker: a test that patches a method of a scheduler class (to switch off a
shortcut, or to spy on it) needs the pure-Python scheduler, because the mypyc-compiled classes take
no patches and calls inside compiled code would not see one (docs/scheduler.md, "Compiled build").
When this process runs the compiled scheduler, such a test runs in a child pytest with
`CORRAL_PURE_PYTHON=1`, and passes or fails with it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from corral.scheduler.compiled_build import PURE_ENV, is_compiled

ROOT = Path(__file__).resolve().parents[1]


def _run_in_pure_python(nodeid: str) -> None:
    env = {**os.environ, PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--no-header", nodeid],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"{nodeid} failed on the pure-Python scheduler:\n{done.stdout}\n{done.stderr}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not is_compiled():
        return
    for item in items:
        if item.get_closest_marker("pure_scheduler") is not None:
            nodeid = item.nodeid
            item.runtest = lambda nodeid=nodeid: _run_in_pure_python(nodeid)  # type: ignore[method-assign]
