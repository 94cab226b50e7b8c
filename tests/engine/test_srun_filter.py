"""The filter `corral exec` on Slurm runs srun under (engine/slurm/enter.SRUN_FILTER), driven by a
stand-in for srun that writes as srun does: it drops srun's own 'task 0: Exited' line, even when a
full pipe splits it across reads, and passes everything else, exit code included."""

from __future__ import annotations

import subprocess
import sys

from corral.engine.slurm.enter import SRUN_EXIT_LINE, SRUN_FILTER

SPLIT_LINE = r"""
import os, sys, time
os.write(2, b"x" * 70000)  # more than the pipe holds: the filter reads it in pieces
os.write(2, b"srun: error: node1: ta")
time.sleep(0.3)  # the rest of srun's line comes in a later read
os.write(2, b"sk 0: Exited with exit code 3\n")
os.write(2, b"srun: error: node1: unable to contact slurmd\n")
sys.exit(3)
"""


def _filtered(program: str) -> subprocess.CompletedProcess[bytes]:
    argv = [sys.executable, "-I", "-S", "-c", SRUN_FILTER, SRUN_EXIT_LINE.decode()]
    return subprocess.run([*argv, sys.executable, "-c", program], capture_output=True, timeout=30)


def test_srun_exit_line_split_across_reads_is_dropped_and_real_errors_pass() -> None:
    done = _filtered(SPLIT_LINE)
    assert done.returncode == 3
    assert done.stderr == b"x" * 70000 + b"srun: error: node1: unable to contact slurmd\n"


def test_unfinished_output_is_passed_when_the_command_ends() -> None:
    done = _filtered('import os; os.write(2, b"answer? "); os.write(2, b"srun: error: half")')
    assert done.returncode == 0
    assert done.stderr == b"answer? srun: error: half"
