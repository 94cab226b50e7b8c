"""The full API fuzz run: schemathesis (all checks, every phase: examples, coverage, fuzzing and
stateful over the links the schema declares) against a real Corral server (uvicorn, the local
engine; SQLite, or PostgreSQL with --postgres), as a plain member and as an admin.

    .venv/bin/python bench/fuzz_api.py                   # >= 5,000 cases, SQLite
    .venv/bin/python bench/fuzz_api.py --max-examples 30 --postgres

The stateful phase runs on its own after the others, for --stateful-time seconds of suite after
suite (schemathesis ends one suite at Hypothesis's first "inconsistent data generation", after
20-30 scenarios). The server has an empty local package index (environments can be created),
and the run first makes the escalation policy the schema's example page names and portal
sessions to list (tests/fuzz_run.py).

Prints the cases per operation, failures by check (target 0), server errors (target 0), 4xx
answers without a readable body (target 0), the accepted exceptions (tests/fuzz_hooks.py, each
with why), links covered out of declared and the wall time; ends with one JSON line.

Guards, so that fuzzing as an admin does not wedge the server it tests:
- the tokens the runs authenticate with cannot be revoked by them (tests/fuzz_hooks.py sends a
  generated `DELETE /tokens/{id}` naming one to an id that does not exist): a revoked token
  would turn the rest of the run into 401s;
- there is no operation that deletes or deactivates a user, so the admin cannot remove itself;
  a password change (`PUT /users/admin/password`) does not touch tokens;
- rows are bounded by the number of cases (each creates at most one user, group, token, key or
  job), and the API's own limits cap bodies (1 MiB), list sizes and submission rates (429s are
  documented answers, not failures);
- jobs the fuzzer submits run in the sandbox like any user's; the server has 2 virtual GPUs, so
  at most a few run at once and the rest queue.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fuzz_hooks import ACCEPTED  # noqa: E402
from tests.fuzz_run import FuzzResult, fuzz_server_env, run_as_member_and_admin  # noqa: E402
from tests.server_harness import start_server  # noqa: E402

TARGET_CASES = 5000


def _print_run(result: FuzzResult) -> None:
    print(f"\n== as {result.who}: {result.cases} cases, {result.requests} requests, {result.wall_s:.0f} s")
    width = max((len(op) for op in result.requests_by_operation), default=10)
    for op, count in sorted(result.requests_by_operation.items()):
        print(f"  {op:<{width}}  {count:6d}")
    print(f"  failures by check: {result.failures or 'none'}")
    for check, operations in result.failing_operations.items():
        print(f"    {check}: {', '.join(operations)}")
    unreadable = sum(result.unreadable_4xx.values())
    print(f"  server errors (5xx): {result.server_errors}   unreadable 4xx: {unreadable}")
    print(f"  accepted exceptions: {result.accepted or 'none'}")
    print(f"  links covered: {result.links_covered} / {result.links_total} declared")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-examples", type=int, default=30, help="per operation and phase")
    parser.add_argument("--stateful-steps", type=int, default=12, help="steps per stateful scenario")
    parser.add_argument(
        "--stateful-examples", type=int, default=150, help="stateful scenarios per suite (60 links)"
    )
    parser.add_argument(
        "--stateful-time",
        type=int,
        default=60,
        help="seconds of stateful suites, run after the other phases (0: one suite with them)",
    )
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--workers", type=int, default=2, help="schemathesis workers per identity")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    parser.add_argument("--phases", default="examples,coverage,fuzzing,stateful")
    parser.add_argument("--output-dir", type=Path, help="write each identity's schemathesis output here")
    return parser.parse_args()


def main() -> int:
    args = parse_args()
    pg = None
    database_url = None
    if args.postgres:
        from tests.pg import PostgresServer, find_pg_bin

        pg_bin = find_pg_bin()
        if pg_bin is None:
            raise SystemExit("--postgres: no PostgreSQL binaries found (apt install postgresql)")
        pg = PostgresServer(pg_bin)
        pg.start()
        database_url = pg.create_database("fuzz")
    started = time.perf_counter()
    server = start_server(virtual_gpus=2, database_url=database_url, extra_env=fuzz_server_env())
    try:
        results, tokens = run_as_member_and_admin(
            server.url,
            server.token,
            max_examples=args.max_examples,
            seed=args.seed,
            workers=args.workers,
            stateful_steps=args.stateful_steps,
            stateful_examples=args.stateful_examples,
            stateful_time_s=args.stateful_time,
            phases=tuple(args.phases.split(",")),
            timeout_s=3600,
        )
        alive = {who: _still_authenticated(server.url, token) for who, token in tokens.items()}
    finally:
        if args.output_dir is not None:  # the tracebacks of any server error
            args.output_dir.mkdir(parents=True, exist_ok=True)
            (args.output_dir / "server.log").write_text(server.log_text())
        server.stop()
        if pg is not None:
            pg.stop()
    wall = time.perf_counter() - started

    for result in results:
        _print_run(result)
        if args.output_dir is not None:
            args.output_dir.mkdir(parents=True, exist_ok=True)
            (args.output_dir / f"schemathesis-{result.who}.txt").write_text(result.output)
    cases = sum(r.cases for r in results)
    failures: Counter[str] = Counter()
    for r in results:
        failures.update(r.failures)
    summary = {
        "bench": "fuzz_api",
        "database": "postgresql" if args.postgres else "sqlite",
        "seed": args.seed,
        "max_examples": args.max_examples,
        "cases": cases,
        "requests": sum(r.requests for r in results),
        "cases_by_identity": {r.who: r.cases for r in results},
        "operations": len(set().union(*(r.requests_by_operation for r in results)) - {"undeclared methods"}),
        "failures": sum(failures.values()),
        "failures_by_check": dict(failures),
        "server_errors": sum(r.server_errors for r in results),
        "unreadable_4xx": sum(sum(r.unreadable_4xx.values()) for r in results),
        "errored_cases": sum(r.errors for r in results),
        "accepted_exceptions": {r.who: r.accepted for r in results},
        "accepted_exception_kinds": len(ACCEPTED),
        "links_covered": {r.who: r.links_covered for r in results},
        "links_declared": max(r.links_total for r in results),
        "tokens_still_valid": alive,
        "wall_s": round(wall, 1),
    }
    print(f"\ncases: {cases} (target >= {TARGET_CASES}); failures: {summary['failures']} (target 0); "
          f"server errors: {summary['server_errors']} (target 0); wall {wall:.0f} s")  # fmt: skip
    print(json.dumps(summary))
    ok = cases >= TARGET_CASES and summary["failures"] == 0 and summary["server_errors"] == 0
    return 0 if ok else 1


def _still_authenticated(base_url: str, token: str) -> bool:
    import httpx

    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {token}"}) as c:
        return c.get("/api/v1/me").status_code == 200


if __name__ == "__main__":
    sys.exit(main())
