"""Who may enter which running job, and the audit trail of each entry: the rules shared by the
exec WebSocket (`corral exec`, `corral port-forward`) and the SSH gateway (corral.gateway).

Only the job's owner and Corral admins may enter a job (a group admin may see and cancel a
member's job, but not run code as that member). The job must be running: its newest attempt is
the one entered, at one rank. Nobody enters an environment's build job: what it leaves in its
outputs goes into the environment store, and on the local engine it has the outbound network
its package index needs, which a shell in it would get around CORRAL_JOB_OUTBOUND with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from corral.db.models import Job
from corral.services import audit
from corral.services.auth import Principal
from corral.services.errors import Conflict, Forbidden, Invalid, NotFound
from corral.services.jobs import get_job, is_build_job
from corral.services.lifecycle import JobState

# Runs inside the sandbox for a port forward: relays stdin/stdout to 127.0.0.1:<port> in the job's
# network namespace. Standard library only (`python3 -I -S`), so any Python environment has it.
# When nothing listens on the port it says so in one line on stderr, which is for the person
# forwarding (`corral port-forward` prints it, the SSH gateway logs it), never data of the
# forwarded connection, and exits RELAY_NO_LISTENER.
RELAY_NO_LISTENER = 3
RELAY_SOURCE = f"""
import os, socket, sys, threading
try:
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    sys.stderr.write("nothing answers on port %s in the job (%s)\\n" % (sys.argv[1], e.strerror or e))
    sys.exit({RELAY_NO_LISTENER})
def up():
    while True:
        b = os.read(0, 65536)
        if not b:
            break
        s.sendall(b)
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=up, daemon=True).start()
while True:
    b = s.recv(65536)
    if not b:
        break
    os.write(1, b)
"""


MAX_JOB_ID = 2**31 - 1  # as corral.api.deps.MAX_ROW_ID: job ids are 32-bit in PostgreSQL


@dataclass(frozen=True, slots=True)
class ExecTarget:
    """A running job's instance to enter: the engine's attempt id and the rank."""

    job_id: int
    attempt_id: str
    rank: int
    owner: str


def relay_argv(port: int) -> list[str]:
    """The in-sandbox command of a port forward to `port` on the job's own loopback."""
    if not 1 <= port <= 65535:
        raise Invalid(f"port {port} is not a TCP port (1-65535)", ("body", "port"))
    return ["python3", "-I", "-S", "-c", RELAY_SOURCE, str(port)]


def exec_target(session: Session, principal: Principal, job_id: int, rank: int = 0) -> ExecTarget:
    """The running job `job_id` at `rank`, if `principal` may enter it: 404 unknown, 403 not the
    owner (nor an admin) or a build job, 409 not running, 422 no such rank."""
    job = find_job(session, principal, job_id)
    if job.user_id != principal.user_id and not principal.is_admin:
        raise Forbidden(f"job {job_id} belongs to {job.user.name}: only its owner (or an admin) may enter it")
    return running_target(job, rank)


def find_job(session: Session, principal: Principal, job_id: int) -> Job:
    """get_job, with an id no row can have refused as unknown (a WebSocket's path and an SSH
    login are not bounded like the API's ids: PostgreSQL would fail the query, a server error)."""
    if not 1 <= job_id <= MAX_JOB_ID:
        raise NotFound(f"no job with id {job_id}")
    return get_job(session, principal, job_id)


def running_target(job: Job, rank: int) -> ExecTarget:
    """The job's instance at `rank` to enter: 403 a build job, 409 not running, 422 no such rank."""
    if is_build_job(job.spec):
        raise Forbidden(
            f"job {job.id} is an environment's build job: nobody may enter it (exec, port forward, "
            "SSH), not even its owner: what it builds goes into the store other jobs use, and it has "
            "outbound network for the package index that other jobs do not"
        )
    if JobState(job.state) is not JobState.RUNNING or not job.attempts:
        raise Conflict(f"job {job.id} is {job.state}, not running: there is no sandbox to enter")
    attempt = job.attempts[-1]
    ranks = max(1, len(attempt.placement or []))
    if not 0 <= rank < ranks:
        raise Invalid(f"rank must be between 0 and {ranks - 1} for job {job.id}", ("query", "rank"))
    return ExecTarget(job.id, attempt.attempt_id, rank, job.user.name)


def record_entry(
    session: Session, principal: Principal, target: ExecTarget, how: str, argv: Sequence[str] | None
) -> None:
    """One audit row per entry (exec, port forward, SSH session), committed at once: the entry
    is a state change of the job's sandbox that the log must show even if it never ends cleanly."""
    audit.record(
        session,
        actor=principal,
        action=f"job.{how}",
        target_kind="job",
        target_id=target.job_id,
        after={"attempt": target.attempt_id, "rank": target.rank, "argv": list(argv or [])[:16]},
    )
    session.commit()
