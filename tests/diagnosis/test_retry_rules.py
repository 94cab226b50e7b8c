"""Retries follow the exit-spec's category (services.lifecycle.settle_failure with a RetryRule):
user errors within `retries:` and never when the rule says never; transient, platform and hardware
failures on the platform-loss budget, whatever `retries:` says, at most the rule's cap."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import select

from corral.db.models import Job
from corral.db.session import make_engine
from corral.scheduler import types as st
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.scheduling import apply_assignments
from corral.services.lifecycle import JobState, RetryRule, settle_failure
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant


@dataclass
class World:
    ctx: ServerContext
    group_id: int
    user_id: int
    jobs: int = 0


@pytest.fixture
def world(tmp_path: Path) -> World:
    fake = FakeEngine([gpu_node("n1")])
    ctx = make_context(make_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
    return World(ctx, gid, uid)


def fail_once(w: World, retries: int, rule: RetryRule, budget: int = 3) -> tuple[JobState | None, Job]:
    """A new job on its own GPU of n1, failed once with `rule`."""
    gpu, w.jobs = w.jobs, w.jobs + 1
    with w.ctx.session_factory() as session:
        job_id = add_job(session, w.group_id, w.user_id, retries=retries)
    with w.ctx.session_factory() as session:
        placed = st.Allocation(str(job_id), (st.InstancePlacement("worker", 0, "n1", (gpu,), 1.0, 1024),))
        assert apply_assignments(session, [st.Assignment(str(job_id), placed)], time.time()) == 1
        job = session.scalars(select(Job).where(Job.id == job_id)).one()
        entered = settle_failure(
            session, job, why="attempt 1 failed", now=time.time(), rule=rule, budget=budget
        )
        session.commit()
        session.refresh(job)
        session.expunge(job)
        return entered, job


def test_a_user_error_the_rule_never_retries_fails_despite_retries(world: World) -> None:
    entered, job = fail_once(world, 3, RetryRule(own_fault=True, cap=0, label="user_error"))
    assert entered is JobState.FAILED and job.own_failures == 1
    assert job.reason.endswith("(not retryable: user_error)")


def test_a_user_error_that_may_be_retried_uses_retries(world: World) -> None:
    entered, job = fail_once(world, 1, RetryRule(own_fault=True, cap=None, label="exit_code"))
    assert entered is JobState.QUEUED and (job.own_failures, job.platform_losses) == (1, 0)
    entered, _ = fail_once(world, 0, RetryRule(own_fault=True, cap=None, label="exit_code"))
    assert entered is JobState.FAILED


def test_a_transient_failure_is_retried_on_the_platform_budget_without_retries(world: World) -> None:
    entered, job = fail_once(world, 0, RetryRule(own_fault=False, cap=2, label="nccl_hang"))
    assert entered is JobState.QUEUED and (job.own_failures, job.platform_losses) == (0, 1)
    assert "requeued (platform loss 1 of 2)" in job.reason


def test_the_platform_budget_and_the_rules_cap_both_bound_it(world: World) -> None:
    entered, _ = fail_once(world, 5, RetryRule(own_fault=False, cap=None, label="node_lost"), budget=0)
    assert entered is JobState.FAILED
    entered, job = fail_once(world, 5, RetryRule(own_fault=False, cap=0, label="hang_killed"))
    assert entered is JobState.FAILED and job.reason.endswith("(not retryable: hang_killed)")
