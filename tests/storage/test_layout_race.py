"""prepare_dirs under the launch pool: two launches of one user at once (real dirs, real chown)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from corral.storage.layout import StorageDir, prepare_dirs


@pytest.mark.skipif(os.geteuid() != 0, reason="hands dirs over to another uid: needs root")
def test_two_launches_of_one_user_preparing_their_dirs_at_once_both_succeed(tmp_path: Path) -> None:
    """The launch pool prepares several launches at once: a user dir the other launch has just
    made (root's until its chown) must not be read as a deleted user's and moved aside."""
    failures: list[BaseException] = []
    for round_ in range(150):
        home = tmp_path / str(round_) / "alice"
        home.parent.mkdir()
        start = threading.Barrier(2)

        def prepare(home: Path = home, start: threading.Barrier = start) -> None:
            start.wait()
            try:
                prepare_dirs([StorageDir(str(home), "user", None, 0o700)], 300123, 300123)
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=prepare) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(os.listdir(home.parent)) == ["alice"], round_
        assert os.stat(home).st_uid == 300123
    assert failures == []
