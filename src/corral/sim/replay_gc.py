"""Full garbage collections held back while replays run (`Simulator.run`)."""

from __future__ import annotations

import gc
import threading

# Full garbage collections during a replay: Python's own rule runs one after every 10 collections
# of the middle generation (once a quarter more objects than the last full one left have
# survived), and each walks every long-lived object: the trace's jobs and every job's state,
# hundreds of thousands on Philly (0.6 of the replay's 0.85 s of collection on the whole trace,
# measured). The replay makes few reference cycles (the scheduler drops its own each cycle), so
# while one runs full collections wait for this many middle-generation ones; the young ones run as
# usual, and Python's settings are restored when the last running replay ends (a module-level
# count: replays in several threads share the setting). It changes no result: collection only
# frees objects nothing can reach.
FULL_COLLECTION_EVERY = 1000
_gc_lock = threading.Lock()
_gc_replays = 0  # replays running now
_gc_saved = (0, 0, 0)  # Python's thresholds before the first of them


def defer_full_collections() -> None:
    global _gc_replays, _gc_saved
    with _gc_lock:
        if _gc_replays == 0:
            _gc_saved = gc.get_threshold()
            young, middle, full = _gc_saved
            gc.set_threshold(young, middle, max(full, FULL_COLLECTION_EVERY))
        _gc_replays += 1


def restore_full_collections() -> None:
    global _gc_replays
    with _gc_lock:
        _gc_replays -= 1
        if _gc_replays == 0:
            gc.set_threshold(*_gc_saved)
