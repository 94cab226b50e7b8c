"""What a job's own network namespace costs the supervisor per attempt, without queueing noise.

Each round forks a child that does what a supervisor does before it starts its instances, and
times it inside the child: `none` = unshare(CLONE_NEWNET) + lo up (netns.enter_new_namespace);
`internet` = that + slirp4netns attached and ready (netns.start_slirp; its teardown, at the
attempt's end, is not timed); the
baseline = the fork alone (a supervisor in the host network does nothing here). ctypes is
imported first, as the launcher does for its supervisors. Needs root and slirp4netns.

    python bench/netns_setup.py [--rounds 50]

Last line: JSON with p50/p90/min in ms per mode and the cost over the baseline at p50.
"""

from __future__ import annotations

import argparse
import ctypes  # noqa: F401 - preloaded, as in the launcher
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from corral.engine.isolation import netns  # noqa: E402


def one_round(mode: str, slirp: str, log_path: str) -> float:
    """Seconds the child spent on the set-up of `mode`, measured in the child."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            os.close(read_fd)
            t0 = time.perf_counter()
            slirp_proc = None
            if mode != "baseline":
                host_ns = netns.enter_new_namespace()
                if mode == "internet":
                    slirp_proc = netns.start_slirp(slirp, host_ns, log_path)
                os.close(host_ns)
            os.write(write_fd, repr(time.perf_counter() - t0).encode())
            netns.teardown(slirp_proc)  # at the attempt's end: not on the start's path
        except BaseException as exc:
            print(f"{mode}: {exc}", file=sys.stderr)
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    data = os.read(read_fd, 64)
    os.close(read_fd)
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        raise SystemExit(f"{mode}: the child failed (status {status})")
    return float(data)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args(argv)
    slirp = shutil.which("slirp4netns")
    if os.geteuid() != 0 or slirp is None or args.rounds < 1:
        raise SystemExit("needs root, slirp4netns on PATH and --rounds >= 1")
    log_path = os.path.join(tempfile.mkdtemp(prefix="corral-netns-bench-"), "slirp.log")
    modes = ("baseline", "none", "internet")
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.rounds):  # interleaved: the shared machine's load hits all modes alike
        for mode in modes:
            times[mode].append(one_round(mode, slirp, log_path) * 1000)
    out: dict[str, float | int] = {"rounds": args.rounds, "load_avg_1m": round(os.getloadavg()[0], 2)}
    print(f"{'':10}{'p50 ms':>10}{'p90 ms':>10}{'min ms':>10}")
    for mode in modes:
        xs = sorted(times[mode])
        p50, p90 = statistics.median(xs), xs[int(0.9 * (len(xs) - 1))]
        out.update(
            {
                f"{mode}_p50_ms": round(p50, 3),
                f"{mode}_p90_ms": round(p90, 3),
                f"{mode}_min_ms": round(xs[0], 3),
            }
        )
        print(f"{mode:10}{p50:10.2f}{p90:10.2f}{xs[0]:10.2f}")
    for mode in ("none", "internet"):
        out[f"{mode}_cost_p50_ms"] = round(float(out[f"{mode}_p50_ms"]) - float(out["baseline_p50_ms"]), 3)
    print(
        f"cost per attempt start (p50 over baseline): none {out['none_cost_p50_ms']} ms, "
        f"internet {out['internet_cost_p50_ms']} ms; load average {out['load_avg_1m']}"
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
