"""The Slurm engine's `rank_node` on its own (no cluster needed; the end-to-end case is
tests/slurm/test_slurm_users.py::test_exec_never_follows_nor_waits_on_the_rank_script_the_user_swaps):
the rank script lives in the job account's dir, so the root server reads it without following a
symlink, without waiting on a FIFO, only as a plain file of the job's uid, and takes from it only
what looks like a node name (review104, finding 5)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from corral.engine.base import ExecRefused
from corral.engine.slurm.enter import rank_node

HEADER = "#!/bin/sh\n# rank 0: role main index 0 on {node}\nD=/x\n"
REFUSED = "rank 0: its script in the job dir is not a plain file of the job's"


def test_the_node_of_a_plain_script_and_none_of_a_missing_or_odd_one(tmp_path: Path) -> None:
    me = os.getuid()
    assert rank_node(tmp_path, 0, me) == ""  # not written yet
    (tmp_path / "rank-0.sh").write_text(HEADER.format(node="node1"))
    assert rank_node(tmp_path, 0, me) == "node1"
    (tmp_path / "rank-0.sh").write_text(HEADER.format(node="node1,--uid=0 x"))
    assert rank_node(tmp_path, 0, me) == ""  # no node name: nothing handed to srun


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "rank-0.sh"
    os.mkfifo(fifo)
    answer: list[BaseException | str] = []

    def read(into: list[BaseException | str]) -> None:
        try:
            into.append(rank_node(tmp_path, 0, os.getuid()))
        except BaseException as exc:  # the answer, whatever it is, for the assertions below
            into.append(exc)

    thread = threading.Thread(target=read, args=(answer,), daemon=True)
    thread.start()
    thread.join(5)
    if thread.is_alive():  # blocked in open(): let it go before failing, no thread left behind
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert not thread.is_alive() and len(answer) == 1, "rank_node waited on a FIFO"
    assert isinstance(answer[0], ExecRefused) and REFUSED in str(answer[0]), answer


def test_a_symlink_is_not_followed_and_nothing_of_its_target_is_shown(tmp_path: Path) -> None:
    secret = tmp_path / "root-only"
    secret.write_text("first\nroot-only-data on LEAKED-VALUE\n")
    secret.chmod(0o600)
    (tmp_path / "rank-0.sh").symlink_to(secret)
    with pytest.raises(ExecRefused) as refused:
        rank_node(tmp_path, 0, os.getuid())
    assert REFUSED in str(refused.value) and "LEAKED" not in str(refused.value)


def test_another_uids_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "rank-0.sh").write_text(HEADER.format(node="LEAKED-VALUE"))
    with pytest.raises(ExecRefused) as refused:
        rank_node(tmp_path, 0, os.getuid() + 1)
    assert REFUSED in str(refused.value) and "LEAKED" not in str(refused.value)
