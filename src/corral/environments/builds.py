"""The environments' background loops, leased singletons like the others (collected by
corral.server.runner through EXTRA_LOOP_MODULES):

- `env-builds` (every 1 s): each version still `building` whose build job has ended is settled.
  A succeeded build's lock is read from the job's outputs and hashed in the build's cache domain
  (buildstep.cache_keys: the submitter's own, or `shared` for an admin's build); when the store
  holds its own key, or for a user's build the shared one, the version shares that copy (a cache
  hit), else the job's venv is moved into the store under its own key (store.ingest). What a
  user's build job wrote is never another user's, nor an admin's, cache hit. A failed,
  cancelled or lost build fails the version with the tail of the build log in `error` (the whole
  log stays with the job). Nothing is registered half: a version is `ready` only with its copy
  in the store.
- `env-gc` (every 60 s): store copies no version names any more are removed (store.gc), never
  while a build is running (it may just have found its key there).
"""

from __future__ import annotations

import logging
import os
import stat
import time
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.environment_models import EnvironmentVersion
from corral.db.models import Job
from corral.engine.base import Engine
from corral.environments import store
from corral.environments.buildstep import (
    CACHE_DOMAIN_ENV,
    HIT_MARKER,
    LOCK_FILE,
    PYTHON_FILE,
    VENV_DIR,
    cache_domain,
    cache_keys,
)
from corral.environments.service import BUILDING, FAILED, READY
from corral.server.context import BackgroundLoop, ServerContext
from corral.services.lifecycle import JobState
from corral.storage.layout import outputs_dir

log = logging.getLogger("corral.environments.builds")
BUILDS_INTERVAL_S = 1.0
GC_INTERVAL_S = 60.0
GC_MIN_AGE_S = 600.0
ORPHAN_AFTER_S = 120.0  # a version whose build job never got submitted (a crash in between)
MAX_LOCK_BYTES = 1024 * 1024
LOG_TAIL_BYTES = 4000


def settle_builds(session: Session, root: Path, engine: Engine | None, now: float) -> int:
    """Settle every version whose build has ended; commits each. Returns how many."""
    rows = session.execute(
        select(EnvironmentVersion, Job)
        .outerjoin(Job, Job.id == EnvironmentVersion.build_job_id)
        .where(EnvironmentVersion.state == BUILDING)
    ).all()
    settled = 0
    for version, job in rows:
        if job is None:
            if now - version.created_at < ORPHAN_AFTER_S:
                continue
            _fail(version, "the build job is gone (deleted, or never submitted)", now)
        elif not JobState(job.state).terminal:
            continue
        elif job.state == JobState.SUCCEEDED.value:
            _settle_success(version, job, root, now)
        else:
            tail = _log_tail(engine, job)
            _fail(version, f"build job {job.id} {job.state}: {job.reason}\n{tail}".strip(), now)
        if job is not None:
            _discard_venv(root, job.id)
        session.commit()
        settled += 1
        log.info("environment version %s: %s", version.id, version.state)
    return settled


def _fail(version: EnvironmentVersion, error: str, now: float) -> None:
    version.state, version.error, version.built_at = FAILED, error, now


def _settle_success(version: EnvironmentVersion, job: Job, root: Path, now: float) -> None:
    out = outputs_dir(root, job.id)
    lock = _read_plain(out / LOCK_FILE)
    if lock is None:
        _fail(version, f"build job {job.id} left no {LOCK_FILE} in its outputs", now)
        return
    seen = (_read_plain(out / PYTHON_FILE) or "").strip()
    if seen and seen != version.python:
        where = version.interpreter or "the server's base interpreter"
        _fail(
            version,
            f"build job {job.id} ran {where} as Python {seen}, but this server's is {version.python}: "
            "the interpreter must be the same on the server and every node",
            now,
        )
        return
    keys = cache_keys(version.python, lock, build_domain(job))
    found = next((k for k in keys if store.copy_dir(root, k).is_dir()), None)
    key, hit = (found, True) if found is not None else (keys[0], False)
    venv = out / VENV_DIR
    if not hit:
        if not _plain_dir(venv):
            claimed = "a cache hit" if (out / HIT_MARKER).exists() else "no environment"
            _fail(version, f"build job {job.id} found {claimed}, and the store has no {key} now", now)
            return
        try:
            hit = not store.ingest(root, key, venv)
        except NotADirectoryError:
            _fail(version, f"build job {job.id} left no environment: its venv is not a directory", now)
            return
    version.state, version.lock, version.cache_key, version.cache_hit = READY, lock, key, hit
    version.built_at = now


def build_domain(job: Job) -> str:
    """The build's cache domain, as the server wrote it into the build job's spec at submit; a
    build queued before domains existed gets its submitter's (by their admin role now)."""
    domain = job.spec.env.get(CACHE_DOMAIN_ENV)
    return domain or cache_domain(job.user_id, job.user.is_admin)


def _read_plain(path: Path) -> str | None:
    """A regular file the job wrote, never through a symlink, at most MAX_LOCK_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return f.read(MAX_LOCK_BYTES).decode("utf-8", errors="replace")


def _plain_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _discard_venv(root: Path, job_id: int) -> None:
    venv = outputs_dir(root, job_id) / VENV_DIR
    if _plain_dir(venv):
        store.remove_tree(venv)


def _log_tail(engine: Engine | None, job: Job) -> str:
    if engine is None or not job.attempts:
        return ""
    try:
        chunk = engine.logs(job.attempts[-1].attempt_id, instance=0, offset=0, limit=1 << 20)
    except Exception as exc:  # the log is a courtesy here: the job keeps it
        return f"(log unavailable: {exc})"
    return chunk.data[-LOG_TAIL_BYTES:].decode("utf-8", errors="replace")


def builds_tick(ctx: ServerContext, now: float) -> None:
    with ctx.session_factory() as session:
        settle_builds(session, ctx.settings.storage_path, ctx.engine, now)


def gc_tick(ctx: ServerContext, now: float) -> None:
    with ctx.session_factory() as session:
        building = select(EnvironmentVersion.id).where(EnvironmentVersion.state == BUILDING)
        if session.scalar(building.limit(1)) is not None:
            return
        keys = session.scalars(
            select(EnvironmentVersion.cache_key).where(EnvironmentVersion.cache_key.is_not(None))
        )
        referenced = {k for k in keys if k}
    removed = store.gc(ctx.settings.storage_path, referenced, min_age_s=GC_MIN_AGE_S, now=time.time())
    if removed:
        log.info("environments: removed %d unreferenced store copies: %s", len(removed), removed)


LOOPS: list[BackgroundLoop] = [
    BackgroundLoop("env-builds", BUILDS_INTERVAL_S, builds_tick),
    BackgroundLoop("env-gc", GC_INTERVAL_S, gc_tick),
]
