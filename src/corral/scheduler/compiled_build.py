"""Use the mypyc-compiled build of the scheduler when, and only when, it was built from exactly the
sources in this checkout (docs/scheduler.md, "Compiled build").

`scripts/build_compiled.py` (run by scripts/setup.sh) compiles every module of this package except
this one and `__init__` into `build/mypyc/` at the repository root, outside `src/`, and writes there
the digest of the sources it compiled. `activate` (called by the package's `__init__` before any
submodule is imported) compares that digest with the digest of the sources on disk now and only
then puts the compiled directory first on the package's `__path__`. An edited, added or removed
module changes the digest, so a developer who edits `core.py` and runs the tests without rebuilding
gets the edited pure-Python code, never the old extension.

All or nothing: the compiled modules call each other directly in C and pass native class instances
between them, so a mix of compiled and pure modules of the same build must not happen. Because
`__init__` runs before any submodule, either every submodule is found in the compiled directory
(the digest matched, so every source has its extension) or none is.

This module is kept out of the compiled build (it decides whether the build is used) and is plain
file I/O at import time, the one exception to the scheduler's "no I/O": about a millisecond to read
and hash the sources (docs/simulator.md, "Speed").
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

# The modules of the package that are not compiled: the package's __init__ and this module.
NOT_COMPILED = frozenset({"__init__.py", "compiled_build.py"})
# mypyc's shared library for the whole group (named by scripts/build_compiled.py's group_name); each
# module's own extension is a small shim that imports it by this top-level name.
GROUP_LIBRARY = "corral_scheduler__mypyc"
DIGEST_FILE = "sources.sha256"
PURE_ENV = "CORRAL_PURE_PYTHON"

PACKAGE_DIR = Path(__file__).resolve().parent
# src/corral/scheduler -> the repository root (for an editable install, the checkout).
REPO_ROOT = PACKAGE_DIR.parents[2]
BUILD_DIR = Path(os.environ.get("CORRAL_COMPILED_DIR") or REPO_ROOT / "build" / "mypyc")

_active = False


def compiled_sources(package_dir: Path = PACKAGE_DIR) -> list[Path]:
    """The package's modules that the build compiles, in a stable order."""
    return sorted(p for p in package_dir.glob("*.py") if p.name not in NOT_COMPILED)


def source_digest(package_dir: Path = PACKAGE_DIR) -> str:
    """Digest of the compiled modules' names and contents, and of the extension suffix (a build for
    another Python cannot be loaded, so it must not count as current)."""
    digest = hashlib.sha256(importlib.machinery.EXTENSION_SUFFIXES[0].encode())
    for path in compiled_sources(package_dir):
        digest.update(b"\0" + path.name.encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def build_digest(build_dir: Path = BUILD_DIR) -> str | None:
    """The digest the build in `build_dir` was made from; None when there is no complete build."""
    try:
        return (build_dir / DIGEST_FILE).read_text().strip()
    except OSError:
        return None


def _load_group_library(build_dir: Path) -> bool:
    """Import mypyc's group library by file, under the top-level name the shims import, without
    putting the build directory on sys.path."""
    if GROUP_LIBRARY in sys.modules:
        return True
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    spec = importlib.util.spec_from_file_location(GROUP_LIBRARY, build_dir / f"{GROUP_LIBRARY}{suffix}")
    if spec is None or spec.loader is None:
        return False
    module = importlib.util.module_from_spec(spec)
    sys.modules[GROUP_LIBRARY] = module
    spec.loader.exec_module(module)
    return True


def activate(package_path: list[str]) -> bool:
    """Put the compiled modules first on `package_path` (the package's `__path__`) when the build is
    current and `CORRAL_PURE_PYTHON` is not set. Returns whether they were."""
    global _active
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return False
    built = build_digest()
    if built is None or built != source_digest():
        return False
    compiled_dir = BUILD_DIR / "corral" / "scheduler"
    try:
        if not _load_group_library(BUILD_DIR):
            return False
    except ImportError:  # built for another interpreter or a broken build: pure Python instead
        sys.modules.pop(GROUP_LIBRARY, None)
        return False
    package_path.insert(0, str(compiled_dir))
    _active = True
    return True


def is_compiled() -> bool:
    """Whether this process runs the compiled scheduler (for version lines and benchmarks): what was
    actually imported, not what activate decided."""
    core = sys.modules.get("corral.scheduler.core")
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return _active and core is not None and str(core.__file__).endswith(suffixes)
