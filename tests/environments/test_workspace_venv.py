"""The Python a workspace runs JupyterLab with on the Slurm engine (CORRAL_WORKSPACE_VENV,
corral.environments.mounts.workspace_environment): a venv the job accounts can read is bound
with its base interpreter; one they cannot reach, or a path that is no venv, is refused naming
what is wrong and what to set."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from corral.config import Settings
from corral.environments.mounts import EnvironmentLaunch, workspace_environment
from tests.support import dir_for_job_accounts


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A dir every account may pass (pytest's own tmp dirs are 0700)."""
    with dir_for_job_accounts("corral-wsvenv-", mode=0o755) as path:
        yield path


def fake_venv(where: Path, home: str) -> Path:
    venv = where / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/usr/bin/python3")
    (venv / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = false\n")
    for d in (venv, venv / "bin"):
        os.chmod(d, 0o755)
    return venv


def settings_for(tmp: Path, venv: Path | None) -> Settings:
    return Settings(home=tmp / "home", engine="slurm", workspace_venv=venv)


def test_a_readable_venv_is_bound_with_its_base_interpreter(open_dir: Path, tmp_path: Path) -> None:
    venv = fake_venv(open_dir, "/usr/bin")
    env = workspace_environment(settings_for(tmp_path, venv))
    assert env == EnvironmentLaunch(bin_dir=f"{venv}/bin", paths=(str(venv),))  # /usr: in every sandbox
    base = open_dir / "opt-python"
    (base / "bin").mkdir(parents=True)
    os.chmod(base, 0o755)
    (venv / "pyvenv.cfg").write_text(f"home = {base}/bin\n")
    env = workspace_environment(settings_for(tmp_path, venv))
    assert isinstance(env, EnvironmentLaunch) and env.paths == (str(venv), str(base)), env


def test_a_venv_the_job_accounts_cannot_reach_is_refused(open_dir: Path, tmp_path: Path) -> None:
    closed = open_dir / "private"
    closed.mkdir(mode=0o700)
    venv = fake_venv(closed, "/usr/bin")
    why = workspace_environment(settings_for(tmp_path, venv))
    assert isinstance(why, str), why
    assert f"({closed} is not open to other users)" in why and "CORRAL_WORKSPACE_VENV" in why, why
    os.chmod(closed, 0o711)  # passable, but the venv's base interpreter is not
    (venv / "pyvenv.cfg").write_text(f"home = {closed}/python/bin\n")
    (closed / "python" / "bin").mkdir(parents=True)
    os.chmod(closed / "python", 0o700)
    why = workspace_environment(settings_for(tmp_path, venv))
    assert isinstance(why, str) and f"{closed}/python cannot be read" in why, why


def test_a_path_that_is_no_venv_is_refused(open_dir: Path, tmp_path: Path) -> None:
    why = workspace_environment(settings_for(tmp_path, open_dir))
    expected = f"CORRAL_WORKSPACE_VENV {open_dir} is not a Python venv (no bin/python or pyvenv.cfg)"
    assert why == f"workspace: {expected}"
