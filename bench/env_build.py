"""Environment builds and job starts in an environment, on a real server (local engine, sandboxed):

- cold: the first build of an environment (resolve, venv, install; a fresh uv cache), POST to ready;
- warm: the same requirements again as another environment: the lock's key is in the store, so the
  build job resolves, finds it and installs nothing (a cache hit), POST to ready;
- job start: submit -> running of the same trivial job (`date +%s.%N`, then `python -c` printing
  its clock) in the default environment (the baseline, the server's interpreter) and in the built
  one, measured in the same run; the difference is what binding a catalogue environment costs.

The packages come from the wheelhouse scripts/setup.sh fetches (.venv/wheelhouse: numpy and
scikit-learn, as the demo's `sklearn` environment), or with --small a one-module wheel made here.

    python bench/env_build.py [--small] [--jobs 10]

Last line: one JSON object (cold_build_s, warm_build_s, cache_hit, and p50 submit->running in ms for
the default and the built environment: shell and python).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "src"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from corral.sdk import Client  # noqa: E402
from tests.environments.wheels import make_wheel  # noqa: E402
from tests.server_harness import start_server  # noqa: E402

WHEELHOUSE = ROOT / ".venv" / "wheelhouse"
COMMAND = "date +%s.%N; python -c 'import time; print(f\"{time.time():.6f}\")'"


def build(c: Client, name: str, requirements: str) -> tuple[float, dict[str, Any]]:
    start = time.time()
    v = c.create_environment(name, requirements)
    v = c.wait_environment(name, v["version"], timeout_s=900, poll_s=0.1)
    if v["state"] != "ready":
        raise SystemExit(f"{name}: build failed: {v['error']}")
    return time.time() - start, v


def job_starts(c: Client, environment: str, jobs: int) -> tuple[list[float], list[float]]:
    """submit -> the shell's clock, and submit -> python's clock, per job (seconds)."""
    shell, python = [], []
    for i in range(jobs):
        spec = {
            "name": f"start-{i}",
            "environment": environment,
            "command": COMMAND,
            "resources": {"cpus": 0.25, "memory": "256MiB"},
        }
        submitted = time.time()
        job = c.wait(c.submit(spec)["id"], timeout_s=120, poll_s=0.05)
        out = c.logs(job["id"])["data"].split()
        if job["state"] != "succeeded" or len(out) < 2:
            raise SystemExit(f"job in {environment} failed: {out}")
        shell.append(float(out[0]) - submitted)
        python.append(float(out[1]) - submitted)
    return shell, python


def ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1000, 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--small", action="store_true", help="a one-module wheel instead of scikit-learn")
    parser.add_argument("--jobs", type=int, default=10, help="jobs per environment for the start figures")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="corral-envbench-") as tmp:
        base = Path(tmp)
        if args.small or not any(WHEELHOUSE.glob("*.whl")):
            wheels, requirements = base / "wheels", "benchpkg==1.0\n"
            make_wheel(wheels, "benchpkg", "1.0", "VALUE = 1\n")
        else:
            wheels, requirements = WHEELHOUSE, "numpy==2.4.6\nscikit-learn==1.9.1\n"
        srv = start_server(
            base / "home", allow_unisolated=False, extra_env={"CORRAL_ENV_FIND_LINKS": str(wheels)}
        )
        try:
            admin = Client(srv.url, srv.token)
            admin.create_group("bench")
            admin.create_user("alice", groups=["bench"], default_group="bench")
            alice = Client(srv.url, admin.create_token("alice-t", user="alice")["token"])
            cold_s, cold = build(alice, "bench", requirements)
            warm_s, warm = build(alice, "bench-again", requirements)
            default_shell, default_py = job_starts(alice, "default", args.jobs)
            env_shell, env_py = job_starts(alice, "bench", args.jobs)
        finally:
            srv.stop()
    packages = len((cold["lock"] or "").split())
    print(f"environment: {requirements.strip()!r} -> {packages} packages (wheels: {wheels})")
    print(f"{'build':<28}{'POST -> ready (s)':>20}{'cache hit':>12}")
    print(f"{'cold (first build)':<28}{cold_s:>20.2f}{cold['cache_hit']!s:>12}")
    print(f"{'warm (same lock again)':<28}{warm_s:>20.2f}{warm['cache_hit']!s:>12}")
    print(f"\njob start, p50 of {args.jobs} jobs (ms)   {'default (baseline)':>20}{'built env':>12}")
    print(f"{'submit -> shell runs':<38}{ms(default_shell):>20}{ms(env_shell):>12}")
    print(f"{'submit -> python runs':<38}{ms(default_py):>20}{ms(env_py):>12}")
    result = {
        "packages": packages,
        "cold_build_s": round(cold_s, 2),
        "warm_build_s": round(warm_s, 2),
        "cache_hit": warm["cache_hit"],
        "default_shell_p50_ms": ms(default_shell),
        "env_shell_p50_ms": ms(env_shell),
        "default_python_p50_ms": ms(default_py),
        "env_python_p50_ms": ms(env_py),
        "env_start_overhead_ms": round(ms(env_py) - ms(default_py), 1),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
