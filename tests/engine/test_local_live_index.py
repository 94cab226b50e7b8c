"""The local engine's live index (engine/local/live_index.py): `active_attempts()`, which the
sweep calls every 5 s, read every attempt dir the node kept (a stat of each dir and of its
status.json: tens of thousands of finished attempts until retention). It now reads the markers of
the attempts that may still run, and lists every live attempt from its launch until its end."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from corral.engine.base import AttemptPhase
from corral.engine.local import LocalEngine
from corral.engine.local.live_index import INDEXED, STALE_MARKER_S
from tests.engine.contract import wait_finished, wait_log
from tests.engine.test_local_engine import one


def plain_engine(home: Path) -> LocalEngine:
    return LocalEngine(home, "n", virtual_gpus=0, isolation=False, use_launcher=False)


def finished_dir(engine: LocalEngine, attempt_id: str) -> Path:
    """An attempt dir as a finished attempt leaves it (its end seen: no marker)."""
    adir = engine.attempts_dir / attempt_id
    adir.mkdir()
    (adir / "status.json").write_text(json.dumps({"phase": "succeeded"}))
    return adir


def test_an_attempt_is_listed_from_its_launch_to_its_end_across_a_restart_and_a_dead_supervisor(
    tmp_path: Path,
) -> None:
    engine = plain_engine(tmp_path / "home")
    # The quick job ends once the test lets it, after the listing was checked: a `true` could
    # end (and be unlisted, rightly) before that check on a loaded machine.
    gate = tmp_path / "quick-may-end"
    quick_command = f"until [ -e '{gate}' ]; do sleep 0.02; done"
    try:
        killed, stopped, quick = (
            one(engine, c) for c in ("echo ready; sleep 60", "echo ready; sleep 60", quick_command)
        )
        for attempt in (killed, stopped, quick):
            engine.launch(attempt)
            assert attempt.attempt_id in engine.active_attempts(), "not listed once launched"
        gate.touch()
        assert wait_finished(engine, quick.attempt_id).phase is AttemptPhase.SUCCEEDED
        assert engine.active_attempts() == sorted([killed.attempt_id, stopped.attempt_id])
        assert not (engine.live_index.live_dir / quick.attempt_id).exists(), "its marker stays"
        wait_log(engine, killed.attempt_id, b"ready")
        wait_log(engine, stopped.attempt_id, b"ready")
        engine.close()
        engine = plain_engine(tmp_path / "home")  # a server restart
        assert engine.found_at_start == sorted([killed.attempt_id, stopped.attempt_id])
        sup = json.loads((engine.attempts_dir / killed.attempt_id / "supervisor.json").read_text())
        os.kill(sup["pid"], signal.SIGKILL)
        time.sleep(0.2)
        assert killed.attempt_id in engine.active_attempts(), "unlisted before its end was settled"
        assert wait_finished(engine, killed.attempt_id).phase is AttemptPhase.LOST
        assert engine.active_attempts() == [stopped.attempt_id]
        engine.stop(stopped.attempt_id, 0)
        wait_finished(engine, stopped.attempt_id)
        assert engine.active_attempts() == []
        assert sorted(os.listdir(engine.live_index.live_dir)) == [INDEXED]
    finally:
        for aid in engine.active_attempts():
            engine.stop(aid, 0)
        engine.close()


def test_the_listing_reads_no_finished_attempts_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Many finished attempts' dirs beside a live one: the listing neither lists the attempts
    dir nor stats anything in a finished attempt's dir."""
    engine = plain_engine(tmp_path / "home")
    finished = {str(finished_dir(engine, f"{n}.1")) for n in range(1, 2001)}
    live = one(engine, "sleep 60")
    engine.launch(live)
    touched: list[str] = []

    def recording(real: Callable[..., Any]) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            touched.append(os.fspath(path) if not isinstance(path, int) else "")
            return real(path, *args, **kwargs)

        return call

    try:
        for name in ("stat", "lstat", "listdir", "scandir"):
            monkeypatch.setattr(os, name, recording(getattr(os, name)))
        started = time.perf_counter()
        listed = engine.active_attempts()
        took_ms = (time.perf_counter() - started) * 1e3
        monkeypatch.undo()
        assert listed == [live.attempt_id]
        assert str(engine.attempts_dir) not in touched, "the attempts dir was listed"
        read = [p for p in touched if os.path.dirname(p) in finished or p in finished]
        assert read == [], f"{len(read)} reads of finished attempts' dirs, e.g. {read[:3]}"
        assert len(touched) < 10, touched
        print(f"active_attempts with 2000 finished dirs and 1 live: {took_ms:.2f} ms, {len(touched)} calls")
    finally:
        monkeypatch.undo()
        engine.stop(live.attempt_id, 0)
        wait_finished(engine, live.attempt_id)


def test_a_home_from_before_the_index_is_scanned_once_at_start(tmp_path: Path) -> None:
    attempts = tmp_path / "home" / "engine" / "attempts"
    attempts.mkdir(parents=True)
    (attempts / "5.1").mkdir()  # launched by an older version: live, no marker
    stale = time.time() - 60
    os.utime(attempts / "5.1", (stale, stale))
    (attempts / "6.1").mkdir()
    (attempts / "6.1" / "status.json").write_text("{}")
    engine = plain_engine(tmp_path / "home")
    assert engine.found_at_start == ["5.1"]  # then settled: its supervisor never ran
    assert engine.poll(["5.1"])["5.1"].phase is AttemptPhase.LOST
    assert engine.active_attempts() == []
    (attempts / "7.1").mkdir()  # no launch makes a dir without its marker: not scanned for again
    assert plain_engine(tmp_path / "home").found_at_start == []


def test_a_marker_without_its_dir_is_kept_while_young_and_cleared_once_stale(tmp_path: Path) -> None:
    """A launch between its marker and its mkdir (young), or one that died there (stale)."""
    engine = plain_engine(tmp_path / "home")
    index = engine.live_index
    index.add("3.1")
    index.add("4.1")
    old = time.time() - STALE_MARKER_S - 1
    os.utime(index.live_dir / "4.1", (old, old))
    assert engine.active_attempts() == []
    assert sorted(os.listdir(index.live_dir)) == [INDEXED, "3.1"]
    (engine.attempts_dir / "3.1").mkdir()  # the launch's claim, after its marker
    assert engine.active_attempts() == ["3.1"]
