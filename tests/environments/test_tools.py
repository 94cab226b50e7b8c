"""What build jobs run, on its own: the build step and uv published on the storage root under
content-hashed names, read-only and root's, once; the interpreter choice (its default per engine,
a missing one refused by name, the dirs a sandbox must bind for it); and the env-builds loop
failing a build that ran another Python than the version records (SQLite, no server)."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from corral.config import Settings
from corral.db.environment_models import Environment, EnvironmentVersion
from corral.db.models import Base, Group, Job, User
from corral.environments import buildstep, interpreter, tools
from corral.environments.builds import settle_builds
from corral.environments.store import base_prefix, base_python
from corral.spec import parse_spec
from corral.storage.layout import ensure_layout, outputs_dir


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


def _building_version(tmp_path: Path, seen_python: str) -> tuple[Session, EnvironmentVersion, Path]:
    """A version whose build job succeeded and left a lock, a venv and the Python it saw."""
    tmp_path.mkdir(parents=True)
    db = sa.create_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    Base.metadata.create_all(db)
    session = sessionmaker(bind=db, expire_on_commit=False)()
    now = time.time()
    user, group = User(name="alice", created_at=now), Group(name="g", created_at=now)
    session.add_all([user, group])
    session.flush()
    spec = parse_spec({"name": "env-build", "command": "true"})
    job = Job(
        name="b", user_id=user.id, group_id=group.id, state="succeeded", spec=spec, submitted_at=now,
        updated_at=now,
    )  # fmt: skip
    env = Environment(name="tpkg", owner_id=user.id, visibility="private", official=False, created_at=now)
    session.add_all([job, env])
    session.flush()
    version = EnvironmentVersion(
        environment_id=env.id, version=1, state="building", source_kind="requirements", source="x\n",
        python="3.11.2", interpreter="/usr/bin/python3", build_job_id=job.id, created_by="alice",
        created_at=now,
    )  # fmt: skip
    session.add(version)
    session.commit()
    root = tmp_path / "storage"
    ensure_layout(root, "local")
    out = outputs_dir(root, job.id)
    (out / buildstep.VENV_DIR / "bin").mkdir(parents=True)
    (out / buildstep.LOCK_FILE).write_text("corraltestpkg==1.0\n")
    (out / buildstep.PYTHON_FILE).write_text(seen_python + "\n")
    return session, version, root


def test_a_build_on_another_python_fails_and_the_same_one_is_ingested(tmp_path: Path) -> None:
    session, version, root = _building_version(tmp_path / "other", "3.12.1")
    assert settle_builds(session, root, None, time.time()) == 1
    assert version.state == "failed" and version.cache_key is None
    assert "ran /usr/bin/python3 as Python 3.12.1, but this server's is 3.11.2" in version.error
    assert not (root / "env" / "store").exists() or os.listdir(root / "env" / "store") == []

    session, version, root = _building_version(tmp_path / "same", "3.11.2")
    assert settle_builds(session, root, None, time.time()) == 1
    assert version.state == "ready", version.error
    # Its spec names no cache domain (a build queued before domains): its submitter's, alice's (id 1)
    assert version.cache_key == buildstep.cache_key("3.11.2", "corraltestpkg==1.0\n", "user-1")
    assert (root / "env" / "store" / version.cache_key / "bin").is_dir()
