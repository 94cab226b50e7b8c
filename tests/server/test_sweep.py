"""The engine sweep (server/sweep.py): what the engine still runs for attempts the database has
ended is stopped; a live attempt, or one with no row, never is. A real local engine (plain
processes) under a real SQLite database."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sqlalchemy import select

from corral.db.audit_models import AuditRecord
from corral.db.models import Attempt
from corral.db.session import make_engine
from corral.engine.base import AttemptLaunch, AttemptPhase, InstanceLaunch
from corral.engine.local import LocalEngine
from corral.engine.local.supervisor import proc_start
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.sweep import sweep_tick
from corral.services.lifecycle import AttemptState, move_attempt
from corral.storage.layout import ensure_layout
from tests.server.fakes import add_job, make_context, run_dispatch, seed_tenant
from tests.server.test_loops import assign


def _job_pid(engine: LocalEngine, attempt_id: str) -> int:
    """The pid of rank 0's process (state.json), once the supervisor has started it."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if engine.poll([attempt_id])[attempt_id].phase is AttemptPhase.RUNNING:
            state = json.loads((engine.attempts_dir / attempt_id / "state.json").read_text())
            return int(state["pids"]["0"])
        time.sleep(0.02)
    raise AssertionError(f"{attempt_id} never ran")


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc_start(pid) is None:
            return True
        time.sleep(0.02)
    return False


def test_the_sweep_stops_what_the_engine_runs_for_an_attempt_the_database_ended(tmp_path: Path) -> None:
    """A server killed between a lost node's commit (its attempts LOST in the database) and the
    engine stops that follow left the processes running: nothing ever stopped them. The sweep
    stops them (and audits it); the live attempt beside it, and an engine attempt the database
    has no row for, keep running."""
    engine = LocalEngine(tmp_path / "engine", "n1", virtual_gpus=4, isolation=False, use_launcher=False)
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), engine, str(tmp_path))
    ensure_layout(ctx.settings.storage_path, ctx.settings.engine)
    try:
        node_tick(ctx, time.time())
        with ctx.session_factory() as session:
            gid, uid = seed_tenant(session)
            ended_job = add_job(session, gid, uid, command="sleep 60")
            live_job = add_job(session, gid, uid, command="sleep 60")
        assert assign(ctx, ended_job, ("worker", "n1", 0, (0,)))
        assert assign(ctx, live_job, ("worker", "n1", 0, (1,)))
        run_dispatch(ctx)
        inst = InstanceLaunch("worker", 0, 0, "n1", (), 1.0, 128, "sleep 60", {})
        engine.launch(AttemptLaunch("999.1", "999", 1, "u", "g", (inst,)))  # no row in this database
        ended_pid = _job_pid(engine, f"{ended_job}.1")
        live_pid = _job_pid(engine, f"{live_job}.1")
        stray_pid = _job_pid(engine, "999.1")
        reconcile_tick(ctx, time.time())
        with ctx.session_factory() as session:  # the crash: the end committed, no stop sent
            attempt = session.scalars(select(Attempt).where(Attempt.job_id == ended_job)).one()
            assert attempt.state == AttemptState.RUNNING.value
            assert move_attempt(
                session, attempt, AttemptState.LOST, {"reason": "node_lost", "ended_at": time.time()}
            )
            session.commit()
        assert proc_start(ended_pid) is not None  # nothing stops it on its own

        assert sweep_tick(ctx, time.time()) == [f"{ended_job}.1"]

        assert _gone(ended_pid, 5.0), "the ended attempt's process still runs"
        assert proc_start(live_pid) is not None and proc_start(stray_pid) is not None
        assert engine.poll([f"{live_job}.1"])[f"{live_job}.1"].phase is AttemptPhase.RUNNING
        with ctx.session_factory() as session:
            audits = session.scalars(
                select(AuditRecord).where(AuditRecord.action == "attempt.stop_ended")
            ).all()
            assert [(a.actor, a.target_id) for a in audits] == [("system:sweep", f"{ended_job}.1")]
        assert sweep_tick(ctx, time.time()) == []  # once: the stopped attempt has its final status now
    finally:
        for aid in engine.active_attempts():
            engine.stop(aid, 0)
        deadline = time.monotonic() + 5
        while engine.active_attempts() and time.monotonic() < deadline:
            engine.poll(engine.active_attempts())
            time.sleep(0.02)
        engine.close()
        assert os.path.isdir(engine.attempts_dir)
