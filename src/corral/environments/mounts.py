"""Environments as a mount source of the storage layer (corral.storage.mounts): `env/<name>[@v]`,
always read-only, at /env/<name>. A job's `environment:` (pinned at submit to `<name>@<v>`) is
resolved through it at launch, so a user who lost the right to it gets a refused launch; the
engines bind it read-only, bind the interpreter it was built for (its recorded `interpreter`) at
its own path, and put its bin/ first on PATH (`EnvironmentLaunch`). A build job gets the published
build tools (corral.environments.tools), the store (its cache check) and the admin's find-links
dir read-only, and the outbound network its package index needs (local engine; on Slurm a job
has the node's network, docs/catalogues.md)."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from corral.config import Settings
from corral.db.environment_models import EnvironmentVersion
from corral.db.models import Group, Job, User
from corral.environments import interpreter, service
from corral.environments.store import (
    BUILD_FIND_LINKS,
    BUILD_STORE,
    DEFAULT_ENVIRONMENT,
    SANDBOX_ENV,
    copy_dir,
    ensure_store,
)
from corral.environments.tools import BUILD_TOOLS, tools_dir
from corral.storage.mounts import Bind, MountContext, MountRefused, MountRequest, register_source

PREFIX = "env"


@dataclass(frozen=True, slots=True)
class EnvironmentLaunch:
    """What the engines need beyond the binds: the dir put first on PATH (a path in the job),
    dirs bound read-only at their own paths (the interpreter), the network exception."""

    bin_dir: str
    paths: tuple[str, ...]
    binds: tuple[Bind, ...] = ()
    network_outbound: str = ""  # "internet": a build job reaching the admin's package index


def resolve_env(ctx: MountContext, req: MountRequest) -> Bind:
    return _resolve(ctx, req)[0]


def _resolve(ctx: MountContext, req: MountRequest) -> tuple[Bind, EnvironmentVersion]:
    if ctx.session is None:
        raise MountRefused(f"mount source {req.source!r}: environments need the database to resolve")
    if not req.readonly:
        raise MountRefused(f"mount source {req.source!r}: environments are read-only; use mode: ro")
    session = ctx.session
    user = session.scalar(select(User).where(User.name == ctx.user))
    if user is None:
        raise MountRefused(f"mount source {req.source!r}: no user {ctx.user!r}")
    group_ids = (
        set(session.scalars(select(Group.id).where(Group.name.in_(ctx.groups)))) if ctx.groups else set()
    )
    try:
        env, version = service.resolve_ready(session, user.id, group_ids, ctx.is_admin, req.ref)
    except service.EnvRefError as exc:
        raise MountRefused(f"mount source {req.source!r}: {exc}") from exc
    assert version.cache_key is not None  # ready versions have one
    path = copy_dir(ctx.root, version.cache_key)
    if not path.is_dir():
        raise MountRefused(f"mount source {req.source!r}: its files are gone from the store")
    bind = Bind(
        host_path=str(path),
        target=req.target or f"{SANDBOX_ENV}/{env.name}",
        readonly=True,
        source=f"{PREFIX}/{env.name}@{version.version}",
    )
    return bind, version


register_source(PREFIX, resolve_env)


def server_environment() -> EnvironmentLaunch:
    """The server's own venv and source tree (no longer what a build job runs: that is the
    published tools on the version's interpreter; kept for jobs that need Corral itself)."""
    import corral

    paths: list[str] = []
    src = str(Path(corral.__file__).resolve().parents[1])
    for p in (sys.prefix, sys.base_prefix, src):
        real = os.path.realpath(p)
        if (
            real == "/usr"
            or real.startswith("/usr/")
            or any(real == q or real.startswith(q + "/") for q in paths)
        ):
            continue
        paths.append(real)
    return EnvironmentLaunch(bin_dir=f"{sys.prefix}/bin", paths=tuple(paths))


# The interpreter of the environment version a job builds (NULL: the job builds none), as a
# column of a read of jobs: the launch claim takes it with the scheduled jobs (server/dispatch.py)
# instead of a read of its own.
BUILD_INTERPRETER = (
    select(EnvironmentVersion.interpreter)
    .where(EnvironmentVersion.build_job_id == Job.id)
    .order_by(EnvironmentVersion.id.desc())
    .limit(1)
    .correlate(Job)
    .scalar_subquery()
)


def plan_environments(
    jobs: Sequence[Job],
    contexts: Mapping[int, MountContext],
    settings: Settings,
    builds: Mapping[int, str],
) -> dict[int, EnvironmentLaunch | str]:
    """{job id: its environment launch, or why it may not run}; jobs in the default environment
    that are not builds are left out. `builds`: {job id: interpreter} of the build jobs among
    `jobs`, as the caller read them in this transaction (BUILD_INTERPRETER, with the jobs)."""
    out: dict[int, EnvironmentLaunch | str] = {}
    for job in jobs:
        ctx = contexts.get(job.id)
        if ctx is None:
            continue
        if job.id in builds:
            out[job.id] = _build_launch(ctx, settings, builds[job.id])
        elif job.spec.environment == DEFAULT_ENVIRONMENT:  # the server's own, except here
            if job.spec.kind == "workspace" and settings.engine == "slurm":
                out[job.id] = workspace_environment(settings)
        else:
            try:
                bind, version = _resolve(
                    ctx, MountRequest(f"{PREFIX}/{job.spec.environment}", job.spec.environment, "", True)
                )
            except MountRefused as exc:
                out[job.id] = f"environment: {exc}"
                continue
            paths = interpreter.sandbox_paths(version.interpreter)
            out[job.id] = EnvironmentLaunch(f"{bind.target}/bin", paths, (bind,))
    return out


def venv_environment(venv: Path) -> EnvironmentLaunch | str:
    """A venv as a job's environment: its bin/ first on PATH; the venv and the interpreter it was
    made from (pyvenv.cfg `home`, unless under /usr, which every sandbox has) bound read-only."""
    venv = Path(os.path.realpath(venv))  # bound at its real path: PATH must name that one
    cfg = venv / "pyvenv.cfg"
    if not (venv / "bin" / "python").exists() or not cfg.is_file():
        return f"CORRAL_WORKSPACE_VENV {venv} is not a Python venv (no bin/python or pyvenv.cfg)"
    home = next(
        (
            line.split("=", 1)[1].strip()
            for line in cfg.read_text().splitlines()
            if line.split("=")[0].strip() == "home"
        ),
        "/usr/bin",
    )
    base = os.path.realpath(os.path.dirname(home.rstrip("/")) or "/usr")
    paths = [str(venv)]
    if base != "/usr" and not base.startswith("/usr/"):
        paths.append(base)
    return EnvironmentLaunch(bin_dir=f"{venv}/bin", paths=tuple(paths))


def workspace_environment(settings: Settings) -> EnvironmentLaunch | str:
    """The Python a workspace on the Slurm engine runs JupyterLab with, or why it cannot: the job
    runs as the user's Unix account on a node and must read it (the server's own venv often lives
    below a home such as /root, 0700). The check is made here, on the server's host, which must
    see the same paths as the nodes."""
    env = venv_environment(settings.workspace_venv) if settings.workspace_venv else server_environment()
    if isinstance(env, str):
        return f"workspace: {env}"
    for path in env.paths:
        closed = _closed_to_others(Path(path))
        if closed is not None:
            return (
                f"workspace: its Python environment {path} cannot be read by the job's Unix account "
                f"({closed} is not open to other users); set CORRAL_WORKSPACE_VENV to a venv "
                "with Corral and jupyterlab on storage the nodes share (docs/workspaces.md)"
            )
    return env


def _closed_to_others(path: Path) -> Path | None:
    """The first of `path`'s parents that others may not pass (no o+x), or `path` itself when
    they may not read it (o+rx); None when it is open."""
    try:
        for parent in reversed(path.parents):
            if not os.stat(parent).st_mode & 0o001:
                return parent
        return None if os.stat(path).st_mode & 0o005 == 0o005 else path
    except OSError:  # gone: nobody reads it
        return path


def _build_launch(ctx: MountContext, settings: Settings, python: str) -> EnvironmentLaunch:
    """A build job: the published tools (its PATH's first dir), the store and the admin's wheels,
    read-only; its interpreter's dirs; outbound network for the admin's index (local engine)."""
    binds = [
        Bind(str(tools_dir(ctx.root)), BUILD_TOOLS, True, "env/tools"),
        Bind(str(ensure_store(ctx.root)), BUILD_STORE, True, "env/store"),
    ]
    if settings.env_find_links is not None:
        binds.append(Bind(str(settings.env_find_links), BUILD_FIND_LINKS, True, "env/find-links"))
    outbound = "internet" if settings.env_index_url else ""
    return EnvironmentLaunch(BUILD_TOOLS, interpreter.sandbox_paths(python), tuple(binds), outbound)
