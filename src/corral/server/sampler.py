"""A tiny wall-clock stack sampler for finding where the server's threads spend their time.

Enabled with CORRAL_PROFILE_SAMPLES=<file>: every 5 ms it records, for every thread, the
innermost frame that lies in Corral's own code (plus the innermost frame overall), and at shutdown
writes the most frequent ones to the file. Off by default; costs nothing when off.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from pathlib import Path
from types import FrameType

INTERVAL_S = 0.005


class StackSampler:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.counts: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    @classmethod
    def from_env(cls) -> StackSampler | None:
        target = os.environ.get("CORRAL_PROFILE_SAMPLES")
        return cls(Path(target)) if target else None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        me = threading.get_ident()
        names: dict[int | None, str] = {}
        while not self._stop.wait(INTERVAL_S):
            names = {t.ident: t.name for t in threading.enumerate()} if self.samples % 200 == 0 else names
            self.samples += 1
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                inner = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"
                ours = ""
                f: FrameType | None = frame
                while f is not None:
                    if "/corral/" in f.f_code.co_filename:
                        ours = f"{f.f_code.co_filename.rsplit('/', 1)[-1]}:{f.f_code.co_name}:{f.f_lineno}"
                        break
                    f = f.f_back
                self.counts[f"{names.get(ident, str(ident))} | {ours} | {inner}"] += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2)
        lines = [f"{self.samples} samples every {INTERVAL_S * 1000:.0f} ms at {time.ctime()}"]
        lines += [f"{n:7d}  {key}" for key, n in self.counts.most_common(80)]
        self.path.write_text("\n".join(lines) + "\n")
