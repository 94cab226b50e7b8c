"""When each job was last entered through this server: SSH gateway channels (shell, command,
scp/sftp, `ssh -L`) and `corral exec` / `corral port-forward` WebSocket sessions.

Idle reclamation (corral.monitor.idle) counts a workspace's use beside its JupyterLab's activity.
A session counts while it is open (its last use is "now") and after it closes (its close time),
so a short `ssh ws cmd` or an scp between two idle checks is seen. The record is per process;
`persist` writes it to the workspace row (`Workspace.last_used_at`: the `session-use` loop on
every server, every 30 s and at once after a close) so that the server running the idle check
sees sessions held by another server's gateway or API too.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from corral.db.workspace_models import Workspace

FORGET_CLOSED_S = 24 * 3600.0  # a closed session's time is kept this long (then the DB has it)


class SessionUse:
    """Thread-safe: the gateway's event loop, the API's WebSocket handlers and the loops share it."""

    def __init__(self, on_close: Callable[[], None] | None = None) -> None:
        # Called after a close (the server wakes its session-use loop: a close is persisted at
        # once, an open session at the loop's interval).
        self.on_close = on_close
        self._lock = threading.Lock()
        self._open: Counter[int] = Counter()
        self._closed_at: dict[int, float] = {}  # job id -> when its last open session closed
        self._persisted: dict[int, float] = {}  # job id -> the last use written to the database

    def opened(self, job_id: int) -> None:
        with self._lock:
            self._open[job_id] += 1

    def closed(self, job_id: int, now: float) -> None:
        with self._lock:
            self._open[job_id] -= 1
            if self._open[job_id] <= 0:
                del self._open[job_id]
            self._closed_at[job_id] = now
        if self.on_close is not None:
            self.on_close()

    def open_counts(self) -> dict[int, int]:
        """{job id: sessions open into it now}."""
        with self._lock:
            return dict(self._open)

    def last_use(self, now: float) -> dict[int, float]:
        """{job id: when last used}: `now` for a job with an open session, else the time its last
        one closed."""
        with self._lock:
            return {**self._closed_at, **dict.fromkeys(self._open, now)}

    def persist(self, session: Session, now: float) -> int:
        """Write the last uses newer than what this process wrote before to their workspaces
        (never moving a workspace's time back); returns how many were newer. Commits."""
        with self._lock:
            for job_id, at in list(self._closed_at.items()):
                if job_id not in self._open and now - at > FORGET_CLOSED_S:
                    del self._closed_at[job_id]
                    self._persisted.pop(job_id, None)
        due = {j: at for j, at in self.last_use(now).items() if at > self._persisted.get(j, float("-inf"))}
        if not due:
            return 0
        for job_id, at in due.items():
            session.execute(
                update(Workspace)
                .where(Workspace.current_job_id == job_id)
                .where(or_(Workspace.last_used_at.is_(None), Workspace.last_used_at < at))
                .values(last_used_at=at)
            )
        session.commit()
        with self._lock:
            self._persisted.update(due)
        return len(due)


def persisted_use(session: Session, job_ids: Sequence[int]) -> Mapping[int, float]:
    """{workspace job id: its last session use any server wrote} for the ids given."""
    rows = session.execute(
        select(Workspace.current_job_id, Workspace.last_used_at).where(
            Workspace.current_job_id.in_(list(job_ids)), Workspace.last_used_at.is_not(None)
        )
    )
    return {job_id: at for job_id, at in rows if job_id is not None and at is not None}
