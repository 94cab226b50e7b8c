"""Interactive workspaces (corral.services.workspaces, migration 0014_workspaces).

A workspace is a named, persistent object of one user; each start submits a job of kind
`workspace` (`current_job_id`), so job states stay final: stop ends that job, start makes a new
one. The user's files live in their home (corral.storage) and outlive every job and the workspace.
"""

from __future__ import annotations

from sqlalchemy import Float, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column

from corral.db.base import Base


class Workspace(Base):
    __tablename__ = "workspaces"
    __table_args__ = (
        UniqueConstraint("user_id", "name"),
        # SQLite: AUTOINCREMENT, so a removed workspace's id is never given again: it is in the
        # JupyterLab URL (/ws/<id>/lab), its jobs' specs and the audit log. Migration
        # 0033_workspace_ids. PostgreSQL's sequence never reuses ids.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    gpus: Mapped[int] = mapped_column(Integer)
    gpu_model: Mapped[str | None] = mapped_column(String(256))
    cpus: Mapped[float] = mapped_column(Float)
    memory_mib: Mapped[int] = mapped_column(Integer)
    environment: Mapped[str] = mapped_column(String(256))
    idle_timeout_s: Mapped[float | None] = mapped_column(Float)  # None: the group's default
    # The job of the latest start; a finished job stays here (the workspace is stopped) until the
    # next start. SET NULL: retention may delete a finished job.
    current_job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), index=True, unique=True
    )
    # JupyterLab's credential for the current job, set by Corral at each start and given to the job
    # like a secret (never in its spec, an API answer or a log); the proxy sends it upstream.
    jupyter_token: Mapped[str] = mapped_column(String(64))
    reclaimed_gpu_hours: Mapped[float] = mapped_column(Float, default=0.0)  # by idle stops
    # When a session (SSH gateway, exec, port-forward) into the current job was last open, as the
    # server holding it wrote (corral.services.session_use, migration 0019); idle reclamation reads it.
    last_used_at: Mapped[float | None] = mapped_column(Float)
    # When the idle policy stopped the current job (corral.monitor.idle, in the transaction that
    # requested its cancel); cleared by the next start. `corral ws ls/show` read it (migration
    # 0028_workspace_idle_stopped, which filled it from the idle stops' job events).
    idle_stopped_at: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)


class WorkspaceGroupPolicy(Base):
    """An admin's idle timeouts for one group's workspaces (absent: the server's defaults)."""

    __tablename__ = "workspace_group_policies"

    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), primary_key=True)
    default_idle_timeout_s: Mapped[float | None] = mapped_column(Float)
    max_idle_timeout_s: Mapped[float | None] = mapped_column(Float)


class WorkspacePass(Base):
    """A browser's way onto the workspace origin (corral.services.workspace_passes, migration
    0039_workspace_passes). A `ticket` is made by the portal's `/ws/<id>/` for its logged-in owner
    and lives seconds; the workspace listener redeems it once (compare-and-set on kind and hash)
    and the same row becomes the `cookie` of that workspace origin, valid while the portal session
    it came from is. Only hashes of the secrets are stored. Deleted with its session (a logout or
    revoke ends the workspace cookie too) and with its workspace."""

    __tablename__ = "workspace_passes"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)  # sha256 of the ticket or cookie
    kind: Mapped[str] = mapped_column(String(8))  # "ticket" | "cookie"
    workspace_id: Mapped[int] = mapped_column(ForeignKey("workspaces.id", ondelete="CASCADE"), index=True)
    session_hash: Mapped[str] = mapped_column(
        ForeignKey("web_sessions.id_hash", ondelete="CASCADE"), index=True
    )
    # A ticket's destination: a path under its workspace's `/ws/<id>/` (with its query), so the
    # handoff can send the browser nowhere else. Empty for a cookie.
    path: Mapped[str] = mapped_column(String(2048))
    # A ticket's browser: sha256 of the state secret in the cookie the workspace origin set in the
    # browser that asked for it; the redeem must present it. None for a cookie.
    state_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float] = mapped_column(Float)
