"""CORRAL_PROFILE_OUT: every thread started after `start()` is profiled, and `write()` merges them
into one pstats file (bench/job_latency.py --profile reads it); unset, nothing is profiled."""

from __future__ import annotations

import pstats
import threading
from pathlib import Path

import pytest

from corral.server import profiling


def busy_in_a_thread() -> None:
    sum(i * i for i in range(20_000))


def busy_in_main() -> None:
    sum(i * i for i in range(20_000))


def test_profile_covers_threads_started_later(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "server.pstats"
    monkeypatch.setenv(profiling.ENV, str(out))
    monkeypatch.setattr(profiling, "_profiles", [])
    assert profiling.start()
    try:
        worker = threading.Thread(target=busy_in_a_thread)
        worker.start()
        worker.join()
        busy_in_main()
    finally:
        profiling.write()
    functions = {name for (_file, _line, name) in pstats.Stats(str(out)).stats}  # type: ignore[attr-defined]
    assert "busy_in_a_thread" in functions
    assert "busy_in_main" in functions  # the thread that started profiling


def test_off_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(profiling.ENV, raising=False)
    assert not profiling.start()
    profiling.write()  # a no-op
