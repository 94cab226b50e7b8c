"""Compile the scheduler library and the simulator's replay (compiled_build.COMPILED: src/corral/scheduler
but __init__ and compiled_build, src/corral/sim but __init__, errors, report and whatif) with mypyc into
build/mypyc/, for corral.scheduler.compiled_build to use (docs/scheduler.md, "Compiled build").

    python scripts/build_compiled.py [--force]

Does nothing when build/mypyc/ already holds a build of exactly these sources with this mypy (its
stamp, build-info.json, says so). Writes the sources' digest (sources.sha256) last, after every
extension is in place: the package uses the build only when that digest matches its sources, so an
interrupted or failed build is never loaded. Exit status 0 when the build is current, 1 when it
could not be made (no compiler, a mypyc error): then the scheduler and simulator run pure Python
(scripts/setup.sh goes on).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # this checkout's sources, whatever the virtualenv points at

from corral.scheduler import compiled_build  # noqa: E402

BUILD = ROOT / "build" / "mypyc"
WORK = ROOT / "build" / "mypyc-work"  # mypyc's generated C and the object files
INFO = "build-info.json"
# mypyc's shared library is <group>__mypyc; compiled_build.GROUP_LIBRARY imports it by that name.
GROUP = compiled_build.GROUP_LIBRARY.removesuffix("__mypyc")


def wanted_info() -> dict[str, str]:
    return {"sources": compiled_build.source_digest(), "mypy": importlib.metadata.version("mypy")}


def is_current() -> bool:
    try:
        built = json.loads((BUILD / INFO).read_text())
    except (OSError, ValueError):
        return False
    return bool(built == wanted_info() and compiled_build.build_digest(BUILD) == built["sources"])


def build() -> None:
    from mypyc.build import mypycify
    from setuptools import Distribution

    info = wanted_info()
    shutil.rmtree(BUILD, ignore_errors=True)  # the old digest goes first: nothing half-built is used
    WORK.mkdir(parents=True, exist_ok=True)
    sources = [str(p) for p in compiled_build.compiled_sources()]
    # From inside build/: mypyc writes its C under the working directory, and setuptools must not
    # read the project's pyproject.toml (this is not the package's build).
    os.chdir(WORK)
    options = ["--config-file", str(ROOT / "pyproject.toml"), "--no-warn-unused-configs"]
    extensions = mypycify([*options, *sources], group_name=GROUP, opt_level="3", multi_file=True)
    dist = Distribution({"name": "corral-compiled", "ext_modules": extensions})
    command = dist.get_command_obj("build_ext")
    command.build_lib, command.build_temp = str(BUILD), str(WORK / "temp")
    command.parallel = os.cpu_count() or 1
    dist.run_command("build_ext")
    (BUILD / INFO).write_text(json.dumps(info) + "\n")
    (BUILD / compiled_build.DIGEST_FILE).write_text(info["sources"] + "\n")  # last: the build is complete


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the build is current")
    args = parser.parse_args()
    if not args.force and is_current():
        print("corral compiled build: up to date")
        return 0
    started = time.monotonic()
    WORK.mkdir(parents=True, exist_ok=True)
    log = WORK / "build.log"
    try:
        with log.open("w") as out, redirect_output(out):  # mypyc's and the compiler's chatter
            build()
    except (Exception, SystemExit) as e:  # mypyc exits on a type error; a missing compiler raises
        why = f"{type(e).__name__}: {e}".strip().splitlines()[0]
        print(f"corral compiled build: failed ({why}; see {log}); scheduler and simulator run pure Python")
        return 1
    print(f"corral compiled build: built in {time.monotonic() - started:.0f} s")
    return 0


@contextmanager
def redirect_output(out: IO[str]) -> Iterator[None]:
    """Send this process's stdout and stderr, the compiler's included, to `out`."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    os.dup2(out.fileno(), 1)
    os.dup2(out.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


if __name__ == "__main__":
    sys.exit(main())
