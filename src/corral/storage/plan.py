"""What one job gets from storage when it is launched: its uid and group gids, its binds (home,
the user's groups, the spec's mounts, the `--code` snapshot, the outputs dir) and the dirs to make
first. Built by the dispatch loop for a batch of jobs with a few queries (server/dispatch.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.config import Settings
from corral.db.models import Group, Job, Membership, User
from corral.environments.mounts import plan_environments
from corral.storage import code
from corral.storage.identities import IdRange, IdsExhausted, ensure_ids
from corral.storage.layout import StorageDir, StorageError, job_logs_dir, outputs_dir
from corral.storage.mounts import (
    SANDBOX_CODE,
    SANDBOX_OUTPUTS,
    Bind,
    MountContext,
    MountRefused,
    default_binds,
    resolve_all,
)

log = logging.getLogger("corral.storage.plan")


@dataclass(frozen=True, slots=True)
class JobStorage:
    uid: int
    gids: tuple[int, ...]
    binds: tuple[Bind, ...] = ()
    cwd: str | None = None
    home: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    refused: str = ""
    # The job's catalogue environment (corral.environments.mounts): the dir first on PATH, the
    # dirs bound read-only at their own paths, and a build job's outbound network.
    environment_bin: str = ""
    environment_paths: tuple[str, ...] = ()
    network_outbound: str = ""
    log_dir: str = ""  # the job's dir in the owner's logs dir (the `logs` source)


def id_ranges(settings: Settings) -> tuple[IdRange, IdRange]:
    uids = IdRange.parse("CORRAL_UID_RANGE", settings.uid_range)
    gids = IdRange.parse("CORRAL_GID_RANGE", settings.gid_range)
    if uids.overlaps(gids):
        raise ValueError(
            f"CORRAL_UID_RANGE {settings.uid_range} and CORRAL_GID_RANGE {settings.gid_range} overlap"
        )
    return uids, gids


def member_groups(session: Session, user_ids: Sequence[int]) -> dict[int, list[Group]]:
    rows = session.execute(
        select(Membership.user_id, Group)
        .join(Group, Group.id == Membership.group_id)
        .where(Membership.user_id.in_(set(user_ids)))
    ).all()
    out: dict[int, list[Group]] = {}
    for user_id, group in rows:
        out.setdefault(user_id, []).append(group)
    return out


def plan_jobs(session: Session, jobs: Sequence[Job], settings: Settings) -> dict[int, JobStorage]:
    """{job id: its storage}. Allocates missing uids/gids in `session` (the caller commits)."""
    if not jobs:
        return {}
    root = settings.storage_path
    groups_of = member_groups(session, [j.user_id for j in jobs])
    users: dict[int, User] = {j.user_id: j.user for j in jobs}
    all_groups = {g.id: g for gs in groups_of.values() for g in gs}
    uid_range, gid_range = id_ranges(settings)
    try:
        uids, gids = ensure_ids(session, users.values(), all_groups.values(), uid_range, gid_range)
    except IdsExhausted as exc:  # the launches fail saying so; the loop itself goes on
        log.error("storage: %s", exc)
        return {j.id: JobStorage(0, (), refused=f"storage: {exc}") for j in jobs}
    plans = {}
    contexts = {}
    for job in jobs:
        groups = groups_of.get(job.user_id, [])
        group_gids = {g.name: gids[g.id] for g in groups}
        ctx = contexts[job.id] = MountContext(
            job.user.name, frozenset(group_gids), root, job.user.is_admin, session
        )
        plans[job.id] = _plan_one(job, ctx, uids[job.user_id], group_gids)
    for job_id, env in plan_environments(session, jobs, contexts, settings).items():
        plan = plans[job_id]
        if isinstance(env, str):
            plans[job_id] = replace(plan, refused=plan.refused or env)
        elif not plan.refused:
            plans[job_id] = replace(
                plan,
                binds=(*plan.binds, *env.binds),
                environment_bin=env.bin_dir,
                environment_paths=env.paths,
                network_outbound=env.network_outbound,
            )
    return plans


def _plan_one(job: Job, ctx: MountContext, uid: int, group_gids: dict[str, int]) -> JobStorage:
    gids = tuple(sorted(group_gids.values()))
    try:
        spec_binds = resolve_all(ctx, [(m.source, m.target or "", m.mode == "ro") for m in job.spec.mounts])
        binds = default_binds(ctx, group_gids)
    except (MountRefused, StorageError) as exc:
        return JobStorage(uid, gids, refused=f"storage: {exc}")
    taken = {b.target for b in spec_binds}
    binds = [b for b in binds if b.target not in taken] + spec_binds
    env = {"CORRAL_OUTPUTS": SANDBOX_OUTPUTS}
    cwd = None
    if job.spec.code:
        snapshot = code.snapshot_dir(ctx.root, job.spec.code)
        if not snapshot.is_dir():
            return JobStorage(uid, gids, refused=f"storage: code snapshot {job.spec.code} is gone")
        binds.append(Bind(str(snapshot), SANDBOX_CODE, True, f"code/{job.spec.code}"))
        env["CORRAL_CODE"] = cwd = SANDBOX_CODE
    out = outputs_dir(ctx.root, job.id)
    binds.append(
        Bind(str(out), SANDBOX_OUTPUTS, False, "outputs", (StorageDir(str(out), "user", None, 0o700),))
    )
    home = next((b.target for b in binds if b.source == "home"), None)
    logs = str(job_logs_dir(ctx.root, ctx.user, job.id))
    return JobStorage(uid, gids, tuple(binds), cwd, home, env, log_dir=logs)
