"""A suspected hang acted on (on_hang: kill | requeue) is carried out even when its stop did not
reach the engine at once."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select

from corral.db.diag_models import AttemptFault
from corral.db.models import Job
from corral.db.session import make_engine
from corral.diagnosis.settings import DiagnosisSettings
from corral.diagnosis.watch import check_hangs
from corral.monitor.loops import STOP_RETRY_AFTER_S, incident_tick
from corral.monitor.models import GpuReading
from corral.scheduler import types as st
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import apply_assignment
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, run_dispatch, seed_tenant


def test_a_hang_kill_whose_stop_never_reached_the_engine_is_sent_again(tmp_path: Path) -> None:
    """The watch records the hang (fault, stop time) and commits, then stops the attempt: a server
    killed between the two, or an engine unreachable at that moment, left the stop unsent. The
    incidents loop sends again the stops of faulted attempts that still run, but left hang
    faults out, and the watch never acts twice on one suspicion: the hung job ran on for good,
    its GPUs held, although its policy said kill."""
    fake = FakeEngine([gpu_node("n1")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid)
        placed = st.Allocation(str(job_id), (st.InstancePlacement("worker", 0, "n1", (0,), 1.0, 1024),))
        assert apply_assignment(session, st.Assignment(str(job_id), placed), time.time())
    run_dispatch(ctx)
    attempt_id = f"{job_id}.1"
    fake.run(attempt_id)
    reconcile_tick(ctx, time.time())
    t0 = time.time()
    with ctx.session_factory() as session:
        assert session.get(Job, job_id).state == "running"  # type: ignore[union-attr]
        session.add(GpuReading(node="n1", gpu_index=0, utilization_percent=0.0, sampled_at=t0))
        session.commit()
    settings = DiagnosisSettings(hang_after_s=60.0, on_hang="kill")
    with ctx.session_factory() as session:  # the watch's first look: log sizes, GPUs idle
        assert check_hangs(session, fake, t0, settings, []) == []
        session.commit()
    with ctx.session_factory() as session:  # a minute later, nothing moved: hung
        stops = check_hangs(session, fake, t0 + 61.0, settings, [])
        session.commit()
    assert stops == [(attempt_id, 5.0)]
    with ctx.session_factory() as session:
        (fault,) = session.scalars(select(AttemptFault)).all()
        assert fault.event == "hang" and fault.detail.startswith("kill")
    # ... and the watch_tick that would now send the stop never does (the server was killed).
    assert fake.stopped == []
    incident_tick(ctx, t0 + 61.0 + STOP_RETRY_AFTER_S + 1.0)
    assert fake.stopped == [(attempt_id, 0.0)]
