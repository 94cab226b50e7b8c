"""CPU of one sandbox start, by the parts of its command line: what `bwrap ... setpriv ... sh -c true`
costs with the job's /etc bound entry by entry from the host (as before etc_base.py) and as one
bind of the engine's prepared copy (isolation/etc_base.py), next to `sh -c true` alone.

Each start runs in a forked child that moves itself into a cgroup-v1 cpuacct group first, so
bwrap, its init, setpriv and the shell are all counted (getrusage would miss bwrap's pid-1 child).
Variants are interleaved (round i runs each once) so load changes hit them alike. Root and
cgroup v1 cpuacct only. The binds are those of a server-launched job: the default environment
(Corral's interpreter, virtualenv and source), a work dir, home, group and outputs dirs.

    python bench/sandbox_start_cpu.py [--runs 80]

Last line: JSON {variant: {"cpu_ms_mean", "cpu_ms_p50", "wall_ms_p50"}}.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from corral.engine.isolation.etc_base import EtcBase
from corral.engine.isolation.sandbox import ETC_WHITELIST, SandboxSpec, bwrap_argv, probe, write_etc
from corral.engine.local.engine import _default_environments

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


def argvs(root: Path) -> dict[str, list[str]]:
    status = probe()
    if not status.sandbox or status.bwrap is None or status.setpriv is None:
        raise SystemExit(f"no sandbox here: {status.summary()}")
    dirs = {n: root / n for n in ("work", "home", "group", "outputs")}
    for d in dirs.values():
        d.mkdir()
    etc = write_etc(root / "etc", "bench", 300000)
    spec = SandboxSpec(
        command="true",
        work_dir=str(dirs["work"]),
        uid=300000,
        etc_files=etc,
        env_paths=_default_environments()["default"],
        mounts=[
            (str(dirs["home"]), "/home/bench", False),
            (str(dirs["group"]), "/group/default", False),
            (str(dirs["outputs"]), "/outputs", False),
        ],
        gids=(400000,),
    )
    base = EtcBase(root / "etc-base", ETC_WHITELIST).path()
    return {
        "sh": ["/bin/sh", "-c", "true"],
        "host_etc_binds": bwrap_argv(status.bwrap, status.setpriv, spec),
        "etc_base": bwrap_argv(status.bwrap, status.setpriv, dataclasses.replace(spec, etc_base=base)),
    }


def run_once(argv: list[str], group: Path, report_w: int) -> float:
    """Wall ms of one start of `argv`; its CPU (ns) goes down `report_w` as one line."""
    t0 = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        (group / "cgroup.procs").write_text(str(os.getpid()))
        before = int((group / "cpuacct.usage").read_text())
        child = os.fork()
        if child == 0:
            os.execv(argv[0], argv)
        _, status = os.waitpid(child, 0)
        time.sleep(0.003)  # bwrap's init leaves a moment after bwrap
        os.write(report_w, f"{int((group / 'cpuacct.usage').read_text()) - before}\n".encode())
        os._exit(0 if status == 0 else 1)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        raise SystemExit(f"{argv[:3]}... failed")
    return (time.perf_counter() - t0) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=80, help="starts per variant (default 80)")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, not {args.runs}")
    if not (CPUACCT / "cpuacct.usage").exists() or os.geteuid() != 0:
        print("needs root and cgroup v1 cpuacct at /sys/fs/cgroup/cpuacct", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="corral-sandbox-cpu-"))
    group = CPUACCT / f"corral-sandbox-cpu-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    report_r, report_w = os.pipe()
    try:
        variants = argvs(root)
        cpu: dict[str, list[float]] = {n: [] for n in variants}
        wall: dict[str, list[float]] = {n: [] for n in variants}
        with os.fdopen(report_r) as reports:
            for _ in range(args.runs):
                for name, argv in variants.items():
                    wall[name].append(run_once(argv, group, report_w))
                    cpu[name].append(int(reports.readline()) / 1e6)
        out = {
            n: {
                "cpu_ms_mean": round(statistics.fmean(cpu[n]), 2),
                "cpu_ms_p50": round(statistics.median(cpu[n]), 2),
                "wall_ms_p50": round(statistics.median(wall[n]), 2),
            }
            for n in variants
        }
        print(f"load average (1 min) {os.getloadavg()[0]:.2f}; {args.runs} interleaved starts per variant")
        for name, fig in out.items():
            cpu_part = f"CPU mean {fig['cpu_ms_mean']:6.2f} ms  p50 {fig['cpu_ms_p50']:6.2f} ms"
            print(f"{name:16s} {cpu_part}  wall p50 {fig['wall_ms_p50']:6.2f} ms")
        print(json.dumps(out))
        return 0
    finally:
        os.close(report_w)
        group.rmdir()  # every child has left it: each was waited for
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
