"""The local engine's index of the attempts that may still run: one empty marker file per attempt,
`<home>/engine/live/<attempt_id>`, so that listing them (`LocalEngine.active_attempts`, which the
server's sweep calls every 5 s) costs the live attempts, not every attempt dir the node keeps (tens
of thousands of finished ones until retention removes them): the attempts dir is never listed.

Crash-safe by order, so no attempt dir without `status.json` ever lacks its marker:
- a launch makes the marker before the attempt's dir (its atomic claim), and again after it;
- a marker is removed when its attempt's `status.json` is seen (final: an attempt never runs
  again, a retry is a new attempt), by the listing that sees it: finished attempts' markers go
  lazily, each once;
- a marker whose attempt has no dir is a launch between its marker and its mkdir, one that died
  there, or an attempt removed (retention): removed only once older than `STALE_MARKER_S`, and
  restored when the dir turns out to exist after the removal (a launch that re-used a stale
  marker's name then; its marker after the mkdir covers the rest).
A home from before the index (no `live/.indexed`) is scanned once, at engine start: every attempt
dir without `status.json` gets a marker, then `.indexed` is written (a crash in between scans
again; attempt ids never start with '.').
"""

from __future__ import annotations

import os
import time
from pathlib import Path

FINAL = "status.json"
INDEXED = ".indexed"
STALE_MARKER_S = 60.0


class LiveIndex:
    def __init__(self, attempts_dir: Path, live_dir: Path) -> None:
        self.attempts_dir = attempts_dir
        self.live_dir = live_dir
        live_dir.mkdir(parents=True, exist_ok=True)
        if not (live_dir / INDEXED).exists():
            self._index_existing()

    def _index_existing(self) -> None:
        """The one full scan: attempt dirs made by a version without the index."""
        with os.scandir(self.attempts_dir) as entries:
            for entry in entries:
                if entry.is_dir() and not os.path.exists(os.path.join(entry.path, FINAL)):
                    self.add(entry.name)
        (self.live_dir / INDEXED).touch()

    def add(self, attempt_id: str) -> None:
        """Marks the attempt live (its marker made, or its mtime renewed: fresh, not stale)."""
        marker = self.live_dir / attempt_id
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            try:
                os.utime(marker)
            except FileNotFoundError:  # cleared as stale meanwhile
                self.add(attempt_id)

    def ensure(self, attempt_id: str) -> None:
        """After a launch's mkdir: its marker is there, or made again (module docstring)."""
        if not os.path.exists(self.live_dir / attempt_id):
            self.add(attempt_id)

    def discard(self, attempt_id: str) -> None:
        try:
            os.unlink(self.live_dir / attempt_id)
        except FileNotFoundError:
            pass

    def live(self) -> list[str]:
        """The attempts with a dir and no `status.json`, from the markers alone; clears those
        of finished attempts and stale ones (module docstring)."""
        out: list[str] = []
        now = time.time()
        with os.scandir(self.live_dir) as entries:
            markers = [(e.name, e.path) for e in entries if not e.name.startswith(".")]
        for name, marker in markers:
            adir = os.path.join(self.attempts_dir, name)
            if os.path.exists(os.path.join(adir, FINAL)):
                self.discard(name)
            elif os.path.isdir(adir):
                out.append(name)
            else:
                self._clear_if_stale(name, marker, adir, now)
        return sorted(out)

    def _clear_if_stale(self, name: str, marker: str, adir: str, now: float) -> None:
        try:
            if now - os.stat(marker).st_mtime <= STALE_MARKER_S:
                return  # a launch between its marker and its mkdir, most likely
        except FileNotFoundError:
            return
        self.discard(name)
        if os.path.isdir(adir) and not os.path.exists(os.path.join(adir, FINAL)):
            self.add(name)  # a launch of this name made its dir meanwhile: it stays listed
