"""Builders for local-engine tests: an engine over a temp home with a private cgroup parent,
and a teardown that stops every attempt and removes the cgroups it made."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from corral.engine.local import LocalEngine
from corral.engine.local.process_files import cgroup_tops, read_text, rmdir_cgroup_tops

CGROUP_ROOT = Path("/sys/fs/cgroup")


@contextmanager
def local_engine_factory(
    home: Path,
    node: str = "node-a",
    isolation: bool = True,
    pids_max: int = 1024,
    job_network: str = "isolated",
    job_outbound: str = "none",
) -> Iterator[Callable[[], LocalEngine]]:
    parent = f"corral-test-{uuid.uuid4().hex[:8]}"
    made: list[LocalEngine] = []

    def factory() -> LocalEngine:
        eng = LocalEngine(
            home,
            node,
            virtual_gpus=4,
            isolation=isolation,
            cgroup_parent=parent,
            gang_grace_s=1.0,
            pids_max=pids_max,
            job_network=job_network,
            job_outbound=job_outbound,
        )
        made.append(eng)
        return eng

    try:
        yield factory
    finally:
        for eng in made:
            eng.close()
        cleanup(LocalEngine(home, node, virtual_gpus=4, isolation=False), parent)


def cleanup(engine: LocalEngine, cgroup_parent: str) -> None:
    engine.close()  # stops a launcher left by an engine whose process was killed
    active = engine.active_attempts()
    for aid in active:
        engine.stop(aid, 0)
    deadline = time.monotonic() + 10
    while engine.active_attempts() and time.monotonic() < deadline:
        engine.poll(active)
        time.sleep(0.02)
    remove_cgroup_tree(CGROUP_ROOT, cgroup_parent, wait_s=2.0)


def remove_cgroup_tree(cgroup_root: Path, parent: str, wait_s: float) -> None:
    """rmdir of every empty cgroup of a home's parent (each controller, v1 and v2), deepest
    first, the parent last: for the harness once it has killed the jobs. No server does this
    (its close removes the parent only, process_files.remove_empty_cgroups): an instance cgroup
    is empty between its launch and its process's join, which a server cannot rule out (another
    engine on the home, a supervisor a killed server had started). Those of running attempts
    refuse and stay, with the parent above them. The kernel may refuse for a moment after a
    cgroup's last process exits: retried for up to `wait_s`, but not while processes remain."""
    rmdir_cgroup_tops(cgroup_tops(cgroup_root, parent), _remove_tree, _populated, wait_s)


def _remove_tree(top: Path) -> None:
    for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
        try:
            os.rmdir(dirpath)
        except OSError:
            pass


def _populated(top: Path) -> bool:
    """Whether any cgroup in this subtree holds a process."""
    for dirpath, _dirs, files in os.walk(top):
        if "cgroup.procs" in files and read_text(Path(dirpath) / "cgroup.procs").strip():
            return True
    return False
