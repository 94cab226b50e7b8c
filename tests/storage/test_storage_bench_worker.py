"""The I/O worker of bench/storage_io.py: its page-cache check must be able to tell a cold file
from a warm one (else "cold reads, checked by mincore" would prove nothing), and one small run
reports every figure with nothing resident before its cold reads."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import storage_io_worker as worker


@pytest.fixture
def disk_dir() -> Iterator[Path]:
    # On a disk filesystem (/var/tmp), not a tmpfs /tmp: a tmpfs page cannot be dropped.
    path = Path(tempfile.mkdtemp(prefix="corral-io-worker-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path)


def test_mincore_tells_dropped_pages_from_resident_ones(disk_dir: Path) -> None:
    path = disk_dir / "f"
    path.write_bytes(os.urandom(256 * 1024))
    path.read_bytes()
    assert worker.resident_pages(str(path)) == 64  # just written and read: all 64 pages there
    assert worker.drop_cached([str(path)]) == 0
    assert worker.resident_pages(str(path)) == 0
    path.read_bytes()
    assert worker.resident_pages(str(path)) == 64


def test_one_run_reports_every_figure_with_cold_reads_cold(disk_dir: Path) -> None:
    out = subprocess.run(
        [sys.executable, worker.__file__, "io", str(disk_dir), "run", "20", "4"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert result["small_resident_pages_before_cold_read"] == 0
    assert result["large_resident_pages_before_cold_read"] == 0
    for key in ("small_write_iops", "small_read_cold_iops", "large_write_mbs", "large_read_warm_mbs"):
        assert result[key] > 0, key
    assert result["uid"] == os.getuid() and result["mount"].startswith("/")
    assert os.listdir(disk_dir) == []  # its files and work dir removed
