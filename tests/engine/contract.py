"""The engine contract: what every execution engine must do, as a reusable test class.

Use it by subclassing `EngineContract` in a `test_*.py` module and providing two fixtures:

    class TestMyEngine(EngineContract):
        @pytest.fixture
        def engine_factory(self, tmp_path) -> Callable[[], Engine]:
            # returns a function that builds a NEW engine object over the SAME durable state
            # (same home dir / same Slurm cluster): used to check adopt after a "restart"
            ...

        @pytest.fixture
        def node_names(self) -> list[str]:
            ...  # nodes this engine may place instances on

The `engine` fixture (one object from the factory) is provided here, and `shared_dir`: a host dir
that jobs may write and the test may read, mounted at the same path (override it where jobs cannot
reach /tmp). Commands are plain POSIX sh, so they run the same under every engine.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from corral.engine.base import (
    AttemptLaunch,
    AttemptPhase,
    AttemptStatus,
    Engine,
    FailureReason,
    InstanceLaunch,
    MountSpec,
)
from tests.support import dir_for_job_accounts

FINISH_TIMEOUT_S = 30.0


def new_attempt_id() -> str:
    return f"c{uuid.uuid4().hex[:10]}.1"


def writable_mounts(*paths: Path) -> tuple[MountSpec, ...]:
    """Host dirs a job may write, each at the same path inside its sandbox."""
    return tuple(MountSpec(str(p), str(p), read_only=False) for p in paths)


def make_attempt(
    node_names: list[str],
    *commands: str,
    attempt_id: str | None = None,
    max_runtime_s: float | None = None,
    memory_mib: int = 256,
    rw_mounts: Sequence[Path] = (),
) -> AttemptLaunch:
    """One attempt with one instance per command (rank = position), spread over the nodes;
    rw_mounts: host dirs the job may write, at the same path inside its sandbox."""
    aid = attempt_id or new_attempt_id()
    world = len(commands)
    instances = tuple(
        InstanceLaunch(
            role="worker",
            index=rank,
            rank=rank,
            node=node_names[rank % len(node_names)],
            gpus=(),
            cpus=1.0,
            memory_mib=memory_mib,
            command=cmd,
            env={"RANK": str(rank), "WORLD_SIZE": str(world), "CORRAL_ATTEMPT_ID": aid},
        )
        for rank, cmd in enumerate(commands)
    )
    job_id = aid.split(".")[0]
    mounts = writable_mounts(*rw_mounts)
    return AttemptLaunch(
        aid, job_id, 1, "alice", "team", instances, max_runtime_s=max_runtime_s, mounts=mounts
    )


def wait_for(
    engine: Engine, attempt_id: str, done: Callable[[AttemptStatus], bool], timeout: float
) -> AttemptStatus:
    deadline = time.monotonic() + timeout
    while True:
        status = engine.poll([attempt_id])[attempt_id]
        if done(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{attempt_id} still {status} after {timeout} s")
        time.sleep(0.02)


def wait_finished(engine: Engine, attempt_id: str, timeout: float = FINISH_TIMEOUT_S) -> AttemptStatus:
    return wait_for(engine, attempt_id, lambda s: s.phase.finished, timeout)


def wait_log(engine: Engine, attempt_id: str, text: bytes, rank: int = 0, timeout: float = 20.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        data = engine.logs(attempt_id, rank, 0).data
        if text in data:
            return data
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{text!r} not in the log of {attempt_id} rank {rank} after {timeout} s: {data!r}"
            )
        time.sleep(0.02)


class EngineContract:
    """Every engine passes these. Subclasses provide `engine_factory` and `node_names`."""

    @pytest.fixture
    def engine(self, engine_factory: Callable[[], Engine]) -> Iterator[Engine]:
        eng = engine_factory()
        yield eng
        eng.close()

    @pytest.fixture
    def shared_dir(self) -> Iterator[Path]:
        """A dir any job account may write (sticky, like /tmp) for markers between test and job."""
        with dir_for_job_accounts("corral-contract-") as path:
            yield path

    def test_is_an_engine(self, engine: Engine) -> None:
        assert isinstance(engine, Engine)  # its methods and the loops' pacing attributes
        assert engine.nodes(), "an engine reports at least one node"
        # The server's loops read these plainly (server.runner, server.dispatch, server.ahead).
        assert 0 < engine.poll_interval_s <= 10
        assert engine.launch_workers >= 1
        assert engine.queue_ahead_depth >= 0

    def test_launch_and_succeed(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "echo hello from $RANK")
        ref = engine.launch(attempt)
        assert ref
        status = wait_finished(engine, attempt.attempt_id)
        assert status.phase is AttemptPhase.SUCCEEDED, status
        assert status.exit_code == 0
        assert status.reason is None
        assert engine.logs(attempt.attempt_id, 0).data == b"hello from 0\n"

    def test_remove_attempt_deletes_finished_logs_only(self, engine: Engine, node_names: list[str]) -> None:
        done = make_attempt(node_names, "echo kept until removed")
        running = make_attempt(node_names, "echo still running; sleep 30")
        engine.launch(done)
        engine.launch(running)
        wait_finished(engine, done.attempt_id)
        wait_log(engine, running.attempt_id, b"still running")
        engine.remove_attempt(running.attempt_id)  # not finished: nothing is removed
        assert b"still running" in engine.logs(running.attempt_id, 0).data
        assert engine.logs(done.attempt_id, 0).data == b"kept until removed\n"
        engine.remove_attempt(done.attempt_id)
        engine.remove_attempt(done.attempt_id)  # idempotent
        gone = engine.logs(done.attempt_id, 0)
        assert gone.data == b"" and gone.eof
        engine.stop(running.attempt_id, 0.0)
        wait_finished(engine, running.attempt_id)

    def test_exit_code_reported(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "echo failing >&2; exit 7")
        engine.launch(attempt)
        status = wait_finished(engine, attempt.attempt_id)
        assert status.phase is AttemptPhase.FAILED
        assert status.exit_code == 7
        assert status.reason is FailureReason.EXIT_CODE
        assert b"failing" in engine.logs(attempt.attempt_id, 0).data  # stderr is in the log too

    def test_logs_with_offsets(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "echo first; sleep 0.5; echo second")
        engine.launch(attempt)
        aid = attempt.attempt_id
        wait_log(engine, aid, b"first\n")
        head = engine.logs(aid, 0, 0, limit=3)
        assert head.data == b"fir" and head.next_offset == 3 and not head.eof
        wait_finished(engine, aid)
        rest = engine.logs(aid, 0, head.next_offset)
        assert rest.data == b"st\nsecond\n"
        assert rest.next_offset == len(b"first\nsecond\n")
        assert rest.eof
        tail = engine.logs(aid, 0, rest.next_offset)
        assert tail.data == b"" and tail.eof and tail.next_offset == rest.next_offset

    def test_launch_is_idempotent(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "echo once; sleep 0.3")
        ref1 = engine.launch(attempt)
        ref2 = engine.launch(attempt)
        assert ref1 == ref2
        wait_finished(engine, attempt.attempt_id)
        assert engine.launch(attempt) == ref1  # also after it finished
        assert engine.logs(attempt.attempt_id, 0).data == b"once\n"

    def test_poll_does_not_block(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "sleep 30")
        engine.launch(attempt)
        started = time.monotonic()
        status = engine.poll([attempt.attempt_id])[attempt.attempt_id]
        assert time.monotonic() - started < 1.0
        assert status.phase in (AttemptPhase.PENDING, AttemptPhase.RUNNING)
        running = wait_for(engine, attempt.attempt_id, lambda s: s.phase is AttemptPhase.RUNNING, 20)
        assert running.started_at is not None
        engine.stop(attempt.attempt_id, 0)
        assert wait_finished(engine, attempt.attempt_id).reason is FailureReason.STOPPED

    def test_stop_sends_sigterm_and_honours_grace(self, engine: Engine, node_names: list[str]) -> None:
        script = "trap 'echo got-sigterm; exit 0' TERM; echo ready; while true; do sleep 0.05; done"
        attempt = make_attempt(node_names, script)
        engine.launch(attempt)
        wait_log(engine, attempt.attempt_id, b"ready")
        started = time.monotonic()
        engine.stop(attempt.attempt_id, 10.0)
        assert time.monotonic() - started < 1.0, "stop returns at once"
        status = wait_finished(engine, attempt.attempt_id, timeout=8)  # well before the grace ends
        assert b"got-sigterm" in engine.logs(attempt.attempt_id, 0).data
        assert status.phase is AttemptPhase.FAILED
        assert status.reason is FailureReason.STOPPED

    def test_stop_right_after_launch(self, engine: Engine, node_names: list[str]) -> None:
        """A stop that arrives while the attempt is still starting is not lost or deferred to
        the end of the grace period."""
        attempt = make_attempt(node_names, "sleep 60")
        engine.launch(attempt)
        engine.stop(attempt.attempt_id, 30.0)
        status = wait_finished(engine, attempt.attempt_id, timeout=15)
        assert status.phase is AttemptPhase.FAILED
        assert status.reason is FailureReason.STOPPED

    def test_stop_kills_after_grace(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "trap '' TERM; echo ready; sleep 60")
        engine.launch(attempt)
        wait_log(engine, attempt.attempt_id, b"ready")
        started = time.monotonic()
        engine.stop(attempt.attempt_id, 1.0)
        status = wait_finished(engine, attempt.attempt_id, timeout=15)
        elapsed = time.monotonic() - started
        assert elapsed >= 0.9, f"grace not honoured: killed after {elapsed:.2f} s"
        assert status.reason is FailureReason.STOPPED
        engine.stop(attempt.attempt_id, 1.0)  # stopping a finished attempt is a no-op
        assert engine.poll([attempt.attempt_id])[attempt.attempt_id].phase is AttemptPhase.FAILED

    def test_unknown_attempt_is_lost(self, engine: Engine) -> None:
        aid = new_attempt_id()
        assert engine.poll([aid])[aid].phase is AttemptPhase.LOST
        engine.stop(aid, 1.0)  # no error

    def test_multi_instance_attempt(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "echo rank=$RANK of $WORLD_SIZE", "echo rank=$RANK of $WORLD_SIZE")
        engine.launch(attempt)
        status = wait_finished(engine, attempt.attempt_id)
        assert status.phase is AttemptPhase.SUCCEEDED, status
        assert engine.logs(attempt.attempt_id, 0).data == b"rank=0 of 2\n"
        assert engine.logs(attempt.attempt_id, 1).data == b"rank=1 of 2\n"

    def test_gang_failure_stops_the_others(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "echo ready; sleep 60", "sleep 0.3; exit 3")
        engine.launch(attempt)
        started = time.monotonic()
        status = wait_finished(engine, attempt.attempt_id, timeout=20)
        assert time.monotonic() - started < 15, "the surviving instance was not stopped"
        assert status.phase is AttemptPhase.FAILED
        assert status.exit_code == 3
        assert status.reason is FailureReason.EXIT_CODE

    def test_max_runtime_enforced(self, engine: Engine, node_names: list[str]) -> None:
        attempt = make_attempt(node_names, "sleep 60", max_runtime_s=1.0)
        engine.launch(attempt)
        status = wait_finished(engine, attempt.attempt_id, timeout=20)
        assert status.phase is AttemptPhase.FAILED
        assert status.reason is FailureReason.TIMEOUT

    def test_adopt_after_recreating_the_engine(
        self, engine: Engine, engine_factory: Callable[[], Engine], node_names: list[str], shared_dir: Path
    ) -> None:
        # `long` runs until the test releases it, so it is still running when the new engine first
        # polls it however slowly the engine is closed and made again (it used to sleep 1.5 s)
        release = shared_dir / "release"
        waits = f"echo ready; while [ ! -e {release} ]; do sleep 0.05; done; exit 4"
        long = make_attempt(node_names, waits, rw_mounts=[shared_dir])
        short = make_attempt(node_names, "exit 5")
        refs = {a.attempt_id: engine.launch(a) for a in (long, short)}
        wait_log(engine, long.attempt_id, b"ready")
        engine.close()  # the "server" goes away; its jobs do not
        time.sleep(0.3)  # `short` ends while no engine object is watching
        again = engine_factory()
        again.adopt(refs)
        assert again.poll([long.attempt_id])[long.attempt_id].phase is AttemptPhase.RUNNING
        release.touch()
        assert wait_finished(again, long.attempt_id).exit_code == 4
        assert wait_finished(again, short.attempt_id).exit_code == 5
        again.close()
