"""CPU of each step of the local engine's sandboxed launch path, taken separately (issue 19).

    flock /tmp/bench.lock .venv/bin/python bench/sandbox_steps.py [--rounds 60]

Root and cgroup v1 only (as `python -m corral.engine.local.latency --cpu`): the process moves
into its own cpuacct group, which every process it forks inherits, so each step's figure counts
all its processes (bwrap, its init, setpriv, the shell). The steps run interleaved, one of each
per round, so the load moves them alike. The argv is the engine's own for a trivial attempt
(`LocalEngine._prepare`), cut down step by step:

  fork                    a bare fork and exit of this process (in every forked step below)
  sh                      /bin/sh -c true, no sandbox (the unsandboxed engine's exec)
  bwrap_true              bwrap with the engine's mounts, running `true` (no setpriv, no shell)
  bwrap_sh                ... running `/bin/sh -c true`
  bwrap_setpriv_sh        the engine's full argv (setpriv, then the shell)
  netns                   a forked child that makes its own network namespace and brings lo up
  cgroup_made_removed     the instance's cgroups made and removed
  cgroup_joined           the same with a forked child joining them
  prepare                 launch()'s own Python work (files, uid, etc, cgroups made): thread time

Prints ms per step (median of the rounds, and the mean) and one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from corral.engine.isolation import cgroupfs, netns
from corral.engine.local.engine import LocalEngine
from corral.engine.local.latency import CpuMeter, _trivial_attempt


def _run(argv: list[str], env: dict[str, str]) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.execve(argv[0], argv, env)
        finally:
            os._exit(127)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"step failed ({status}): {' '.join(argv[-6:])}")


def _netns_child() -> None:
    pid = os.fork()
    if pid == 0:
        try:
            netns.setup({"outbound": "none", "slirp4netns": None}, "/dev/null")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _fork() -> None:
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _cgroup_step(engine: LocalEngine, join: bool = True) -> float | None:
    """Without `join` it returns its own thread time: cpuacct does not see a running thread's
    last slice, which is all of an in-process step this short."""
    t0 = time.thread_time()
    name = f"steps{uuid.uuid4().hex[:8]}/0"
    handle = cgroupfs.create_instance_cgroup(
        engine.cgroup_root, engine.status.cgroup_version or 1, engine.cgroup_parent, name, 256, 1.0, 1024, []
    )
    if join:
        pid = os.fork()
        if pid == 0:
            cgroupfs.join(handle, os.getpid())
            os._exit(0)
        os.waitpid(pid, 0)
    cgroupfs.remove(handle)
    cgroupfs.remove_attempt_dirs(handle)
    return None if join else time.thread_time() - t0


def steps(engine: LocalEngine, home: Path) -> dict[str, Callable[[], float | None]]:
    """Each step as a callable; a float result is its own CPU seconds (in-process steps)."""
    probe = _trivial_attempt(engine, "true")
    adir = home / "probe"
    adir.mkdir()
    spec = engine._prepare(probe, adir)
    inst = spec["instances"][0]
    full, env = list(inst["argv"]), dict(inst["env"])
    setpriv_at = full.index("--") + 1
    head = full[:setpriv_at]
    assert inst["cgroup"] is not None
    cgroupfs.remove(inst["cgroup"])
    cgroupfs.remove_attempt_dirs(inst["cgroup"])

    def prepare() -> float:
        attempt = _trivial_attempt(engine, "true")
        d = engine._dir(attempt.attempt_id)
        d.mkdir()
        t0 = time.thread_time()
        made = engine._prepare(attempt, d)
        used = time.thread_time() - t0
        for i in made["instances"]:
            if i["cgroup"]:
                cgroupfs.remove(i["cgroup"])
                cgroupfs.remove_attempt_dirs(i["cgroup"])
        if made["uid_lock"]:
            os.remove(os.path.join(made["uid_lock"], "attempt"))
            os.rmdir(made["uid_lock"])
        return used

    return {
        "fork": _fork,
        "sh": lambda: _run(["/bin/sh", "-c", "true"], env),
        "bwrap_true": lambda: _run([*head, "/usr/bin/true"], env),
        "bwrap_sh": lambda: _run([*head, "/bin/sh", "-c", "true"], env),
        "bwrap_setpriv_sh": lambda: _run(full, env),
        "netns": _netns_child,
        "cgroup_made_removed": lambda: _cgroup_step(engine, join=False),
        "cgroup_joined": lambda: _cgroup_step(engine),
        "prepare": prepare,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    args = parser.parse_args()
    if os.geteuid() != 0 or not CpuMeter.available():
        raise SystemExit("needs root and a writable cgroup-v1 cpuacct hierarchy")
    meter = CpuMeter()
    per_step: dict[str, list[float]] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="corral-steps-") as tmp:
            engine = LocalEngine(
                Path(tmp) / "e", "bench", virtual_gpus=0, cgroup_parent=f"corral-steps-{uuid.uuid4().hex[:6]}"
            )
            try:
                todo = steps(engine, Path(tmp))
                for round_ in range(args.rounds + 5):
                    for name, step in todo.items():
                        before = meter.used_s()
                        own = step()
                        used = own if own is not None else meter.used_s() - before
                        if round_ >= 5:  # the first rounds warm caches
                            per_step.setdefault(name, []).append(used * 1000)
            finally:
                engine.close()
                engine.remove_cgroup_parent(wait_s=2.0)
    finally:
        meter.close()
    result = {
        k: {"p50_ms": statistics.median(v), "mean_ms": statistics.fmean(v)} for k, v in per_step.items()
    }
    for name, figures in result.items():
        print(f"{name:20s} p50 {figures['p50_ms']:6.2f} ms   mean {figures['mean_ms']:6.2f} ms")
    p50 = {k: v["p50_ms"] for k, v in result.items()}
    parts = {  # each step's own share: the step minus the one it adds to
        "exec_sh_over_fork": p50["sh"] - p50["fork"],
        "bwrap_over_sh": p50["bwrap_sh"] - p50["sh"],
        "setpriv_over_bwrap_sh": p50["bwrap_setpriv_sh"] - p50["bwrap_sh"],
        "netns_over_fork": p50["netns"] - p50["fork"],
        "cgroup_made_joined_removed_over_fork": p50["cgroup_joined"] - p50["fork"],
        "cgroup_made_removed": p50["cgroup_made_removed"],
        "prepare": p50["prepare"],
    }
    for name, ms in parts.items():
        print(f"  {name:38s} {ms:6.2f} ms")
    print(json.dumps({"rounds": args.rounds, "load": os.getloadavg()[0], "steps": result, "parts": parts}))


if __name__ == "__main__":
    main()
