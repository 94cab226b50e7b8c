"""Dispatch gives a job the values of the secrets its spec names (decrypted then, in memory only),
and fails the attempt, naming the secret, when one can no longer be given (deleted after the
submit): real SQLite, the fake engine records what it was asked to launch."""

from __future__ import annotations

import time
from pathlib import Path

from sqlalchemy import select

from corral.db.models import Attempt, GpuClaim, Job
from corral.db.session import make_engine
from corral.server.nodes import node_tick
from corral.services.auth import Principal
from corral.services.secrets import box_for, delete_secret, set_secret
from corral.spec import SecretUseV1
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, run_dispatch, seed_tenant
from tests.server.test_loops import assign, job_state


def test_dispatch_hands_secret_values_to_the_engine_or_fails_naming_a_missing_one(tmp_path: Path) -> None:
    fake = FakeEngine([gpu_node("n1")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    uses = [SecretUseV1(name="wandb", env="WANDB_API_KEY"), SecretUseV1(name="ssh_key", file="id_rsa")]
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
        owner = Principal(
            user_id=uid, name="u", is_admin=False, default_group_id=gid, group_roles={gid: "member"}
        )
        box = box_for(ctx.settings)
        set_secret(session, owner, box, "wandb", b"key-1")
        set_secret(session, owner, box, "ssh_key", b"\x00\xffbinary")
        jobs = [add_job(session, gid, uid, name=f"j{i}") for i in range(2)]
        for job_id in jobs:
            job = session.get(Job, job_id)
            assert job is not None
            job.spec = job.spec.model_copy(update={"secrets": uses})
        session.commit()
    assert assign(ctx, jobs[0], ("worker", "n1", 0, (0,)))
    run_dispatch(ctx)
    launch = fake.launched[f"{jobs[0]}.1"]
    assert [(g.name, g.value, g.env, g.file) for g in launch.secrets] == [
        ("wandb", b"key-1", "WANDB_API_KEY", None),
        ("ssh_key", b"\x00\xffbinary", None, "id_rsa"),
    ]
    assert all(b"key-1" not in str(i.env).encode() for i in launch.instances)  # not in the env map

    with ctx.session_factory() as session:  # deleted after the second job was submitted
        delete_secret(session, owner, "ssh_key")
    assert assign(ctx, jobs[1], ("worker", "n1", 0, (1,)))
    run_dispatch(ctx)
    assert f"{jobs[1]}.1" not in fake.launched  # the engine was never asked
    with ctx.session_factory() as session:
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == jobs[1])).one()
        assert attempt.reason == "secret_unavailable" and "secret 'ssh_key'" in attempt.message
        assert session.scalars(select(GpuClaim).where(GpuClaim.job_id == jobs[1])).all() == []
    assert job_state(ctx, jobs[1]) == "failed"
