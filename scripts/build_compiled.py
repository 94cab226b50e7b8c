"""Compile the scheduler library and the simulator's replay (compiled_build.COMPILED: src/corral/scheduler
but __init__ and compiled_build, src/corral/sim but __init__, errors, report and whatif) with mypyc into
build/mypyc/, for corral.scheduler.compiled_build to use (docs/scheduler.md, "Compiled build").

    python scripts/build_compiled.py [--force]

Does nothing when build/mypyc/ already holds a complete build of exactly these sources with this
mypy. Otherwise compiles into a temporary directory under build/mypyc/ and renames it into place
when complete, as build/mypyc/<digest>-mypy<version>/ (compiled_build.build_name), then removes all
but the newest three builds: a process that loads modules from an older build keeps finding them,
and an interrupted or failed build leaves the others as they were. One build at a time (a lock
in build/mypyc-work/). Exit status 0 when the build is current, 1 when it could not be made (no
compiler, a mypyc error, build/ not writable): then the scheduler and simulator run pure Python
(scripts/setup.sh goes on).
"""

from __future__ import annotations

import argparse
import fcntl
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

BUILDS = compiled_build.BUILDS_DIR  # one directory per build (compiled_build.build_name)
WORK = ROOT / "build" / "mypyc-work"  # mypyc's generated C and the object files (its cache)
INFO = "build-info.json"
KEEP = 3  # builds kept: the newest, and older ones a running process may still load from
# mypyc's shared library is <group>__mypyc; compiled_build.GROUP_LIBRARY imports it by that name.
GROUP = compiled_build.GROUP_LIBRARY.removesuffix("__mypyc")


def wanted_info() -> dict[str, str]:
    return {"sources": compiled_build.source_digest(), "mypy": importlib.metadata.version("mypy")}


def current_build(info: dict[str, str]) -> Path | None:
    build = compiled_build.find_build(info["sources"], BUILDS)
    wanted = compiled_build.build_name(info["sources"], info["mypy"])
    return build if build is not None and build.name == wanted else None


def build(info: dict[str, str]) -> Path:
    """Compile into a temporary directory, then rename it into place complete: a process never sees
    a half-written build, and the builds it may be using are not touched."""
    from mypyc.build import mypycify
    from setuptools import Distribution  # type: ignore[import-untyped]

    temporary = BUILDS / f"tmp-{os.getpid()}"
    shutil.rmtree(temporary, ignore_errors=True)
    sources = [str(p) for p in compiled_build.compiled_sources()]
    # From inside build/: mypyc writes its C under the working directory, and setuptools must not
    # read the project's pyproject.toml (this is not the package's build).
    os.chdir(WORK)
    options = ["--config-file", str(ROOT / "pyproject.toml"), "--no-warn-unused-configs"]
    extensions = mypycify([*options, *sources], group_name=GROUP, opt_level="3", multi_file=True)
    dist = Distribution({"name": "corral-compiled", "ext_modules": extensions})
    command = dist.get_command_obj("build_ext")
    command.build_lib, command.build_temp = str(temporary), str(WORK / "temp")
    command.parallel = os.cpu_count() or 1
    dist.run_command("build_ext")
    (temporary / INFO).write_text(json.dumps(info) + "\n")
    (temporary / compiled_build.DIGEST_FILE).write_text(info["sources"] + "\n")
    final = BUILDS / compiled_build.build_name(info["sources"], info["mypy"])
    shutil.rmtree(final, ignore_errors=True)  # only an incomplete one: a complete one was current
    os.rename(temporary, final)
    return final


def prune(keep: Path) -> None:
    """Remove all but the newest KEEP builds (and temporary directories of builds that died)."""
    newest_first = sorted((p for p in BUILDS.iterdir() if p.is_dir()), key=lambda p: -p.stat().st_mtime)
    complete = [p for p in newest_first if not p.name.startswith("tmp-")]
    for path in [p for p in newest_first if p.name.startswith("tmp-")] + complete[KEEP:]:
        if path != keep:
            shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="rebuild even when the build is current")
    args = parser.parse_args()
    try:
        WORK.mkdir(parents=True, exist_ok=True)
        BUILDS.mkdir(parents=True, exist_ok=True)
        lock = (WORK / "build.lock").open("w")
    except OSError as e:
        why = f"cannot write {e.filename}: {e.strerror}"
        print(f"corral compiled build: failed ({why}); scheduler and simulator run pure Python")
        return 1
    fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the next finds it current
    info = wanted_info()
    if not args.force and current_build(info) is not None:
        print("corral compiled build: up to date")
        return 0
    started = time.monotonic()
    log = WORK / "build.log"
    try:
        with log.open("w") as out, redirect_output(out):  # mypyc's and the compiler's chatter
            made = build(info)
    except (Exception, SystemExit) as e:  # mypyc exits on a type error; a missing compiler raises
        why = f"{type(e).__name__}: {e}".strip().splitlines()[0]
        print(f"corral compiled build: failed ({why}; see {log}); scheduler and simulator run pure Python")
        return 1
    prune(made)
    print(f"corral compiled build: built in {time.monotonic() - started:.0f} s ({made})")
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
