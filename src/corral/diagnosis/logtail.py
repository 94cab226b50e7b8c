"""The tail of an attempt's log, read in bounded time and memory through the engine interface.

The engine answers `logs(attempt, rank, offset, limit)`; its size is found by a binary search of
one-byte reads (about 40 calls, each a seek), then only the last `max_bytes` are read. So a log of
gigabytes costs the same as a small one, and invalid UTF-8 is replaced, never raised on.
"""

from __future__ import annotations

import re

from corral.engine.base import Engine

DEFAULT_TAIL_BYTES = 64 * 1024
_SIZE_LIMIT = 1 << 44  # 16 TiB: more than any log
_RANK = re.compile(r"\brank (\d+)\b")


def log_size(engine: Engine, attempt_id: str, rank: int) -> int:
    """Bytes in the log: the smallest offset at which a one-byte read comes back empty."""
    if not engine.logs(attempt_id, rank, 0, 1).data:
        return 0
    low, high = 1, 1
    while engine.logs(attempt_id, rank, high, 1).data:  # grow until past the end
        low, high = high + 1, high * 4
        if high > _SIZE_LIMIT:
            return _SIZE_LIMIT
    while low < high:  # the answer is in [low, high]: data at low - 1, none at high
        mid = (low + high) // 2
        if engine.logs(attempt_id, rank, mid, 1).data:
            low = mid + 1
        else:
            high = mid
    return low


def read_tail(engine: Engine, attempt_id: str, rank: int = 0, max_bytes: int = DEFAULT_TAIL_BYTES) -> str:
    """The last `max_bytes` of the rank's log as text (a split first character and invalid UTF-8
    replaced by U+FFFD)."""
    size = log_size(engine, attempt_id, rank)
    start = max(0, size - max_bytes)
    data = engine.logs(attempt_id, rank, start, max_bytes).data[:max_bytes] if size else b""
    return data.decode("utf-8", errors="replace")


def failing_rank(message: str) -> int:
    """The rank an engine's failure message names ("rank 3 exited with code 1"), else 0."""
    found = _RANK.search(message or "")
    return int(found.group(1)) if found else 0
