"""Lifecycle races: a long random walk over the steps of tests/server/test_lifecycle_stateful.py.

Submits, cancels, loop ticks of two servers (with their leases), launches reaching the engine,
attempts starting / exiting 0 or 1 / lost / acting on a stop, nodes lost and back, time passing,
server restarts, and ticks raced by another action right before one of their write transactions,
against the real services and loops on SQLite (default) or PostgreSQL (`--postgres`, started
here). A fresh world every `--episode` steps. After every step the invariants of
tests/server/lifecycle_world.py are checked: terminal states are final, no job runs after it
succeeded or was cancelled, no GPU is held twice, every job's event history is a legal path.

    python bench/lifecycle_races.py [--steps 5000] [--seed 1] [--episode 40] [--postgres] [--servers 2]

Prints the steps run, the distinct interleavings (distinct step-name sequences of the episodes)
and the violations by invariant (target: 0 each), with the shortest episode prefix that showed
each invariant's first violation; the last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "src"):  # corral (src layout) and the world under tests/
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from tests.server.lifecycle_world import GROUPS, INVARIANTS, LOOPS, NODES, World, reset_postgres  # noqa: E402

Step = tuple[str, tuple[object, ...]]
# step name -> weight: ticks and engine events dominate, as they do on a live server
WEIGHTS = {
    "submit": 6,
    "preempt": 3,
    "cancel": 3,
    "tick": 14,
    "raced_tick": 6,
    "cycle": 4,
    "launch": 5,
    "restart": 1,
    "engine": 6,
    "attempt_ends": 5,
    "node": 1,
    "advance": 3,
}
RACES = ("cancel", "exit0", "exit1", "lost", *LOOPS)


def draw(rng: random.Random) -> Step:
    name = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    server, pick = rng.randrange(2), rng.randrange(4)
    args: tuple[object, ...]
    if name == "submit":
        args = (
            rng.choice(GROUPS),
            rng.choice([2, 4]),
            rng.choice(["low", "normal", "high"]),
            rng.random() < 0.7,
        )
        args += (rng.randrange(2),)
    elif name == "preempt":
        args = (server, rng.choice(GROUPS), rng.choice(["normal", "high"]))
    elif name == "cancel":
        args = (pick,)
    elif name == "tick":
        args = (server, rng.choice(list(LOOPS)))
    elif name == "raced_tick":
        args = (server, rng.choice(list(LOOPS)), rng.randrange(3), rng.choice(RACES), pick, rng.randrange(2))
    elif name in ("cycle", "launch", "restart"):
        args = (server,)
    elif name == "engine":
        args = (rng.choice(["start", "start", "exit0", "exit1", "lost", "stop_takes_effect"]), pick)
    elif name == "attempt_ends":
        args = (rng.choice(["exit0", "exit1", "lost"]), pick, server)
    elif name == "node":
        args = (rng.choice(["lost", "back"]), rng.choice(NODES))
    else:
        args = (rng.choice([1.0, 3.0, 7.0, 11.0]),)
    return name, args


def replay_breaks(world: World, steps: list[Step], invariant: str) -> bool:
    """Whether `steps` (after the busy start) break `invariant` in a fresh world."""
    try:
        world.busy_cluster()
        for step in steps:
            world.do(*step)
            if any(v.invariant == invariant for v in world.check()):
                return True
        return False
    finally:
        world.close()


def shrink(new_world: Callable[[], World], steps: list[Step], invariant: str) -> list[Step]:
    """Drop steps one at a time while the rest still break `invariant` (replayed from scratch)."""
    i = 0
    while i < len(steps):
        candidate = steps[:i] + steps[i + 1 :]
        if replay_breaks(new_world(), candidate, invariant):
            steps = candidate
        else:
            i += 1
    return steps


def run(
    url_for_episode: Callable[[], str], home: Path, steps: int, seed: int, episode: int, servers: int
) -> dict[str, object]:
    rng = random.Random(seed)
    sequences: set[tuple[str, ...]] = set()
    violations: Counter[str] = Counter()
    first: dict[str, tuple[int, str, list[Step]]] = {}  # invariant -> (prefix length, detail, prefix)
    races = done = 0
    started = time.perf_counter()
    while done < steps:
        world = World(url_for_episode(), home, servers=servers)
        world.busy_cluster()
        history: list[Step] = []
        try:
            for _ in range(min(episode, steps - done)):
                step = draw(rng)
                history.append(step)
                world.do(*step)
                done += 1
                for v in world.check():
                    violations[v.invariant] += 1
                    if v.invariant not in first or len(history) < first[v.invariant][0]:
                        first[v.invariant] = (len(history), f"job {v.job_id}: {v.detail}", list(history))
            races += world.races_fired
        finally:
            world.close()
        sequences.add(tuple(name for name, _ in history))
    elapsed = time.perf_counter() - started
    return {
        "steps": done,
        "episodes": len(sequences) and -(-done // episode),
        "interleavings": len(sequences),
        "races_fired": races,
        "violations": {name: violations.get(name, 0) for name in INVARIANTS},
        "steps_per_s": round(done / elapsed, 1),
        "first": first,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--episode", type=int, default=40, help="steps per fresh database")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL (started here) instead of SQLite")
    parser.add_argument("--shrink", action="store_true", help="shrink each invariant's first failing episode")
    args = parser.parse_args()
    # The loops log what they handle (nodes gone silent, a batch retried one by one): not figures.
    logging.getLogger("corral").setLevel(logging.CRITICAL)
    home = Path(tempfile.mkdtemp(prefix="corral-races-"))
    pg = None
    try:
        if args.postgres:
            from tests.pg import PostgresServer, find_pg_bin

            bin_dir = find_pg_bin()
            if bin_dir is None:
                sys.exit("PostgreSQL (initdb/pg_ctl) is not installed")
            pg = PostgresServer(bin_dir)
            pg.start()
            url = pg.create_database()

            def next_url() -> str:
                reset_postgres(url)
                return url

        else:
            count = iter(range(1 << 30))

            def next_url() -> str:
                return f"sqlite:///{home}/db{next(count)}.sqlite"

        result = run(next_url, home, args.steps, args.seed, args.episode, args.servers)
        first = result["first"]
        assert isinstance(first, dict)
        if args.shrink:
            for name, (length, detail, prefix) in list(first.items()):
                small = shrink(lambda: World(next_url(), home, servers=args.servers), prefix, name)
                first[name] = (length, detail, small)
    finally:
        if pg is not None:
            pg.stop()
        shutil.rmtree(home, ignore_errors=True)
    first = result.pop("first")
    assert isinstance(first, dict)
    database = "postgresql" if args.postgres else "sqlite"
    print(f"database: {database}, servers: {args.servers}, seed: {args.seed}")
    print(f"steps: {result['steps']} in {result['episodes']} episodes ({result['steps_per_s']} steps/s)")
    print(
        f"distinct interleavings: {result['interleavings']}; raced ticks that fired: {result['races_fired']}"
    )
    violations = result["violations"]
    assert isinstance(violations, dict)
    for name in INVARIANTS:
        print(f"violations of {name}: {violations[name]} (target 0)")
        if name in first:
            length, detail, prefix = first[name]
            print(f"  first seen after {length} steps of an episode: {detail}")
            print(f"  a failing sequence of {len(prefix)} steps after busy_cluster():")
            for step_name, step_args in prefix:
                print(f"    {step_name}{step_args}")
    print(json.dumps({"database": database, "servers": args.servers, "seed": args.seed, **result}))


if __name__ == "__main__":
    main()
