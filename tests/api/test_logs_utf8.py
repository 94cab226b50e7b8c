"""A job's log read in chunks (the logs endpoint's `limit`, or `corral logs -f` while the job writes)
decodes to the text the job wrote: a character cut by a chunk's end is read whole with the next
chunk, never shown as U+FFFD halves (services/job_logs.read_logs over a stub engine and job)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from corral.engine.base import LogChunk
from corral.services.job_logs import read_logs

TEXT = "épreuve █▉▊ 損失=0.5 🚀 done\n" * 3


class StubEngine:
    def __init__(self, written: bytes, finished: bool) -> None:
        self.written, self.finished = written, finished

    def logs(self, attempt_id: str, instance: int = 0, offset: int = 0, limit: int = 1 << 20) -> LogChunk:
        data = self.written[offset : offset + limit]
        end = offset + len(data)
        return LogChunk(data, end, self.finished and end >= len(self.written))


def running_job() -> Any:
    attempt = SimpleNamespace(number=1, placement=[{"node": "n"}], attempt_id="a-1")
    return SimpleNamespace(id=7, state="running", attempts=[attempt], diagnosis=None)


def read_all(engine: StubEngine, limit: int) -> tuple[str, int]:
    text, offset = "", 0
    for _ in range(10_000):
        page = read_logs(engine, running_job(), attempt=None, rank=0, offset=offset, limit=limit)  # type: ignore[arg-type]
        text += page["data"]
        if page["eof"] or page["next_offset"] == offset:
            return text, page["next_offset"]
        offset = page["next_offset"]
    raise AssertionError("the log never ended")


@pytest.mark.parametrize("limit", [4, 5, 7, 64])
@pytest.mark.parametrize("finished", [True, False])
def test_a_log_read_in_chunks_is_the_text_the_job_wrote(limit: int, finished: bool) -> None:
    written = TEXT.encode()
    text, end = read_all(StubEngine(written, finished), limit)
    assert text == TEXT and end == len(written)


def test_a_character_half_written_is_read_once_it_is_whole() -> None:
    engine = StubEngine("ab█".encode()[:3], finished=False)  # the job flushed mid-character
    page = read_logs(engine, running_job(), attempt=None, rank=0, offset=0, limit=1 << 20)  # type: ignore[arg-type]
    assert (page["data"], page["next_offset"]) == ("ab", 2)
    engine.written = "ab█c".encode()
    page = read_logs(engine, running_job(), attempt=None, rank=0, offset=2, limit=1 << 20)  # type: ignore[arg-type]
    assert (page["data"], page["next_offset"]) == ("█c", 6)


def test_a_limit_under_a_characters_size_still_makes_progress() -> None:
    text, end = read_all(StubEngine("🚀".encode(), finished=False), limit=2)
    assert end == 4 and set(text) == {"\ufffd"}


def test_an_ended_log_cut_mid_character_is_shown_as_it_is() -> None:
    written = "ab█".encode()[:3]  # the job died mid-character: nothing more will come
    page = read_logs(StubEngine(written, True), running_job(), attempt=None, rank=0, offset=0, limit=64)  # type: ignore[arg-type]
    assert (page["data"], page["next_offset"], page["eof"]) == ("ab\ufffd", 3, True)
