"""The Slurm poll's account cache (engine._account_exists) against the real squeue: the poll filters
squeue by the live attempts' accounts, each one found looked up again only after ACCOUNT_CACHE_S."""

from __future__ import annotations

import pwd
import time

import pytest

from corral.engine.base import AttemptPhase, AttemptStatus
from corral.engine.slurm import SlurmEngine
from corral.engine.slurm import engine as slurm_engine_module
from tests.slurm.harness import SlurmCluster
from tests.slurm.helpers import FINISHED, attempt, instance, wait_for

pytestmark = pytest.mark.slurm


def test_an_account_removed_within_the_cache_minute_clears_it(
    engine: SlurmEngine, slurm_cluster: SlurmCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An account found a moment ago is not looked up again at each poll; removed meanwhile, it is
    still in the cache, so squeue gets it in --users and answers "invalid user": the engine drops
    the filter's accounts from the cache and asks for every user's jobs (the attempt is not taken
    for LOST), and at the next poll looks the account up again and leaves it out."""
    seen: dict[str, float] = {}
    monkeypatch.setattr(slurm_engine_module, "_accounts_seen", seen)
    # The job lives until the test has polled it (however long squeue takes on a loaded machine):
    # it ends when the test releases it, not after a fixed sleep that the polls could outlast.
    scratch = slurm_cluster.scratch_dir()
    waits = f"while [ ! -e {scratch}/release ]; do sleep 0.05; done; echo kept"
    engine.launch(attempt("117.1", instance("node3", waits), rw_mounts=[scratch]))
    record = engine.store.load("117.1")
    assert record is not None and record.unix_user
    account = record.unix_user

    lookups: list[str] = []
    real_getpwnam = pwd.getpwnam

    def counted(name: str) -> pwd.struct_passwd:
        lookups.append(name)
        return real_getpwnam(name)

    monkeypatch.setattr(pwd, "getpwnam", counted)

    def poll_by_account(unix_user: str) -> AttemptStatus:
        """A poll that must filter by account: the record's Slurm job id is unknown (sbatch's
        answer lost), so the job is looked for by name among the account's jobs (with the id
        known, the poll asks squeue for that id alone, and no account is looked up)."""
        lost = engine.store.load("117.1")
        assert lost is not None
        lost.unix_user, lost.slurm_job_id = unix_user, ""
        engine.store.save(lost)
        return engine.poll(["117.1"])["117.1"]

    seen.clear()
    for _ in range(3):
        assert poll_by_account(account).phase in (AttemptPhase.PENDING, AttemptPhase.RUNNING)
    assert lookups == [account] and account in seen  # found once, then taken from the cache

    gone = "corralt-removed-account"  # found a moment ago, removed since: only the cache has it
    seen[gone] = time.monotonic()
    lookups.clear()
    status = poll_by_account(gone)
    assert status.phase in (AttemptPhase.PENDING, AttemptPhase.RUNNING), status  # all users' jobs
    assert lookups == [] and gone not in seen  # squeue's "invalid user" cleared it

    assert poll_by_account(gone).phase in (AttemptPhase.PENDING, AttemptPhase.RUNNING)
    assert lookups == [gone] and gone not in seen  # looked up again: not found, left out, not cached
    (scratch / "release").touch()
    assert wait_for(engine, "117.1", FINISHED).phase is AttemptPhase.SUCCEEDED
