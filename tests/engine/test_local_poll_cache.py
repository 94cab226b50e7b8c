"""poll() keeps a live attempt's last reading while its dir is unchanged and its supervisor alive
(the reconcile loop polls every live attempt ten times a second): what changes the attempt is
still seen at once: its end (status.json renamed into the dir), a stop, a supervisor that died.
Plain processes (isolation off): the cache is the engine's, not the sandbox's."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from corral.engine.base import AttemptPhase
from corral.engine.local import LocalEngine
from corral.engine.local.engine import UNCHANGED_AFTER_NS
from tests.engine.test_local_engine import one


def running_and_cached(engine: LocalEngine, command: str) -> str:
    attempt = one(engine, command)
    engine.launch(attempt)
    aid = attempt.attempt_id
    deadline = time.monotonic() + 10
    while engine.poll([aid])[aid].phase is not AttemptPhase.RUNNING:
        assert time.monotonic() < deadline, "never running"
        time.sleep(0.01)
    time.sleep(2 * UNCHANGED_AFTER_NS / 1e9)  # the dir has been still long enough
    assert engine.poll([aid])[aid].phase is AttemptPhase.RUNNING
    assert aid in engine._unchanged  # kept: the next polls read no file
    return aid


def phase_within(engine: LocalEngine, aid: str, timeout_s: float) -> AttemptPhase:
    deadline = time.monotonic() + timeout_s
    phase = engine.poll([aid])[aid].phase
    while not phase.finished and time.monotonic() < deadline:
        time.sleep(0.01)
        phase = engine.poll([aid])[aid].phase
    return phase


def test_end_and_stop_are_seen_through_the_cache(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path / "home", "n1", virtual_gpus=0, isolation=False)
    try:
        # ends when released, not after a fixed sleep that a slow start could use up before the
        # cache is checked (the job would be over before it was seen running and cached)
        release = tmp_path / "release"
        ends = running_and_cached(engine, f"while [ ! -e {release} ]; do sleep 0.01; done")
        release.touch()
        assert phase_within(engine, ends, 5.0) is AttemptPhase.SUCCEEDED
        assert ends not in engine._unchanged
        stopped = running_and_cached(engine, "sleep 30")
        engine.stop(stopped, 0.0)
        assert phase_within(engine, stopped, 5.0) is AttemptPhase.FAILED
    finally:
        engine.close()


def test_a_file_renamed_into_the_dir_is_read_again(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path / "home", "n1", virtual_gpus=0, isolation=False)
    try:
        aid = running_and_cached(engine, "sleep 30")
        state = engine.attempts_dir / aid / "state.json"
        changed = {**json.loads(state.read_text()), "started_at": 123.0}
        (state.parent / "state.tmp").write_text(json.dumps(changed))
        os.replace(state.parent / "state.tmp", state)  # as the supervisor writes its files
        assert engine.poll([aid])[aid].started_at == 123.0
        engine.stop(aid, 0.0)
        assert phase_within(engine, aid, 5.0) is AttemptPhase.FAILED
    finally:
        engine.close()


def test_a_dead_supervisor_is_seen_through_the_cache(tmp_path: Path) -> None:
    engine = LocalEngine(tmp_path / "home", "n1", virtual_gpus=0, isolation=False)
    try:
        aid = running_and_cached(engine, "sleep 30")
        sup = json.loads((engine.attempts_dir / aid / "supervisor.json").read_text())
        job_pids = json.loads((engine.attempts_dir / aid / "state.json").read_text())["pids"]
        os.kill(sup["pid"], signal.SIGKILL)  # no final word, no change to the dir
        try:
            assert phase_within(engine, aid, 5.0) is AttemptPhase.LOST
        finally:
            for pid in job_pids.values():  # no cgroup without isolation: the job's group by hand
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    finally:
        engine.close()
