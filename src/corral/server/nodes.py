"""The node loop: engine.nodes() -> Node/Gpu rows, operator states pushed to the engine, heartbeats.

- Every report refreshes the node's capacity, GPUs, address and `last_heartbeat`; a GPU no longer
  reported is removed, unless quarantined or lost (kept until an admin returns it).
- The effective `state` the scheduler sees merges the engine's view with the operator's
  `admin_state` (cordon/drain survive the engine's reports); changes of `admin_state` are pushed to
  the engine with `set_node_state`.
- A node not reported for HEARTBEAT_TIMEOUT_S is marked down and the attempts on it end as LOST:
  their jobs follow the one rule for lost work (services.lifecycle.settle_lost_work: requeued
  within the job's platform-loss budget, failed beyond it).
- EngineUnavailable changes nothing but the nodes' state, which becomes `unknown`.
- Reports of nodes silenced by `corral chaos node down` (monitor/chaos.py) are dropped here, so
  such a node goes through what a node that stopped sending heartbeats goes through.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from corral.db.models import Attempt, Gpu, Job, Node, RemovedNode
from corral.diagnosis.exitspec import ExitSpec, Facts
from corral.diagnosis.record import record
from corral.engine.base import AttemptPhase, Engine, EngineUnavailable, FailureReason, NodeReport
from corral.monitor.chaos import silenced_nodes
from corral.scheduler.types import GPU, NodeState
from corral.server.context import ServerContext
from corral.server.finish import end_attempt
from corral.server.reconcile import active_exit_spec
from corral.server.snapshot import LIVE_JOB_STATES
from corral.services.lifecycle import (
    DEFAULT_LOST_REQUEUE_BUDGET,
    AttemptState,
    GpuHealth,
    JobState,
    Loss,
    move_node,
    settle_lost_work,
)
from corral.services.nodes import live_on
from corral.services.views import utc_text

log = logging.getLogger("corral.server.nodes")
LIVE_ATTEMPT_STATES = frozenset(s.value for s in AttemptState if not s.finished)
# Kubernetes waits 50 s and Slurm 300 s by default; Corral's default is 6 s from the last heartbeat.
HEARTBEAT_TIMEOUT_S = float(os.environ.get("CORRAL_NODE_HEARTBEAT_TIMEOUT_S", "6"))
ADMIN_STATES = {"cordoned": NodeState.CORDONED, "draining": NodeState.DRAINING}


def effective_state(reported: NodeState, admin_state: str) -> NodeState:
    if reported in (NodeState.DOWN, NodeState.UNKNOWN):
        return reported
    return ADMIN_STATES.get(admin_state, reported)


def gpu_row(gpu: GPU) -> Gpu:
    """A new Gpu row for a GPU as the engine reports it (services.nodes.scheduler_node reads it back)."""
    return Gpu(
        index=gpu.index,
        uuid=gpu.uuid,
        model=gpu.model,
        memory_mib=gpu.memory_mib,
        topology_group=gpu.topology_group,
        healthy=gpu.healthy,
    )


def _sync_gpus(session: Session, row: Node, report: NodeReport) -> None:
    have = {g.index: g for g in row.gpus}
    for gpu in report.gpus:
        existing = have.pop(gpu.index, None)
        if existing is None:
            row.gpus.append(gpu_row(gpu))
            continue
        existing.uuid, existing.model, existing.memory_mib = gpu.uuid, gpu.model, gpu.memory_mib
        existing.topology_group, existing.healthy = gpu.topology_group, gpu.healthy
    for gone in have.values():
        if gone.health != GpuHealth.HEALTHY.value:
            # Quarantined or lost: kept (out of placement) until an admin returns it. Deleted, it
            # would come back as a new healthy row the next time the engine lists it.
            continue
        session.delete(gone)


def _returned(session: Session, name: str) -> str | None:
    """Why a node reported now comes back cordoned: an admin removed it and the engine reports it
    again (it was not taken out of the engine first). Its RemovedNode row goes: it is a node
    again, held out of placement by the cordon until an admin uncordons it (or removes it again,
    once out of the engine). None for a node never removed."""
    removed = session.get(RemovedNode, name)
    if removed is None:
        return None
    session.delete(removed)
    when = utc_text(removed.removed_at)
    why = (
        f"removed by {removed.removed_by or 'an admin'} at {when}, reported again by the engine: "
        "cordoned until an admin uncordons it (or takes it out of the engine and removes it again)"
    )
    log.warning("node %s %s", name, why)
    return why


def upsert_node(session: Session, report: NodeReport, engine_name: str, now: float) -> Node:
    row = session.get(Node, report.name, options=[selectinload(Node.gpus)])
    returned = _returned(session, report.name) if row is None else None
    admin_state = row.admin_state or "none" if row is not None else "cordoned" if returned else "none"
    state = effective_state(report.state, admin_state)
    if state is NodeState.UNKNOWN and row is not None and row.state == NodeState.DOWN.value:
        # Down never -> unknown (as in mark_unknown): an engine that cannot tell (Slurm's cached
        # nodes during an outage, a node not responding) leaves a down node down.
        state = NodeState.DOWN
    if row is None:
        row = Node(
            name=report.name,
            cpus=report.cpus,
            memory_mib=report.memory_mib,
            admin_state=admin_state,
            state=state.value,
            message=returned or report.message,
        )
        session.add(row)
        row.gpus = []
    row.cpus, row.memory_mib, row.address = report.cpus, report.memory_mib, report.address
    row.labels, row.engine = dict(report.labels), engine_name
    move_node(session, row, state, message=returned or report.message)
    if state is not NodeState.DOWN:
        row.last_heartbeat = now
    _sync_gpus(session, row, report)
    return row


def fail_jobs_on(
    session: Session,
    node: str,
    now: float,
    why: str,
    budget: int = DEFAULT_LOST_REQUEUE_BUDGET,
    spec: ExitSpec | None = None,
    succeeded: Collection[str] = frozenset(),
    live: Sequence[tuple[Job, Attempt]] | None = None,
) -> list[str]:
    """End the live attempts placed on `node` as LOST and settle their jobs by the one rule for
    lost work (a job changed meanwhile by another session is left to it). Not committed. Returns
    the ids of the attempts it ended, for the caller to stop through the engine once this is
    committed (stop_lost). An attempt in `succeeded` (the engine reported it so: the caller asked
    before writing anything) is left to the reconcile loop, which records its end: it exited 0
    before the node was lost, and requeueing its job would run finished work again. `live`: the
    live attempts on a set of nodes holding `node`, read by the caller (None: read here)."""
    ended: list[str] = []
    on_node = _live_on_nodes(session, {node}) if live is None else _still_live_on(live, node)
    for job, attempt in on_node:
        if attempt.attempt_id in succeeded:
            continue
        if settle_lost_work(session, job, loss=Loss.NODE, why=why, now=now, budget=budget) is None:
            continue
        end_attempt(
            session, job, attempt, AttemptState.LOST, now, reason=FailureReason.NODE_LOST, message=why
        )
        if spec is not None:  # the exit-spec's node_lost verdict: failure counts and node flags
            verdict = spec.classify(Facts(frozenset({"node_lost"}), log_tail=why))
            record(session, job, attempt, verdict, node, now, retried=job.state == JobState.QUEUED.value)
        ended.append(attempt.attempt_id)
    return ended


def _live_on_nodes(session: Session, nodes: set[str]) -> list[tuple[Job, Attempt]]:
    """The live jobs with their live attempt placed (in part) on one of `nodes`."""
    live = {s.value for s in LIVE_JOB_STATES}
    return [(job, attempt) for job, attempt in live_on(session, nodes) if job.state in live]


def _still_live_on(live: Sequence[tuple[Job, Attempt]], node: str) -> list[tuple[Job, Attempt]]:
    """Those of `live` placed (in part) on `node` and live still: a node settled earlier in the
    same tick may have ended the attempt (a job placed across two lost nodes) or requeued its job."""
    jobs = {s.value for s in LIVE_JOB_STATES}
    return [
        (job, attempt)
        for job, attempt in live
        if job.state in jobs
        and attempt.state in LIVE_ATTEMPT_STATES
        and any(p.node == node for p in attempt.placement or ())
    ]


def _succeeded_in_engine(engine: Engine | None, attempt_ids: list[str]) -> set[str]:
    """The attempts among `attempt_ids` the engine reports succeeded (none when it cannot say: a
    lost node's attempts are then settled as lost, as without the engine's word). A read only:
    nothing is asked of the engine that a crash before the commit could leave half-done."""
    if engine is None or not attempt_ids:
        return set()
    try:
        statuses = engine.poll(attempt_ids)
    except Exception as exc:  # any engine failure: settle by the node's loss alone
        log.info("could not ask the engine how %s ended: %s", ", ".join(attempt_ids), exc)
        return set()
    return {aid for aid, status in statuses.items() if status.phase is AttemptPhase.SUCCEEDED}


def stop_lost(engine: Engine, attempt_ids: list[str]) -> None:
    """Best effort, after the commit that recorded the losses: should the node come back, its
    processes must not run on beside the retries. Never before that commit: a stop delivered for
    a loss that was then not recorded (the commit failed, the server died) ends the attempt as
    `stopped` by Corral, which fails the job (not retryable) instead of requeueing it."""
    for attempt_id in attempt_ids:
        try:
            engine.stop(attempt_id, 0.0)
        except Exception as exc:
            log.info("could not stop %s on a lost node: %s", attempt_id, exc)


def push_admin_states(ctx: ServerContext, rows: list[Node]) -> None:
    """Tell the engine about cordon/drain/uncordon once per change (and once after a restart:
    "none" for most nodes, which an engine must not read as "undo holds Corral did not make";
    the Slurm engine leaves an admin's drain in Slurm itself alone, docs/slurm.md "Nodes")."""
    pushed = ctx.memory.pushed_admin_state
    for row in rows:
        wanted = row.admin_state or "none"
        if pushed.get(row.name) == wanted:
            continue
        try:
            ctx.engine.set_node_state(row.name, ADMIN_STATES.get(wanted, NodeState.READY), row.message)
            pushed[row.name] = wanted
        except EngineUnavailable as exc:
            log.warning("could not push state of node %s: %s", row.name, exc)


def mark_unknown(ctx: ServerContext, message: str) -> None:
    with ctx.session_factory() as session:
        for row in session.scalars(select(Node).where(Node.engine == ctx.engine.name)):
            if row.state != NodeState.DOWN.value:
                move_node(session, row, NodeState.UNKNOWN, message=message)
        session.commit()


def node_tick(ctx: ServerContext, now: float) -> None:
    try:
        reports = ctx.engine.nodes()
    except EngineUnavailable as exc:
        mark_unknown(ctx, f"engine unavailable: {exc}")
        return
    silenced = silenced_nodes(ctx.settings.home)  # `corral chaos node down`: heartbeats lost
    reports = [r for r in reports if r.name not in silenced]
    lost: list[str] = []
    budget = ctx.settings.lost_requeue_budget
    with ctx.session_factory() as session:
        # Every node with its GPUs in one query: upsert_node's session.get then finds them in the
        # session instead of reading each reported node again.
        known = session.scalars(select(Node).options(selectinload(Node.gpus))).all()
        down = NodeState.DOWN.value
        before = {row.name: row.state for row in known}
        seen = {r.name for r in reports}
        # The nodes this tick marks down, found before it writes anything: reported down and not
        # down before, or silent past HEARTBEAT_TIMEOUT_S (with why) and not down yet.
        reported_down = {r.name for r in reports if r.state is NodeState.DOWN and before.get(r.name) != down}
        silent = [
            (row, f"node {row.name} stopped sending heartbeats ({now - (row.last_heartbeat or 0.0):.0f} s)")
            for row in known
            if row.name not in seen
            and row.state != down
            and now - (row.last_heartbeat or 0.0) > HEARTBEAT_TIMEOUT_S
        ]
        # Their live attempts, read once; the engine asked once how they went, while nothing is
        # written yet (an engine call inside the write transaction held SQLite's write lock, and
        # PostgreSQL's row locks, for as long as the engine took).
        scanned = reported_down | {row.name for row, _why in silent}
        live = _live_on_nodes(session, scanned) if scanned else []
        succeeded = _succeeded_in_engine(ctx.engine, [a.attempt_id for _, a in live])
        rows = [upsert_node(session, r, ctx.engine.name, now) for r in reports]
        for row, why in silent:
            if move_node(session, row, NodeState.DOWN, message=why):
                lost += fail_jobs_on(
                    session, row.name, now, why, budget, active_exit_spec(ctx), succeeded, live
                )
            log.warning(why)
        for row in rows:  # reported down just now: its jobs are lost once, not every tick
            if row.state == down and before.get(row.name) != down:
                why = row.message or f"node {row.name} is down"
                # (not scanned: made down by another server meanwhile; read here)
                on = live if row.name in scanned else None
                lost += fail_jobs_on(
                    session, row.name, now, why, budget, active_exit_spec(ctx), succeeded, on
                )
        session.commit()
        push_admin_states(ctx, rows)
    stop_lost(ctx.engine, lost)
    if lost:
        ctx.wake("schedule")
