"""The demo's environments (`corral up --demo`): besides the server's own ("default"), an
official, public `sklearn` environment built like any other, by a build job of the demo user,
from the wheels scripts/setup.sh fetched into `<venv>/wheelhouse` (offline; else the package
index pip uses). The digits example runs in it from a code snapshot of its script, submitted
once the environment is ready."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from sqlalchemy import select

from corral.config import Settings
from corral.db.environment_models import Environment, EnvironmentVersion
from corral.db.models import User
from corral.environments import service
from corral.server.context import ServerContext
from corral.storage import code

log = logging.getLogger("corral.environments.demo")
DEMO_ENV = "sklearn"
DEMO_REQUIREMENTS = "numpy==2.4.6\nscikit-learn==1.9.1\n"  # the server's own pins
EXAMPLE_SCRIPT = "train_digits.py"
READY_WAIT_S = 1800.0


def wheelhouse() -> Path:
    return Path(sys.prefix) / "wheelhouse"


def demo_env_settings(settings: Settings) -> Settings:
    """A package index for the demo's builds when the admin gave none: the wheelhouse when
    setup fetched it, else pip's index (PIP_INDEX_URL, default PyPI)."""
    if settings.env_index_url or settings.env_find_links is not None:
        return settings
    if any(wheelhouse().glob("*.whl")):
        return settings.model_copy(update={"env_find_links": wheelhouse()})
    index = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    return settings.model_copy(update={"env_index_url": index})


def ensure_demo_environment(ctx: ServerContext, owner_name: str) -> int | None:
    """Queue the `sklearn` build as `owner_name` unless the environment exists; its version."""
    from corral.services.auth import load_principal
    from corral.services.policy import active_profile

    with ctx.session_factory() as session:
        if session.scalar(select(Environment.id).where(Environment.name == DEMO_ENV)) is not None:
            return None
        owner = session.scalars(select(User).where(User.name == owner_name)).one()
        principal = load_principal(session, owner, via="token")
        req = service.CreateRequest(
            name=DEMO_ENV,
            source=DEMO_REQUIREMENTS,
            visibility="public",
            description="numpy and scikit-learn, for the digits example",
        )
        view = service.create(session, principal, ctx.settings, active_profile(ctx.settings), req)
        env = session.scalars(select(Environment).where(Environment.name == DEMO_ENV)).one()
        env.official = True  # curated: the demo seeds it as the admin would
        session.commit()
        return int(view["version"])


def example_snapshot(settings: Settings) -> str:
    """A `--code` snapshot of the digits script, as `corral submit --code` would upload it."""
    data = resources.files("corral.examples").joinpath(EXAMPLE_SCRIPT).read_bytes()
    sha = hashlib.sha256(data).hexdigest()
    root = settings.storage_path
    if sha in code.missing(root, [sha]):
        code.receive_chunk(root, sha, 0, data, True, settings.code_max_bytes)
    manifest: dict[str, dict[str, object]] = {EXAMPLE_SCRIPT: {"sha256": sha, "executable": False}}
    return code.make_snapshot(root, manifest, settings.code_max_bytes, settings.code_max_files)


def ready(ctx: ServerContext) -> bool | None:
    """True once a version is ready, False when every build failed, None while one runs."""
    with ctx.session_factory() as session:
        states = set(
            session.scalars(
                select(EnvironmentVersion.state)
                .join(Environment, Environment.id == EnvironmentVersion.environment_id)
                .where(Environment.name == DEMO_ENV)
            )
        )
    if service.READY in states:
        return True
    return None if service.BUILDING in states else False


def submit_when_ready(ctx: ServerContext, submit: Callable[[], object]) -> threading.Thread:
    """Run `submit()` once the environment is ready (a daemon thread; the demo only)."""

    def wait() -> None:
        deadline = time.monotonic() + READY_WAIT_S
        while time.monotonic() < deadline:
            state = ready(ctx)
            if state is True:
                submit()
                ctx.wake("schedule")
                return
            if state is False:
                log.error("demo: environment %s failed to build; `corral env show %s`", DEMO_ENV, DEMO_ENV)
                return
            time.sleep(1.0)

    thread = threading.Thread(target=wait, name="demo-env-wait", daemon=True)
    thread.start()
    return thread
