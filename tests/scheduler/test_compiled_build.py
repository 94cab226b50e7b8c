"""The mypyc-compiled scheduler and replay (corral.scheduler.compiled_build, scripts/build_compiled.py): used
only when built from exactly the sources on disk, never half of it, and with the same results as
the pure-Python modules. Outside CI a missing build (no compiler) skips the tests that need one;
under CI it fails them, like every other component (scripts/setup.sh builds it)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from corral.scheduler import compiled_build
from tests.support import require

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "corral"

# Prints which build the child process imported: the flag and where `core` and the simulator's
# `replay` came from (the two packages go compiled or pure together).
WHICH = (
    "import json, corral.sim.replay as replay, corral.scheduler.core as core\n"
    "from corral.scheduler import compiled_build\n"
    "print(json.dumps([compiled_build.is_compiled(), core.__file__, replay.__file__]))\n"
)

# A small replay on which compiled and pure must agree job by job: a deep synthetic queue (quotas,
# backfill, preemption) under several policies, each job's first start, end, first estimated
# start, preemptions and wait.
REPLAY = """
import json
from corral.scheduler.compiled_build import is_compiled
from corral.sim.cluster import load_cluster
from corral.sim.replay import SimConfig
from corral.sim.runner import simulate
from corral.sim.synth import SynthSpec, generate

cluster = load_cluster("synth")
trace = generate(SynthSpec(jobs=400, load=2.0, seed=0), cluster)
out = {"compiled": is_compiled()}
for policy in ("default", "las", "fifo-backfill", "sjf"):
    result = simulate(trace, cluster, policy, SimConfig())
    out[policy] = repr(sorted(  # repr: an unfinished job's NaN end compares equal as text
        (j.trace.job_id, j.first_start, j.end, j.eta, j.preemptions, round(j.waited_s, 6))
        for j in result.jobs
    ))
print(json.dumps(out))
"""


def run_python(code: str, *, pythonpath: Path, pure: bool, build_dir: Path | None = None) -> Any:
    env = {k: v for k, v in os.environ.items() if k != compiled_build.PURE_ENV}
    env["PYTHONPATH"] = str(pythonpath)
    if pure:
        env[compiled_build.PURE_ENV] = "1"
    if build_dir is not None:
        env["CORRAL_COMPILED_DIR"] = str(build_dir)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.splitlines()[-1])


def require_current_build() -> Path:
    build = compiled_build.find_build(compiled_build.source_digest())
    require(build is not None, "a current compiled scheduler build (scripts/build_compiled.py)")
    assert build is not None
    return build


def copy_of_compiled_packages(tmp_path: Path) -> Path:
    """The scheduler and simulator packages (and the modules they import from outside them:
    compiled_build.DEPENDENCIES) in a fresh tree."""
    package = tmp_path / "src" / "corral"
    for name in ("scheduler", "sim"):
        shutil.copytree(SRC / name, package / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("__init__.py", *compiled_build.DEPENDENCIES):
        shutil.copy(SRC / name, package / name)
    return tmp_path / "src"


@pytest.mark.parametrize(
    "edited", ["scheduler/core.py", "sim/replay.py", "domain.py", "words.py", "yaml_lines.py"]
)
def test_an_edited_source_runs_pure_python_not_the_old_build(tmp_path: Path, edited: str) -> None:
    build = require_current_build()
    src = copy_of_compiled_packages(tmp_path)
    compiled, core, replay = run_python(WHICH, pythonpath=src, pure=False, build_dir=build.parent)
    assert compiled and core.startswith(str(build)) and replay.startswith(str(build))
    with (src / "corral" / edited).open("a") as f:
        f.write("\n# edited after the build\n")
    compiled, core, replay = run_python(WHICH, pythonpath=src, pure=False, build_dir=build.parent)
    assert not compiled
    assert core == str(src / "corral" / "scheduler" / "core.py")
    assert replay == str(src / "corral" / "sim" / "replay.py")


def test_an_added_module_runs_pure_python(tmp_path: Path) -> None:
    build = require_current_build()
    src = copy_of_compiled_packages(tmp_path)
    (src / "corral" / "scheduler" / "extra.py").write_text("X = 1\n")
    compiled, _, _ = run_python(WHICH, pythonpath=src, pure=False, build_dir=build.parent)
    assert not compiled


def test_a_build_missing_one_module_runs_pure_python_not_half_of_it(tmp_path: Path) -> None:
    """A digest that matches is not enough: every compiled module's extension must be there (a
    partial copy loaded one module pure beside the compiled group: a segfault)."""
    build = require_current_build()
    copy = tmp_path / "builds" / build.name
    shutil.copytree(build, copy)
    compiled, _, _ = run_python(WHICH, pythonpath=ROOT / "src", pure=False, build_dir=copy.parent)
    assert compiled
    next((copy / "corral" / "scheduler").glob("core.*")).unlink()
    compiled, core, _ = run_python(WHICH, pythonpath=ROOT / "src", pure=False, build_dir=copy.parent)
    assert not compiled and core == str(SRC / "scheduler" / "core.py")


def test_the_digest_covers_every_module_the_compiled_code_imports_from_outside_the_build() -> None:
    """Compiled code checks the types of what it imports (a `frozenset` constant of corral.domain
    changed to a tuple raised TypeError in the old build while the digest still matched): every
    first-party module a compiled module imports from outside the build is in DEPENDENCIES."""
    outside: set[str] = set()
    for path in compiled_build.compiled_sources():
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                parts = name.split(".")
                if parts[0] == "corral" and len(parts) > 1 and parts[1] not in compiled_build.COMPILED:
                    outside.add(parts[1] + ".py")
    assert outside == set(compiled_build.DEPENDENCIES)


def test_no_build_or_the_switch_runs_pure_python(tmp_path: Path) -> None:
    compiled, core, replay = run_python(WHICH, pythonpath=ROOT / "src", pure=False, build_dir=tmp_path)
    assert not compiled and core.endswith("core.py") and replay.endswith("replay.py")
    compiled, core, replay = run_python(WHICH, pythonpath=ROOT / "src", pure=True)
    assert not compiled and core.endswith("core.py") and replay.endswith("replay.py")


def test_compiled_and_pure_replays_agree_job_by_job() -> None:
    require_current_build()
    compiled = run_python(REPLAY, pythonpath=ROOT / "src", pure=False)
    pure = run_python(REPLAY, pythonpath=ROOT / "src", pure=True)
    assert isinstance(compiled, dict) and isinstance(pure, dict)
    assert compiled.pop("compiled") is True and pure.pop("compiled") is False
    assert compiled == pure


DESCRIBE = (
    "import json\nfrom corral.scheduler import compiled_build\nprint(json.dumps(compiled_build.describe()))\n"
)


def test_describe_names_the_build_or_why_the_process_runs_pure_python(tmp_path: Path) -> None:
    """The line the server logs at start: the build it loaded, or the reason it did not."""
    build = require_current_build()
    line = run_python(DESCRIBE, pythonpath=ROOT / "src", pure=False, build_dir=build.parent)
    assert line == f"compiled (mypyc, {build.name})"
    line = run_python(DESCRIBE, pythonpath=ROOT / "src", pure=True)
    assert line == "pure Python (CORRAL_PURE_PYTHON is set)"
    line = run_python(DESCRIBE, pythonpath=ROOT / "src", pure=False, build_dir=tmp_path)
    assert line.startswith("pure Python (no build of these sources in") and str(tmp_path) in line
    broken = tmp_path / "builds" / build.name
    shutil.copytree(build, broken)
    next(broken.glob(f"{compiled_build.GROUP_LIBRARY}.*")).write_bytes(b"not a shared object")
    line = run_python(DESCRIBE, pythonpath=ROOT / "src", pure=False, build_dir=broken.parent)
    assert line.startswith(f"pure Python (the build in {broken} did not load:")
