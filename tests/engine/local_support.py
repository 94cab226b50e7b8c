"""Builders for local-engine tests: an engine over a temp home with a private cgroup parent,
and a teardown that stops every attempt and removes the cgroups it made."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from corral.engine.local import LocalEngine
from corral.engine.local.process_files import remove_empty_cgroups

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
    remove_empty_cgroups(CGROUP_ROOT, cgroup_parent, wait_s=2.0, deep=True)
