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
    tops = [CGROUP_ROOT / c / cgroup_parent for c in ("memory", "cpu", "pids", "devices")]
    for _ in range(40):  # the kernel may need a moment after the last child went away
        for top in tops:
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(dirpath)
                except OSError:
                    pass
        if not any(top.exists() for top in tops):
            return
        time.sleep(0.05)
