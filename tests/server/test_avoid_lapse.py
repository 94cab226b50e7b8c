"""A retry's avoid (the GPU or node of a hardware failure, diagnosis.record) lapses while the job
could not fit anywhere outside it, and holds while it can (server/snapshot.AvoidLapse)."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select

from corral.db.diag_models import JobAvoid
from corral.db.models import GpuClaim
from corral.db.session import make_engine
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.scheduling import schedule_tick
from corral.services.nodes import set_admin_state
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant


def _cluster(tmp_path: Path, *names: str) -> ServerContext:
    fake = FakeEngine([gpu_node(n, address=f"10.0.0.{i + 1}") for i, n in enumerate(names)])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    return ctx


def _retry(ctx: ServerContext, gpus: int, nodes: list[str], bad_gpus: list[list[object]]) -> int:
    """A queued job (a retry) told to avoid `nodes` and `bad_gpus`."""
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        job_id = add_job(session, gid, uid, gpus=gpus)
        session.add(JobAvoid(job_id=job_id, nodes=nodes, gpus=bad_gpus, not_before=None))
        session.commit()
    return job_id


def _placed_on(ctx: ServerContext) -> set[tuple[str, int]]:
    with ctx.session_factory() as session:
        return {(c.node, c.gpu_index) for c in session.scalars(select(GpuClaim))}


def test_a_retry_that_needs_the_avoided_gpu_on_the_only_node_is_placed_there(tmp_path: Path) -> None:
    """A 4-GPU job on the only (4-GPU) node, its GPU 0 avoided after a fault: the avoid could
    never be honoured, and the job waited forever, neither run nor failed."""
    ctx = _cluster(tmp_path, "n1")
    _retry(ctx, 4, [], [["n1", 0]])
    schedule_tick(ctx, time.time())
    assert _placed_on(ctx) == {("n1", 0), ("n1", 1), ("n1", 2), ("n1", 3)}


def test_a_node_avoid_lapses_once_the_other_nodes_are_out_of_service(tmp_path: Path) -> None:
    """The avoid was recorded while n1 was ready (so it was kept); n1 was cordoned since."""
    ctx = _cluster(tmp_path, "n1", "n2")
    with ctx.session_factory() as session:
        set_admin_state(session, "n1", "cordon")
        session.commit()
    _retry(ctx, 1, ["n2"], [])
    schedule_tick(ctx, time.time())
    assert {node for node, _ in _placed_on(ctx)} == {"n2"}


def test_an_avoid_that_leaves_no_node_whole_enough_lapses_as_a_whole(tmp_path: Path) -> None:
    ctx = _cluster(tmp_path, "n1", "n2")
    _retry(ctx, 4, ["n1"], [["n2", 3]])  # the 4-GPU job has nowhere to go outside these
    schedule_tick(ctx, time.time())
    placed = _placed_on(ctx)
    assert len(placed) == 4 and len({node for node, _ in placed}) == 1, placed


def test_an_avoid_holds_while_the_job_fits_elsewhere(tmp_path: Path) -> None:
    ctx = _cluster(tmp_path, "n1", "n2")
    _retry(ctx, 2, ["n1"], [["n2", 0]])
    schedule_tick(ctx, time.time())
    placed = _placed_on(ctx)
    assert len(placed) == 2 and all(node == "n2" and gpu != 0 for node, gpu in placed), placed
