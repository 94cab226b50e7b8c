"""What a build job runs, published on the storage root so that any engine's job account can run
it: `<storage root>/env/tools/`, root's, readable by all (the dir 0755, files 0444/0555), bound
read-only into build jobs at /corral/tools.

    buildstep-<hash>.py   corral/environments/buildstep.py (standard library only: it runs under
                          the environment's own interpreter, not the server's)
    uv-<hash>             the uv binary of the server's pinned `uv` package

Names carry the first 16 hex digits of the file's sha256: a published file never changes, so a
build job queued before a server upgrade runs the tools its spec names. Each file appears by one
rename of a complete, read-only temporary file (`.incoming-*`): never half written. Old versions
stay (uv is ~40 MB; an admin may remove old ones when no build job is queued).

Why not the server's venv: it may live where job accounts cannot read (a pyenv under /root, mode
700): a Slurm job runs as the user's own Unix account (docs/slurm.md)."""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from corral.environments import buildstep
from corral.environments.store import INCOMING

BUILD_TOOLS = "/corral/tools"  # the tools dir, read-only, in a build job
# The variable naming that dir, set in a build job's spec only: it marks one. A copy of the spec
# (`corral submit --from-job`, a template saved from it) is refused at submit (services/jobs.py):
# the tools are bound only into the build the environments service starts itself.
BUILD_TOOLS_ENV = "CORRAL_ENV_TOOLS"
HASH_LEN = 16
_digests: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256 hex
_lock = threading.Lock()


class ToolsUnavailable(RuntimeError):
    """The server cannot publish what a build job needs (no uv binary, storage not writable)."""


@dataclass(frozen=True, slots=True)
class BuildTools:
    """The published names, relative to the tools dir."""

    buildstep: str
    uv: str


def tools_dir(root: Path) -> Path:
    return root / "env" / "tools"


def uv_binary() -> Path:
    """The uv of the server's own environment (the pinned `uv` package), else one on PATH."""
    beside = Path(sys.prefix) / "bin" / "uv"
    if beside.is_file():
        return beside
    found = shutil.which("uv")
    if found is None:
        raise ToolsUnavailable(
            "no uv binary: install the pinned `uv` package into the server's environment "
            f"({beside} is missing)"
        )
    return Path(found)


def _digest(path: Path) -> str:
    st = os.stat(path)
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _lock:
        cached = _digests.get(key)
    if cached is not None:
        return cached
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    with _lock:
        _digests[key] = h.hexdigest()
    return h.hexdigest()


def _publish_file(directory: Path, source: Path, name: str, mode: int) -> None:
    final = directory / name
    if final.is_file():
        return  # content-addressed: the same name is the same bytes
    staging = directory / f"{INCOMING}{name}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        shutil.copyfile(source, staging)
        os.chmod(staging, mode)
        os.rename(staging, final)
    finally:
        staging.unlink(missing_ok=True)


def publish(root: Path) -> BuildTools:
    """The tools, published under `<root>/env/tools` (a no-op when they are there already)."""
    step, uv = Path(buildstep.__file__), uv_binary()
    names = BuildTools(
        buildstep=f"buildstep-{_digest(step)[:HASH_LEN]}.py",
        uv=f"uv-{_digest(uv)[:HASH_LEN]}",
    )
    directory = tools_dir(root)
    try:
        directory.mkdir(mode=0o755, parents=True, exist_ok=True)  # the server made the root's layout
        if directory.stat().st_mode & 0o777 != 0o755:  # not on every call: only the owner may chmod
            os.chmod(directory, 0o755)
        _publish_file(directory, step, names.buildstep, 0o444)
        _publish_file(directory, uv, names.uv, 0o555)
    except OSError as exc:
        raise ToolsUnavailable(f"cannot publish the build tools to {directory}: {exc}") from exc
    return names
