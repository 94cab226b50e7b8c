"""Chaos for nodes and jobs: `corral chaos node down|up NODE` silences a node's heartbeats;
`corral chaos job oom JOB` ends a job's attempt as an out-of-memory kill (`inject_job_oom`).

A silenced node's reports are dropped by the node loop (server/nodes.py) as if they never
arrived, so the node goes through exactly what a crashed or cut-off node goes through: after
the heartbeat timeout it is marked down and the work on it is settled as lost; `up` lets its
reports through again and the next one brings it back. The list lives in a file under
CORRAL_HOME (`chaos/silenced_nodes.json`), like the GPU fault file, so the CLI (`--home`) and
every server sharing that home see the same thing.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from corral.db.diag_models import AttemptFault
from corral.db.models import Attempt, Job
from corral.services.errors import Conflict, NotFound
from corral.services.lifecycle import AttemptState, record_event

log = logging.getLogger(__name__)


def silenced_path(home: Path) -> Path:
    return home / "chaos" / "silenced_nodes.json"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Serialise writers (CLI, API, two servers) on a lock file next to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def silenced_nodes(home: Path) -> frozenset[str]:
    """Names of the nodes whose heartbeats are being dropped (empty when none or unreadable)."""
    path = silenced_path(home)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return frozenset()
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable node chaos file %s: %s", path, exc)
        return frozenset()
    return frozenset(str(n) for n in data) if isinstance(data, list) else frozenset()


def set_node_silenced(home: Path, node: str, silenced: bool) -> frozenset[str]:
    """Silence (down) or restore (up) one node's heartbeats, atomically; returns the new set."""
    if not node or len(node) > 128:
        raise ValueError(f"node name must be 1 to 128 characters, got {node!r}")
    path = silenced_path(home)
    with _locked(path):
        names = set(silenced_nodes(home))
        (names.add if silenced else names.discard)(node)
        tmp = path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(sorted(names)))
        tmp.replace(path)
    return frozenset(names)


# -- `corral chaos job oom JOB` ------------------------------------------------------------------


def inject_job_oom(session: Session, job_id: int, now: float, *, virtual: bool, force: bool) -> str:
    """End the job's running attempt as the kernel's OOM killer would: a fault record (event
    `oom`, so the exit-spec says `oom`, a user error, never retried), the attempt stopped at once,
    and then the usual OOM path (CorralJobOOM alert, job event). Returns the attempt id to stop.
    Only on virtual GPUs, unless `force` (an admin's explicit flag on real ones)."""
    if not virtual and not force:
        raise Conflict("this server's GPUs are real: pass force (`corral chaos job oom --force`) to go ahead")
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id}")
    attempt = session.scalars(
        select(Attempt).where(Attempt.job_id == job_id, Attempt.state == AttemptState.RUNNING.value)
    ).first()
    if attempt is None:
        raise Conflict(f"job {job_id} has no running attempt (it is {job.state})")
    if session.get(AttemptFault, attempt.id) is not None:
        raise Conflict(f"attempt {attempt.attempt_id} is already being stopped for a fault")
    node = attempt.placement[0].node if attempt.placement else ""
    detail = "chaos: injected OOM kill"
    session.add(AttemptFault(attempt_pk=attempt.id, event="oom", node=node, detail=detail, at=now))
    record_event(session, job_id, now, f"chaos: attempt {attempt.number} OOM-killed on request", kind="chaos")
    attempt.stop_requested_at = now
    attempt.stop_grace_s = 0.0
    return attempt.attempt_id
