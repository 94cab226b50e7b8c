"""What build jobs run, on its own: the build step and uv published on the storage root under
content-hashed names, read-only and root's, once; and the interpreter choice (its default per
engine, a missing one refused by name, the dirs a sandbox must bind for it)."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

import pytest

from corral.config import Settings
from corral.environments import buildstep, interpreter, tools
from corral.environments.store import base_prefix, base_python


def test_publish_is_content_addressed_read_only_and_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "storage"
    root.mkdir()
    names = tools.publish(root)
    directory = root / "env" / "tools"
    step = Path(buildstep.__file__).read_bytes()
    assert names.buildstep == f"buildstep-{hashlib.sha256(step).hexdigest()[:16]}.py"
    assert (directory / names.buildstep).read_bytes() == step
    assert names.uv.startswith("uv-") and os.access(directory / names.uv, os.X_OK)
    assert sorted(os.listdir(directory)) == sorted([names.buildstep, names.uv])  # no .incoming-* left
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(directory / names.buildstep).st_mode) == 0o444
    assert stat.S_IMODE(os.stat(directory / names.uv).st_mode) == 0o555
    before = os.stat(directory / names.uv).st_mtime_ns
    assert tools.publish(root) == names  # the same bytes: the same names, nothing rewritten
    assert os.stat(directory / names.uv).st_mtime_ns == before


def test_interpreter_default_per_engine_and_missing_ones_refused() -> None:
    assert interpreter.configured(Settings(engine="slurm")) == "/usr/bin/python3"
    assert interpreter.configured(Settings(engine="local")) == base_python()
    assert interpreter.configured(Settings(engine="slurm", env_python="/opt/py/bin/python3")) == (
        "/opt/py/bin/python3"
    )
    assert interpreter.version(sys.executable) == ".".join(map(str, sys.version_info[:3]))
    with pytest.raises(interpreter.InterpreterUnavailable, match="/nonexistent/python3 is not there"):
        interpreter.version("/nonexistent/python3")
    with pytest.raises(interpreter.InterpreterUnavailable, match="must be an absolute path"):
        interpreter.version("python3")


def test_sandbox_paths_bind_only_what_usr_does_not_cover() -> None:
    assert interpreter.sandbox_paths("/usr/bin/python3") == ()  # /usr is bound in every sandbox
    assert interpreter.sandbox_paths("") == (base_prefix(),)  # versions from before 0016
    real = os.path.realpath(base_python())
    expected = () if real.startswith("/usr/") else (os.path.dirname(os.path.dirname(real)),)
    assert interpreter.sandbox_paths(base_python()) == expected
