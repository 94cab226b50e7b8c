"""The `pure_scheduler` marker: a test that patches a method of a scheduler class (to switch off a
shortcut, or to spy on it) needs the pure-Python scheduler, because the mypyc-compiled classes take
no patches and calls inside compiled code would not see one (docs/scheduler.md, "Compiled build").
When this process runs the compiled scheduler, the marked tests run in one child pytest with
`CORRAL_PURE_PYTHON=1` (one start-up for all of them), and each passes, fails or skips with its run
there.

Also how pytest-xdist shares the suite out between its workers (pytest_xdist_make_scheduler)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from corral.scheduler.compiled_build import PURE_ENV, is_compiled

ROOT = Path(__file__).resolve().parents[1]

_pure_results: dict[str, tuple[str, str]] = {}  # nodeid -> (outcome, text), from the child run


def _run_in_pure_python(nodeids: list[str]) -> dict[str, tuple[str, str]]:
    """Run `nodeids` in a child pytest on the pure-Python scheduler; each one's outcome."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--junitxml", str(report)]
        done = subprocess.run(
            [*argv, *nodeids], cwd=ROOT, env={**os.environ, PURE_ENV: "1"}, capture_output=True, text=True
        )
        out: dict[str, tuple[str, str]] = {}
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                module = case.get("classname", "").replace(".", "/") + ".py"
                nodeid = f"{module}::{case.get('name')}"
                bad = case.find("failure") if case.find("failure") is not None else case.find("error")
                skipped = case.find("skipped")
                if bad is not None:
                    out[nodeid] = ("failed", bad.text or bad.get("message", ""))
                elif skipped is not None:
                    out[nodeid] = ("skipped", skipped.get("message", ""))
                else:
                    out[nodeid] = ("passed", "")
        missing = f"no result from the child pytest:\n{done.stdout}\n{done.stderr}"
        for nodeid in nodeids:  # not in the report: the child could not run it
            out.setdefault(nodeid, ("failed", missing))
        return out


def _pure_result(nodeid: str, marked: list[str]) -> None:
    if not _pure_results:
        _pure_results.update(_run_in_pure_python(marked))
    outcome, text = _pure_results[nodeid]
    if outcome == "failed":
        pytest.fail(f"{nodeid} failed on the pure-Python scheduler:\n{text}")
    if outcome == "skipped":
        pytest.skip(text)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not is_compiled():
        return
    marked = [item for item in items if item.get_closest_marker("pure_scheduler") is not None]
    nodeids = [item.nodeid for item in marked]
    for item in marked:
        item.runtest = lambda nodeid=item.nodeid: _pure_result(nodeid, nodeids)  # type: ignore[method-assign]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """How pytest-xdist shares the tests out (scripts/test.sh runs the suite on two workers): a test
    module's tests go to one worker, in order, so its module fixtures (servers, browsers) start
    once and its tests may build on each other; every Slurm test goes to one worker and so uses
    one Slurm cluster: two clusters would hand out the same job ids (tests find a job's processes
    by SLURM_JOB_ID) and their harnesses add the same Unix accounts. (`--dist loadgroup` with
    xdist_group marks would say the same, but pytest 9 ignores the test ids xdist 3.8 rewrites for
    it.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ByModuleSlurmTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            if module.startswith("tests/slurm/"):
                return "tests/slurm"
            if module.startswith("tests/api/") and "[postgres" in nodeid:
                # tests/api's database is a session fixture over [sqlite, postgres]: a module's
                # PostgreSQL half is its own scope, so no worker switches databases inside a
                # module; one that comes back to a database sets it up again (tests/api/conftest.py).
                return module + "[postgres]"
            return module

    return ByModuleSlurmTogether(config, log)


@pytest.fixture(autouse=True)
def _cli_consoles_as_made() -> None:
    """Each test starts with the CLI's Rich consoles sized as made: by the COLUMNS a CliRunner's
    env gives (else 80 off a terminal). A test that fixes a width (monkeypatch of `_width`) is
    undone, but the CI run once saw `corral.cli.common.out` held at 80 in a worker, so two tests
    that ask for COLUMNS=200 wrapped; whatever held it, no test inherits another's width."""
    for name in ("corral.cli.common", "corral.cli.admin"):
        module = sys.modules.get(name)
        for console in (getattr(module, "out", None), getattr(module, "err", None)):
            if console is not None:
                console._width = None
