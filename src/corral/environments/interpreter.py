"""The interpreter an environment is built for, chosen explicitly and recorded with each version
(`EnvironmentVersion.interpreter`): its venv's `bin/python` links to it, so it must exist at the
same path wherever the environment's jobs (and its build job) run, readable by their accounts.

`CORRAL_ENV_PYTHON` sets it; unset, the engine's default: on the local engine the server's base
interpreter (`sys.base_prefix`, which the local engine binds into the sandbox as root may read
it), on Slurm the system `/usr/bin/python3` (a job runs as the user's own Unix account, which
cannot read a Python under /root, and every node has /usr)."""

from __future__ import annotations

import functools
import os
import subprocess

from corral.config import Settings
from corral.environments.store import base_prefix, base_python

SLURM_DEFAULT_PYTHON = "/usr/bin/python3"
SYSTEM_PREFIX = "/usr"  # bound read-only into every sandbox by both engines


class InterpreterUnavailable(RuntimeError):
    """The configured interpreter cannot be used (missing, not executable, not a Python)."""


def configured(settings: Settings) -> str:
    """The interpreter new versions are built for (an absolute path)."""
    if settings.env_python:
        return settings.env_python
    return SLURM_DEFAULT_PYTHON if settings.engine == "slurm" else base_python()


@functools.cache
def _version_of(path: str, mtime_ns: int) -> str:
    done = subprocess.run(
        [path, "-c", "import platform; print(platform.python_version())"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    version = done.stdout.strip()
    if done.returncode != 0 or not version:
        raise InterpreterUnavailable(f"interpreter {path} did not run: {done.stderr.strip()[-300:]}")
    return version


def version(path: str) -> str:
    """Its `platform.python_version()` (part of the store's cache key), asked once per file."""
    if not os.path.isabs(path):
        raise InterpreterUnavailable(f"CORRAL_ENV_PYTHON={path!r} must be an absolute path")
    try:
        st = os.stat(path)
    except OSError as exc:
        raise InterpreterUnavailable(f"interpreter {path} is not there: {exc.strerror}") from exc
    if not os.access(path, os.X_OK):
        raise InterpreterUnavailable(f"interpreter {path} is not executable")
    return _version_of(path, st.st_mtime_ns)


def sandbox_paths(interpreter: str) -> tuple[str, ...]:
    """The dirs a job in (or building) an environment needs bound read-only at their own paths for
    the interpreter: its prefix, unless it lies below /usr (bound anyway). "" is a version from
    before the interpreter was recorded: the server's base interpreter then."""
    if not interpreter:
        return (base_prefix(),)
    real = os.path.realpath(interpreter)
    prefix = os.path.dirname(os.path.dirname(real))  # <prefix>/bin/python3.X
    if prefix == SYSTEM_PREFIX or prefix.startswith(SYSTEM_PREFIX + "/") or real.startswith("/bin/"):
        return ()
    return (prefix,)
