"""The Slurm engine's attempt records come from memory while their file is unchanged (state.py),
never stale: a record rewritten behind the store's back (another server process sharing the state
dir) is read again, and a caller's changes to a loaded record do not leak into the next load."""

from __future__ import annotations

import json
import os
from dataclasses import fields
from pathlib import Path

import pytest

from corral.engine.base import AttemptPhase, AttemptStatus
from corral.engine.slurm.state import AttemptRecord, StateStore, StopRequest


def test_an_unchanged_record_comes_from_memory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = StateStore(tmp_path)
    store.save(AttemptRecord("1.1", slurm_job_id="41", n_ranks=2))
    reads: list[str] = []
    real_read = Path.read_text

    def counting_read(self: Path, *args: object, **kwargs: object) -> str:
        reads.append(self.name)
        return real_read(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "read_text", counting_read)
    for _ in range(5):
        record = store.load("1.1")
        assert record is not None and record.slurm_job_id == "41" and record.n_ranks == 2
    assert reads == []
    monkeypatch.undo()
    other = StateStore(tmp_path)  # a store that never read it reads the file
    monkeypatch.setattr(Path, "read_text", counting_read)
    assert other.load("1.1") is not None
    assert reads == ["attempt.json"]


def test_a_record_changed_by_another_process_is_read_again(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(AttemptRecord("1.1", slurm_job_id="41"))
    assert store.load("1.1") is not None
    other = StateStore(tmp_path)  # another server's store on the same dir
    changed = other.load("1.1")
    assert changed is not None
    changed.stop = StopRequest(requested_at=1.0, grace_s=5.0)
    other.save(changed)
    again = store.load("1.1")
    assert again is not None and again.stop is not None and again.stop.grace_s == 5.0
    # the same size and inode reuse do not fool it either: a rewrite in place with equal length
    path = tmp_path / "attempts" / "1.1" / "attempt.json"
    data = json.loads(path.read_text())
    data["slurm_job_id"] = "42"
    stat = os.stat(path)
    path.write_text(json.dumps(data, indent=1))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    reread = store.load("1.1")
    assert reread is not None and reread.slurm_job_id == "42"


def test_changes_to_a_loaded_record_stay_with_the_caller(tmp_path: Path) -> None:
    store = StateStore(tmp_path)
    store.save(AttemptRecord("1.1", slurm_job_id="41", stop=StopRequest(requested_at=1.0, grace_s=5.0)))
    record = store.load("1.1")
    assert record is not None and record.stop is not None
    record.slurm_job_id = "99"
    record.stop.killed = True
    fresh = store.load("1.1")
    assert fresh is not None and fresh.slurm_job_id == "41" and fresh.stop is not None
    assert fresh.stop.killed is False
    os.remove(tmp_path / "attempts" / "1.1" / "attempt.json")
    assert store.load("1.1") is None


def test_saves_make_no_directory_once_the_attempts_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three saves per attempt (before sbatch, its job id, its end): only the first makes the
    attempt's dir (before: a mkdir at every save); every field comes back to a new store."""
    store = StateStore(tmp_path)
    record = AttemptRecord("1.1", submitted_at=1.5, n_ranks=2, max_runtime_s=60.0, unix_user="u", uid=7)
    store.save(record)
    made: list[str] = []
    real_mkdir = os.mkdir

    def counting_mkdir(path: object, *args: object, **kwargs: object) -> None:
        made.append(str(path))
        real_mkdir(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "mkdir", counting_mkdir)
    record.slurm_job_id = "41"
    store.save(record)
    record.stop = StopRequest(requested_at=2.0, grace_s=5.0, kind="timeout", killed=True)
    record.set_final(AttemptStatus("1.1", AttemptPhase.FAILED, exit_code=3, message="m", engine_ref="41"))
    store.save(record)
    assert made == []
    assert StateStore(tmp_path).load("1.1") == record
    # the record is written field by field: one added to AttemptRecord must be written too
    saved = json.loads((tmp_path / "attempts" / "1.1" / "attempt.json").read_text())
    assert set(saved) == {f.name for f in fields(AttemptRecord)}
    names = sorted(p.name for p in (tmp_path / "attempts" / "1.1").iterdir())
    assert len(names) == 2 and names[0].startswith(".rec-") and names[1] == "attempt.json", names
