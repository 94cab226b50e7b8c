"""What the local engine's `active_attempts()` (the sweep's listing, every 5 s) costs on a node
that keeps many finished attempts: the live index (engine/local/live_index.py) against the
baseline, a scan of every attempt dir for its status.json (the listing before the index),
measured in the same run on the same files. Also the index's one-time scan of a home from
before it, at engine start.

    python bench/live_listing.py [--finished 20000] [--live 20] [--rounds 5]

Last line: JSON with the best of the rounds in ms and the ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from corral.engine.local.live_index import LiveIndex  # noqa: E402


def best_ms(listing: Callable[[], list[str]], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        started = time.perf_counter()
        listing()
        times.append(time.perf_counter() - started)
    return min(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--finished", type=int, default=20000)
    parser.add_argument("--live", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="corral-live-bench-"))
    try:
        attempts = home / "attempts"
        attempts.mkdir()
        for n in range(args.finished):
            (attempts / f"{n}.1").mkdir()
            (attempts / f"{n}.1" / "status.json").write_text("{}")
        for n in range(args.finished, args.finished + args.live):
            (attempts / f"{n}.1").mkdir()
        started = time.perf_counter()
        index = LiveIndex(attempts, home / "live")
        start_scan_ms = (time.perf_counter() - started) * 1e3

        def scan() -> list[str]:  # the listing before the index
            return sorted(
                d.name for d in attempts.iterdir() if d.is_dir() and not (d / "status.json").exists()
            )

        assert scan() == index.live() and len(index.live()) == args.live
        baseline, indexed = best_ms(scan, args.rounds), best_ms(index.live, args.rounds)
        print(f"{args.finished} finished, {args.live} live attempt dirs")
        print(f"scan of every dir (before): {baseline:.2f} ms; live index: {indexed:.3f} ms")
        print(f"the index's one-time scan of a home from before it: {start_scan_ms:.1f} ms")
        out: dict[str, float | None] = {
            "scan_ms": round(baseline, 3),
            "index_ms": round(indexed, 3),
            "start_scan_ms": round(start_scan_ms, 1),
        }
        out["ratio"] = round(baseline / indexed, 1) if indexed else None
        print(json.dumps(out))
    finally:
        shutil.rmtree(home, ignore_errors=True)


if __name__ == "__main__":
    main()
