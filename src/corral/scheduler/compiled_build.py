"""Use the mypyc-compiled build of the scheduler (and the simulator's replay) when, and only when,
it was built from exactly the sources in this checkout (docs/scheduler.md, "Compiled build").

`scripts/build_compiled.py` (run by scripts/setup.sh) compiles the modules of `COMPILED` into
`build/mypyc/` at the repository root, outside `src/`, and writes there the digest of the sources
it compiled. `activate` (called by each compiled package's `__init__` before any of its modules is
imported) compares that digest with the digest of the sources on disk now and only then puts the
compiled directory first on the package's `__path__`. An edited, added or removed module changes
the digest, so a developer who edits `core.py` and runs the tests without rebuilding gets the
edited pure-Python code, never the old extension.

All or nothing: the compiled modules are one mypyc group; they call each other directly in C and
pass native class instances between them, so compiled and pure modules of the same build must not
mix. The decision is made once per process (the first `activate`) and holds for every package,
and each package's `__init__` asks before any of its modules is imported: either every module of
the build is found in the compiled directory (the digest matched, so every source has its
extension) or none is.

Builds are never changed in place: each lives in its own directory under `build/mypyc/`, named by
the digest of its sources (and the mypy that made it), written to a temporary directory and
renamed into place when complete, and only builds older than the newest few are removed. So a
process keeps loading from the build it decided on while a newer one is made beside it, and an
interrupted or failed build leaves the previous ones as they were.

This module is kept out of the build (it decides whether the build is used) and does plain file
I/O at import time, the one exception to the scheduler's "no I/O": about 2 ms to read and hash the
sources.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

# Package (under src/corral) -> its modules that are not compiled. The scheduler: its __init__ and
# this module. The simulator: its exceptions (mypyc compiles no subclass of ValueError or
# RuntimeError) and the modules outside the replay's path (plots, what-if edits of a cluster).
COMPILED: dict[str, frozenset[str]] = {
    "scheduler": frozenset({"__init__.py", "compiled_build.py"}),
    "sim": frozenset({"__init__.py", "errors.py", "report.py", "whatif.py"}),
}
# Modules outside the build that compiled code reads at import (its constants are typed there and
# checked by the compiled code at run time): their contents count in the digest too. A test keeps
# this list equal to what the compiled modules import from outside the build.
# yaml_lines: sim/cluster.py names a file line in errors; words: counts in the reasons' words
DEPENDENCIES = ("domain.py", "words.py", "yaml_lines.py")
# mypyc's shared library for the whole group (named by scripts/build_compiled.py's group_name); each
# module's own extension is a small shim that imports it by this top-level name.
GROUP_LIBRARY = "corral_compiled__mypyc"
DIGEST_FILE = "sources.sha256"
PURE_ENV = "CORRAL_PURE_PYTHON"
TRUTHY = frozenset({"1", "true", "yes"})

# src/corral; its parent's parent is the repository root (for an editable install, the checkout).
CORRAL_DIR = Path(__file__).resolve().parents[1]
# Where builds live, one directory each (`build_name`); CORRAL_COMPILED_DIR moves it (tests).
BUILDS_DIR = Path(os.environ.get("CORRAL_COMPILED_DIR") or CORRAL_DIR.parents[1] / "build" / "mypyc")

_decision: Path | bool | None = None  # the build the first activate chose, or False: pure Python
_why_pure = ""  # why the first activate chose pure Python (for `describe`)


def compiled_sources(corral_dir: Path = CORRAL_DIR) -> list[Path]:
    """The modules that the build compiles, in a stable order."""
    return [
        path
        for package, kept_out in sorted(COMPILED.items())
        for path in sorted((corral_dir / package).glob("*.py"))
        if path.name not in kept_out
    ]


def source_digest(corral_dir: Path = CORRAL_DIR) -> str:
    """Digest of the compiled modules' names and contents, of the modules they read from outside
    the build (DEPENDENCIES), and of the extension suffix (a build for another Python cannot be
    loaded, so it must not count as current)."""
    digest = hashlib.sha256(importlib.machinery.EXTENSION_SUFFIXES[0].encode())
    for path in [*compiled_sources(corral_dir), *(corral_dir / name for name in DEPENDENCIES)]:
        digest.update(b"\0" + path.relative_to(corral_dir).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build_name(digest: str, mypy_version: str) -> str:
    """The directory of the build of these sources by this mypy: a new mypy makes a new build
    beside the old one instead of replacing it under a process that uses it."""
    return f"{digest[:20]}-mypy{mypy_version}"


def build_digest(build_dir: Path) -> str | None:
    """The digest the build in `build_dir` was made from; None when there is no complete build."""
    try:
        return (build_dir / DIGEST_FILE).read_text().strip()
    except OSError:
        return None


def find_build(digest: str, builds_dir: Path = BUILDS_DIR, corral_dir: Path = CORRAL_DIR) -> Path | None:
    """The newest complete build of exactly these sources: its digest file matches and every
    compiled module has its extension (all or nothing, even if files went missing since)."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    try:
        candidates = sorted(builds_dir.glob(f"{digest[:20]}-*"), key=lambda p: -p.stat().st_mtime)
    except OSError:
        return None
    for build in candidates:
        if build_digest(build) != digest or not (build / f"{GROUP_LIBRARY}{suffix}").is_file():
            continue
        names = (p.relative_to(corral_dir.parent).with_suffix(suffix) for p in compiled_sources(corral_dir))
        if all((build / name).is_file() for name in names):
            return build
    return None


def _load_group_library(build_dir: Path) -> None:
    """Import mypyc's group library by file, under the top-level name the shims import, without
    putting the build directory on sys.path."""
    if GROUP_LIBRARY in sys.modules:
        return
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    spec = importlib.util.spec_from_file_location(GROUP_LIBRARY, build_dir / f"{GROUP_LIBRARY}{suffix}")
    if spec is None or spec.loader is None:
        raise ImportError(f"no {GROUP_LIBRARY} in {build_dir}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[GROUP_LIBRARY] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[GROUP_LIBRARY]
        raise


def _decide() -> Path | None:
    global _why_pure
    if os.environ.get(PURE_ENV, "").strip().lower() in TRUTHY:
        _why_pure = f"{PURE_ENV} is set"
        return None
    build = find_build(source_digest())
    if build is None:
        _why_pure = f"no build of these sources in {BUILDS_DIR} (scripts/build_compiled.py makes one)"
        return None
    try:
        _load_group_library(build)
    except ImportError as exc:  # built for another interpreter, or a broken build: pure Python instead
        _why_pure = f"the build in {build} did not load: {exc}"
        return None
    return build


def activate(package: str, package_path: list[str]) -> bool:
    """Put the compiled modules of `package` ("scheduler", "sim") first on `package_path` (the
    package's `__path__`) when a build of exactly the current sources exists and
    `CORRAL_PURE_PYTHON` is not set. Returns whether they were. The scheduler decides for the
    process (it is imported first: the simulator imports it); a package imported later uses the
    same build, or runs pure if that build has been removed since (pure code calling the compiled
    scheduler is safe; the reverse never happens, the scheduler imports nothing of the simulator)."""
    global _decision
    if _decision is None:
        _decision = _decide() or False
    if not isinstance(_decision, Path) or build_digest(_decision) is None:
        return False
    package_path.insert(0, str(_decision / "corral" / package))
    return True


def describe() -> str:
    """One line for logs and version output: which scheduler this process runs, and why not the
    compiled one when it does not (a server started from a non-editable install, or before the
    build was made, runs pure Python, slower but with the same results)."""
    if is_compiled():  # (the package's import, before this module's, made the decision)
        assert isinstance(_decision, Path)
        return f"compiled (mypyc, {_decision.name})"
    return f"pure Python ({_why_pure or 'the chosen build was removed since'})"


def is_compiled() -> bool:
    """Whether this process runs the compiled scheduler (for version lines and benchmarks): what was
    actually imported, not only what activate decided."""
    core = sys.modules.get("corral.scheduler.core")
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return isinstance(_decision, Path) and core is not None and str(core.__file__).endswith(suffixes)
