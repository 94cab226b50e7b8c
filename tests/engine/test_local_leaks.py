"""What the local engine leaves behind after crashes and failed launches: uid locks, attempt dirs
without a final status, empty cgroups."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from corral.engine.base import AttemptPhase
from corral.engine.isolation import cgroupfs
from corral.engine.local import LocalEngine, prepare
from corral.engine.local.process_files import cgroup_tops, remove_empty_cgroups
from tests.engine.contract import make_attempt, wait_finished
from tests.engine.local_support import CGROUP_ROOT, local_engine_factory, remove_cgroup_tree
from tests.engine.test_local_engine import one, started_in_sandbox
from tests.support import require, require_binary


def test_a_launch_that_fails_after_its_uid_was_given_gives_it_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sandboxed launch that failed after allocate_uid (its secrets, /etc or cgroups could not
    be written) kept the uid's lock for good: no supervisor ever ran to release it."""
    require_binary("bwrap")
    with local_engine_factory(tmp_path / "home") as factory:
        engine = factory()
        require(engine.capabilities().sandbox, "sandbox")

        def no_space(*_args: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(engine, "_write_secrets", no_space)
        attempt = one(engine, "true")
        assert engine.launch(attempt) == "refused"
        assert engine.poll([attempt.attempt_id])[attempt.attempt_id].phase is AttemptPhase.FAILED
        assert sorted(os.listdir(engine.uid_locks)) == [], "the failed launch still holds its uid"


def test_a_sigkilled_supervisors_uid_goes_back_with_its_work_dir_closed(tmp_path: Path) -> None:
    """The engine's clean-up of a dead supervisor kept its uid lock (the work dir it would have
    closed was the reason): one lock per crash, for good. It now closes the work dir as the
    supervisor would have (root's, 0700) and releases the lock."""
    require_binary("bwrap")
    with local_engine_factory(tmp_path / "home") as factory:
        engine = factory()
        attempt, supervisor, _cgroup = started_in_sandbox(engine, "echo ready; sleep 60")
        (lock,) = os.listdir(engine.uid_locks)
        work = engine.attempts_dir / attempt.attempt_id / "work" / "0"
        assert work.stat().st_uid == int(lock)
        os.kill(supervisor, signal.SIGKILL)
        assert wait_finished(engine, attempt.attempt_id, timeout=10).phase is AttemptPhase.LOST
        assert os.listdir(engine.uid_locks) == []
        st = work.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)


def test_an_attempt_dir_a_launch_left_without_any_file_is_settled(tmp_path: Path) -> None:
    """A crash between a launch's mkdir and its first file left a dir without status.json: it
    counted as active for good, and retention (remove_attempt) never removed it. A new engine
    settles it (LOST) at start-up; a stop of one settles it too."""
    home = tmp_path / "home"
    first = LocalEngine(home, "n", virtual_gpus=0, isolation=False, use_launcher=False)
    stale = time.time() - 60
    for aid in ("7.1", "8.1"):
        first.live_index.add(aid)  # a launch marks the attempt live before its mkdir
        (first.attempts_dir / aid).mkdir()
        os.utime(first.attempts_dir / aid, (stale, stale))
    first.stop("8.1", 0)  # the sweep's stop of an attempt its database ended
    assert json.loads((first.attempts_dir / "8.1" / "status.json").read_text())["phase"] == "lost"
    engine = LocalEngine(home, "n", virtual_gpus=0, isolation=False, use_launcher=False)
    assert engine.found_at_start == ["7.1"]
    assert engine.active_attempts() == []
    assert engine.poll(["7.1"])["7.1"].phase is AttemptPhase.LOST
    engine.remove_attempt("7.1")
    assert not (engine.attempts_dir / "7.1").exists()


def test_a_homes_empty_cgroup_subtree_is_removed_and_a_populated_one_kept(tmp_path: Path) -> None:
    """Test and bench servers stopped with jobs running left their home's cgroup parent (and,
    for SIGKILLed supervisors, attempt-level dirs) in every controller, one per home: 208 of
    them on a box up 12 h. local_support.remove_cgroup_tree removes the empty subtree (the
    harness calls it once it has killed the jobs); remove_empty_cgroups (a server's close) only
    the parent, and only where it has no cgroups below it."""
    require(os.access(CGROUP_ROOT / "memory", os.W_OK), "cgroup v1 (memory) writable")
    parent = f"corral-test-{uuid.uuid4().hex[:8]}"
    cgroup = cgroupfs.create_instance_cgroup(CGROUP_ROOT, 1, parent, "3.1/0", 64, 1.0, 64)
    try:
        remove_empty_cgroups(CGROUP_ROOT, parent, wait_s=0.2)
        assert all(os.path.isdir(d) for d in cgroup["dirs"]), "not deep: the cgroups below stay"
        remove_cgroup_tree(CGROUP_ROOT, parent, wait_s=2.0)
        assert [c for c in ("memory", "cpu", "pids", "devices") if (CGROUP_ROOT / c / parent).exists()] == []
    finally:
        remove_cgroup_tree(CGROUP_ROOT, parent, wait_s=2.0)


def test_a_launch_that_fails_after_some_cgroups_were_made_removes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch whose second instance's cgroup could not be set up (its dirs made, a limit not
    written) failed with rank 0's cgroups and rank 1's half-made ones left for good: no
    supervisor ran to remove them, and nothing else looks under the attempt's name."""
    require_binary("bwrap")
    with local_engine_factory(tmp_path / "home") as factory:
        engine = factory()
        require(engine.capabilities().cgroups, "cgroups")
        real = cgroupfs.create_instance_cgroup

        def fails_for_rank_1(*args: object, **kwargs: object) -> cgroupfs.CgroupHandle:
            handle = real(*args, **kwargs)  # type: ignore[arg-type]
            if str(args[3]).endswith("/1"):
                raise OSError(28, "No space left on device")
            return handle

        monkeypatch.setattr(cgroupfs, "create_instance_cgroup", fails_for_rank_1)
        attempt = make_attempt([engine.node_name], "true", "true")
        assert engine.launch(attempt) == "refused"
        assert engine.poll([attempt.attempt_id])[attempt.attempt_id].phase is AttemptPhase.FAILED
        tops = cgroup_tops(CGROUP_ROOT, engine.cgroup_parent)
        left = [str(top / attempt.attempt_id) for top in tops if (top / attempt.attempt_id).exists()]
        assert left == [], f"the failed launch left its cgroups: {left}"
        assert sorted(os.listdir(engine.uid_locks)) == [], "the failed launch still holds its uid"


def test_a_launch_whose_log_links_fail_removes_its_cgroups(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ranks' log links (under the storage root's logs/<user>/) are made after every cgroup:
    their failure, outside the block that cleaned up after a failed preparation, left them all."""
    require_binary("bwrap")
    with local_engine_factory(tmp_path / "home") as factory:
        engine = factory()
        require(engine.capabilities().cgroups, "cgroups")

        def no_space(*_args: object, **_kwargs: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(prepare, "link_attempt_logs", no_space)
        attempt = replace(
            make_attempt([engine.node_name], "true"), uid=200777, log_dir=str(tmp_path / "logs")
        )
        assert engine.launch(attempt) == "refused"
        tops = cgroup_tops(CGROUP_ROOT, engine.cgroup_parent)
        left = [str(top / attempt.attempt_id) for top in tops if (top / attempt.attempt_id).exists()]
        assert left == [], f"the failed launch left its cgroups: {left}"
