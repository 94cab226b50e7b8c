"""`corral up --demo`: virtual GPUs when there is no NVIDIA GPU, demo users and groups, and one
example job that really trains a model (scikit-learn's digits, shipped offline). Idempotent: a
restart with the same CORRAL_HOME reuses what is there and submits nothing twice."""

from __future__ import annotations

import functools
import time
from importlib import resources

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import Group, GroupQuota, Job, Membership, User
from corral.engine.base import Engine
from corral.server.context import ServerContext
from corral.spec import JobSpecV1, parse_spec

DEMO_VIRTUAL_GPUS = 4
# name -> (password, groups with role, default group). Passwords are demo-only and printed.
DEMO_GROUPS = {"vision": 2, "nlp": 2}  # guaranteed GPUs of the demo model
DEMO_USERS: dict[str, tuple[str, dict[str, str], str]] = {
    "alice": ("alice-demo", {"vision": "admin"}, "vision"),
    "bob": ("bob-demo", {"nlp": "member"}, "nlp"),
    "carol": ("carol-demo", {"vision": "member", "nlp": "member"}, "nlp"),
}
DEMO_JOB_OWNER = "alice"


def has_nvidia_gpu() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount()) > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def demo_settings(settings: Settings) -> Settings:
    """Virtual GPUs where there is no NVIDIA GPU. Isolation is left as configured: the demo runs
    jobs sandboxed, and on a machine without bubblewrap or cgroups only a user who set
    CORRAL_ALLOW_UNISOLATED=true gets unsandboxed jobs (the banner says which it is)."""
    from corral.environments.demo import demo_env_settings

    settings = demo_env_settings(settings)  # a package index for the demo's environment
    if settings.virtual_gpus is not None or has_nvidia_gpu():
        return settings
    return settings.model_copy(update={"virtual_gpus": DEMO_VIRTUAL_GPUS})


def isolation_line(engine: Engine) -> str | None:
    """The banner's line on job isolation (local engine), with the way out when jobs cannot run."""
    from corral.engine.local.engine import LocalEngine

    if not isinstance(engine, LocalEngine):
        return None
    caps = engine.capabilities()
    if caps.refusing:
        return (
            f"NOT STARTING JOBS: {caps.summary}. Install bubblewrap (./run demo does), "
            "or set CORRAL_ALLOW_UNISOLATED=true to run jobs without the sandbox"
        )
    return caps.summary


def _ensure_groups(session: Session, model: str, now: float) -> dict[str, Group]:
    groups = {}
    for name, guaranteed in DEMO_GROUPS.items():
        group = session.scalar(select(Group).where(Group.name == name))
        if group is None:
            group = Group(name=name, created_at=now, weight=1.0, borrowing=True)
            group.quotas = [GroupQuota(gpu_model=model, guaranteed=guaranteed, max=None)]
            session.add(group)
            session.flush()
        groups[name] = group
    return groups


def _ensure_users(session: Session, groups: dict[str, Group], now: float) -> None:
    from corral.services.auth import hash_password

    for name, (password, roles, default) in DEMO_USERS.items():
        if session.scalar(select(User).where(User.name == name)) is not None:
            continue
        user = User(
            name=name,
            password_hash=hash_password(password),
            is_admin=False,
            default_group_id=groups[default].id,
            created_at=now,
            active=True,
        )
        session.add(user)
        session.flush()
        for group, role in roles.items():
            session.add(Membership(user_id=user.id, group_id=groups[group].id, role=role))


@functools.cache
def _example_spec() -> JobSpecV1:
    """The shipped example's spec (src/corral/examples/digits.yaml), as written: read and parsed
    once (callers copy it, never change it)."""
    return parse_spec(resources.files("corral.examples").joinpath("digits.yaml").read_text())


def demo_spec(settings: Settings) -> JobSpecV1:
    """The shipped example, run from a code snapshot of its script in the `sklearn` environment
    (corral.environments.demo), as `corral submit --code src/corral/examples digits.yaml` would."""
    from corral.environments.demo import example_snapshot

    return _example_spec().model_copy(update={"code": example_snapshot(settings)})


def submit_demo_job(session: Session, settings: Settings) -> int | None:
    from corral.environments.service import check_job_environment
    from corral.services.auth import load_principal
    from corral.services.jobs import submit_job
    from corral.services.policy import active_profile

    name = _example_spec().name
    if session.scalar(select(Job.id).where(Job.name == name)) is not None:
        return None
    owner = session.scalars(select(User).where(User.name == DEMO_JOB_OWNER)).one()  # _ensure_users made it
    principal = load_principal(session, owner, via="token")
    spec = check_job_environment(session, principal, demo_spec(settings))  # pinned: sklearn@1
    return submit_job(session, principal, spec, active_profile(settings))["id"]


def _submit_demo_job(ctx: ServerContext) -> None:
    with ctx.session_factory() as session:
        job_id = submit_demo_job(session, ctx.settings)
    if job_id is not None:
        print(f"  example:   job {job_id} (digits-demo) started in environment sklearn", flush=True)


def example_line(session: Session, env_ready: bool | None) -> str:
    """The banner's example line as things are (`env_ready`: the demo environment's build is done,
    None while it runs, False when it failed). Restarted on a home whose example had run, the
    banner said it "trains ... once it is built"."""
    from corral.environments.demo import DEMO_ENV

    name = _example_spec().name
    job = session.scalars(select(Job).where(Job.name == name).order_by(Job.id.desc())).first()
    if job is not None:
        if job.state in ("succeeded", "failed", "cancelled"):
            return f"job {job.id} ({name}) {job.state}; `corral show {job.id}`, `corral logs {job.id}`"
        trains = f"it trains an MLP on CPU in environment {DEMO_ENV}"
        return f"job {job.id} ({name}) {job.state}: {trains}; `corral logs {job.id}`"
    if env_ready is False:
        return f"{name} not started: environment {DEMO_ENV} failed to build; `corral env show {DEMO_ENV}`"
    when = "once it is built" if env_ready is None else "starting now"
    return f"{name} trains an MLP on CPU in environment {DEMO_ENV} {when}; `corral ls`"


def seed_demo(ctx: ServerContext, url: str) -> None:
    """Called before the API serves: the webhook secret is in place when its router starts."""
    from corral.monitor.config import generate_webhook_token

    generate_webhook_token(ctx.settings)
    now = time.time()
    with ctx.session_factory() as session:
        groups = _ensure_groups(session, ctx.settings.gpu_model, now)
        _ensure_users(session, groups, now)
        session.commit()
    from corral.environments.demo import DEMO_ENV, ensure_demo_environment, ready, submit_when_ready

    env_version = ensure_demo_environment(ctx, DEMO_JOB_OWNER)
    submit_when_ready(ctx, lambda: _submit_demo_job(ctx))
    ctx.wake("schedule")
    gpus = ctx.settings.virtual_gpus
    print("", flush=True)
    print("Corral demo", flush=True)
    print(f"  home:      {ctx.settings.home}", flush=True)
    isolation = isolation_line(ctx.engine)
    if isolation is not None:
        print(f"  isolation: {isolation}", flush=True)
    if gpus:
        print(f"  GPUs:      {gpus} virtual {ctx.settings.gpu_model} (no NVIDIA GPU found)", flush=True)
    print("  users (password): " + ", ".join(f"{u} ({p[0]})" for u, p in DEMO_USERS.items()), flush=True)
    print(
        "  groups:    " + ", ".join(f"{g} ({n} GPUs guaranteed)" for g, n in DEMO_GROUPS.items()), flush=True
    )
    envs = f"default (the server's) and {DEMO_ENV}" + (" (building now)" if env_version else "")
    print(f"  envs:      {envs}; `corral env ls`", flush=True)
    with ctx.session_factory() as session:
        print(f"  example:   {example_line(session, ready(ctx))}", flush=True)
    print(f"  look:      `corral ls`, `corral node ls`, portal {url}/, API {url}/docs", flush=True)
    print("", flush=True)
