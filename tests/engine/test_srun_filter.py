"""The filter `corral exec` on Slurm runs srun under (engine/slurm/enter.SRUN_FILTER), driven by a
stand-in for srun that writes as srun does: it drops srun's own 'task 0: Exited' line, even when a
full pipe splits it across reads (inside its "srun: error: " too), and passes everything else,
exit code included; what it holds back is bounded in size and in time."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time

from corral.engine.slurm.enter import SRUN_HOLD_BYTES, without_srun_exit_line

SPLIT_LINE = r"""
import os, sys, time
os.write(2, b"x" * 70000)  # more than the pipe holds: the filter reads it in pieces
os.write(2, b"srun: error: node1: ta")
time.sleep(0.3)  # the rest of srun's line comes in a later read
os.write(2, b"sk 0: Exited with exit code 3\n")
os.write(2, b"srun: error: node1: unable to contact slurmd\n")
sys.exit(3)
"""
SPLIT_PREFIX = r"""
import os, sys, time
os.write(2, b"x" * 70000)
os.write(2, b"srun: err")  # the read ends inside the prefix itself
time.sleep(0.3)
os.write(2, b"or: node1: task 0: Exited with exit code 3\n")
sys.exit(3)
"""
# writes `head`, then waits for its stdin to close before it ends
WAIT_AFTER = r"""
import os, sys
os.write(2, {head!r})
sys.stdin.buffer.read()
"""


def _filtered(program: str) -> subprocess.CompletedProcess[bytes]:
    argv = without_srun_exit_line([sys.executable, "-c", program])
    return subprocess.run(argv, capture_output=True, timeout=30)


def _shown_while_running(head: bytes, hold_seconds: float, want: int) -> tuple[bytes, bytes]:
    """What the filter passed on of `head` while its command still ran (read until `want` bytes
    came or 10 s passed), with what it holds passed on after `hold_seconds`; and all it passed."""
    argv = without_srun_exit_line([sys.executable, "-c", WAIT_AFTER.format(head=head)], hold_seconds)
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None and proc.stderr is not None
    shown, deadline = b"", time.monotonic() + 10
    try:
        while len(shown) < want and (left := deadline - time.monotonic()) > 0:
            if select.select([proc.stderr], [], [], left)[0]:
                shown += os.read(proc.stderr.fileno(), 1 << 16)
    finally:
        proc.stdin.close()
        rest = proc.stderr.read()  # once it ended
        proc.wait(timeout=30)
    return shown, shown + rest


def test_srun_exit_line_split_across_reads_is_dropped_and_real_errors_pass() -> None:
    done = _filtered(SPLIT_LINE)
    assert done.returncode == 3
    assert done.stderr == b"x" * 70000 + b"srun: error: node1: unable to contact slurmd\n"


def test_srun_exit_line_split_inside_its_prefix_is_dropped() -> None:
    done = _filtered(SPLIT_PREFIX)
    assert done.returncode == 3
    assert done.stderr == b"x" * 70000


def test_unfinished_output_is_passed_when_the_command_ends() -> None:
    done = _filtered('import os; os.write(2, b"answer? "); os.write(2, b"srun: error: half")')
    assert done.returncode == 0
    assert done.stderr == b"answer? srun: error: half"


def test_what_is_held_back_is_bounded_in_size() -> None:
    head = b"srun: error: " + b"p" * 2000  # could still be srun's line, but longer than one
    assert len(head) > SRUN_HOLD_BYTES
    # past the bound it can no longer be srun's line: shown at once, long before the 60 s hold
    during, whole = _shown_while_running(head, hold_seconds=60, want=len(head))
    assert during == head
    assert whole == head


def test_what_is_held_back_is_passed_on_when_nothing_more_comes() -> None:
    for head in (b"Continue? yes", b"srun: error: see above\r 50%"):  # a prompt, a progress bar
        during, whole = _shown_while_running(head, hold_seconds=0.2, want=len(head))
        assert during == head
        assert whole == head
