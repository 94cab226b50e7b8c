"""Chaos soak: many jobs on real Corral servers while a driver breaks things, invariants checked.

Submits `--jobs` jobs of mixed sizes (CPU-only, 1, 2 and 4 GPUs, two-instance gangs; short
sleeps; some exit non-zero, some with retries) to real server processes (tests/server_harness.py:
local engine, virtual GPUs, jobs sandboxed) on loopback, while a chaos driver at random:
SIGKILLs a server and starts it again, SIGKILLs attempt supervisors, SIGKILLs job processes,
stops the node's heartbeats (`corral chaos node down`, then `up`) and injects GPU faults (ECC,
Xid, lost GPU, then clear). Beside the faults, a holder holds queued jobs at random
(`POST /jobs/{id}/hold`) and releases each a few seconds later (`/release`; every hold is
released before the drain's end). Two configurations: SQLite with one server, PostgreSQL (a real one,
tests/pg.py) with two servers on one database and one home (their loops are leased).

Invariants, checked on a read-only snapshot of the database every `--poll` seconds and at the end:

  lost_job            a submitted job is missing from the database
  duplicate_job       a planned job is in the database more than once (a submit retried after
                      its answer was lost must not create it again)
  two_live_attempts   a job has two attempts scheduled/starting/running at once
  terminal_reopened   a job seen terminal is later seen in another state
  gpu_overallocated   one GPU held (GpuClaim) or placed by two live attempts
  engine_overlap      on the engine side, an attempt started (supervisor.json) before the job's
                      previous attempt had ended (status.json), or the previous attempt's
                      processes still wrote to its log after the next one started; also two
                      live supervisors of one job at once
  not_settled         at the end (the run is bounded by `--duration`), a job neither terminal
                      nor queued whose latest attempt runs nowhere on the engine (stuck); jobs
                      still running at the bound are reported as `unfinished`
  log_incomplete      a succeeded job's log (every rank) lacks its last line
  held_placed         an attempt of a job was created while the job was held (its created time
                      after a "hold" job event and before the "release" that ended it)

Every planned job is submitted, however long the restarts make it take: a submit is retried
until a server answers it, and one whose answer was lost (the server killed, or slow past the
client's timeout) is looked up by its unique name first, and retried only once the server that
took it is dead or the name has stayed absent for `LOST_ANSWER_WAIT_S`, so that no job is
created twice (`duplicate_job` checks it). The faulted GPUs are cleared and then returned to
service by the soak's operator once the diagnosis watch has quarantined them (a GPU quarantined
after its fault was cleared is returned too), as an admin would; otherwise jobs that need every
GPU would wait for ever.

    python bench/chaos_soak.py [--jobs 1000] [--seed 7] [--config sqlite|postgres|both]
                               [--chaos-every 2.0] [--duration 1800] [--gpus 4]
                               [--submitters 4] [--sleep 0.1,1.5]

Prints the seed, faults injected by kind, holds (placed, refused, released), violations by
invariant (target: 0 each), jobs by final state, wall time and load average; the last line is
one JSON object. Exit status 1 on violations.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for extra in (ROOT, ROOT / "src"):  # corral (src layout) and the harness under tests/
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

import httpx  # noqa: E402

from bench.soak_records import (  # noqa: E402
    TERMINAL,
    DbReader,
    Snapshot,
    attempt_dirs,
    engine_overlaps,
    held_placements,
    open_jobs,
    supervisor_alive,
)
from corral.monitor.chaos import set_node_silenced  # noqa: E402
from corral.monitor.gpu import update_fault  # noqa: E402
from tests.server_harness import CorralServer, start_server  # noqa: E402

NODE = "local"  # the harness's node name
LIVE_ATTEMPT = frozenset({"scheduled", "starting", "running"})
INVARIANTS = (
    "lost_job",
    "duplicate_job",
    "two_live_attempts",
    "terminal_reopened",
    "gpu_overallocated",
    "engine_overlap",
    "not_settled",
    "log_incomplete",
    "held_placed",
)
FAULTS = ("server_kill", "supervisor_kill", "job_kill", "node_down", "gpu_ecc", "gpu_xid", "gpu_lose")
LOST_ANSWER_WAIT_S = 60.0  # a live server that took a submit commits it well within this
RESTART_TIMEOUT_S = 240.0  # a killed server's start-up on a loaded 2-core machine (15-25 s seen)
GPU_FAULT_S = (2.0, 6.0)  # a GPU fault lasts this long at least (a uniform draw)
GPU_UNSEEN_S = 20.0  # ... and ends this much later if the diagnosis watch never took the GPU out
SETTLE_CONFIRM_S = 5.0  # a job open at the end must stay unchanged this long to count as stuck
HOLD_EVERY_S = 2.0  # mean time between the holder's holds of a queued job
HOLD_S = (1.0, 8.0)  # a hold lasts this long (a uniform draw), or until the holder stops
HEARTBEAT_TIMEOUT_S = 3.0  # servers' CORRAL_NODE_HEARTBEAT_TIMEOUT_S: node losses come quickly
# (gpus per instance, instances) -> weight: mostly small, some whole-node and gang jobs
SHAPES = {(0, 1): 30, (1, 1): 30, (2, 1): 15, (4, 1): 8, (1, 2): 10, (2, 2): 7}
# (exit code, retries) -> weight: most succeed; some fail for good, some use up their retries
OUTCOMES = {(0, 0): 70, (0, 2): 10, (3, 1): 10, (1, 0): 5, (42, 2): 5}


@dataclass
class SoakConfig:
    jobs: int = 1000
    seed: int = 7
    servers: int = 1
    postgres: bool = False
    chaos_every_s: float = 2.0  # mean time between faults
    # Bound on the run (after the servers are up): faults are injected during its first 80 % (or
    # until `chaos_faults`), and the work must drain within it, or within a quarter of it after
    # the last submit if submitting took longer (every job is submitted, however long it takes).
    duration_s: float = 1800.0
    poll_s: float = 0.5
    gpus: int = 4
    sleep_s: tuple[float, float] = (0.1, 1.5)  # each job sleeps a uniform draw from this
    submitters: int = 1  # clients submitting at once (in the planned order, each job once)
    node_down_s: tuple[float, float] = (4.0, 8.0)  # heartbeats stopped this long (timeout 3 s)
    # Stop injecting after this many faults, submitting or not (else at 4/5 of the bound): a
    # loaded machine that submits slowly must not get more server kills for it.
    chaos_faults: int | None = None
    opening: tuple[str, ...] = ()  # faults injected first, in this order, before random ones
    weights: dict[str, int] = field(
        default_factory=lambda: {
            "server_kill": 2,
            "supervisor_kill": 4,
            "job_kill": 4,
            "node_down": 1,
            "gpu_ecc": 1,
            "gpu_xid": 1,
            "gpu_lose": 1,
        }
    )


@dataclass
class Planned:
    name: str
    gpus: int
    instances: int
    exit_code: int
    retries: int
    sleep_s: float

    def spec(self) -> dict[str, Any]:
        command = (
            'echo "start-$CORRAL_JOB_ID-$RANK"; '
            f"sleep {self.sleep_s:.2f}; "
            'echo "end-$CORRAL_JOB_ID-$RANK"; '
            f"exit {self.exit_code}"
        )
        task = {
            "instances": self.instances,
            "command": command,
            "resources": {"gpus": self.gpus, "cpus": 0.1, "memory": 64},
        }
        return {"name": self.name, "retries": self.retries, "tasks": {"main": task}}


def plan_jobs(rng: random.Random, count: int, sleep_s: tuple[float, float]) -> list[Planned]:
    shapes, outcomes = list(SHAPES), list(OUTCOMES)
    planned = []
    for i in range(count):
        gpus, instances = rng.choices(shapes, weights=list(SHAPES.values()))[0]
        code, retries = rng.choices(outcomes, weights=list(OUTCOMES.values()))[0]
        planned.append(Planned(f"soak-{i}", gpus, instances, code, retries, rng.uniform(*sleep_s)))
    return planned


# -------------------------------------------------------------------------- the soak


class Soak:
    def __init__(self, cfg: SoakConfig, home: Path, database_url: str | None) -> None:
        self.cfg, self.home, self.database_url = cfg, home, database_url
        # The seed fixes the jobs and the faults' order; when each fault lands depends on timing.
        self.planned = plan_jobs(random.Random(cfg.seed), cfg.jobs, cfg.sleep_s)
        self.rng = random.Random(cfg.seed + 1)  # the chaos driver's draws (its thread only)
        self.submit_rng = random.Random(cfg.seed + 2)  # which live server a submit goes to
        self.servers: list[CorralServer] = []
        self.ids: dict[str, int] = {}  # planned name -> job id, once the server answered
        self.faults: Counter[str] = Counter()
        self.violations: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.incidents: set[tuple[str, str]] = set()
        self.seen_terminal: dict[int, str] = {}
        self.submit_errors = 0  # answers other than 201, and answers lost on the way
        self.submit_waits = 0  # connection refused: no server listening (restarting)
        self.restart_s: list[float] = []  # how long each killed server took to serve again
        self.lock = threading.Lock()
        self.stop_chaos = threading.Event()
        self.stop_watch = threading.Event()
        self.reader = DbReader(database_url, None if database_url else home / "corral.db")
        self.checks = 0
        self.began = time.monotonic()  # reset once the servers are up
        self.opened: list[str] = []  # faults injected so far, in order
        self.gpu_faults: dict[int, float] = {}  # GPU index -> when its fault may end (chaos thread)
        self.hold_rng = random.Random(cfg.seed + 3)  # the holder's draws (its thread only)
        self.held: dict[int, float] = {}  # job id -> when the holder releases it (holder thread)
        self.holds: Counter[str] = Counter()  # held, refused (not queued any more), released

    # -- servers ----------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {
            "CORRAL_NODE_HEARTBEAT_TIMEOUT_S": str(HEARTBEAT_TIMEOUT_S),
            "CORRAL_RATE_SUBMIT_PER_MIN": "0",  # the soak's submit burst is not what is tested
            "CORRAL_LOST_REQUEUE_BUDGET": "20",
            "CORRAL_MONITOR_SAMPLE_INTERVAL_S": "1",
        }

    def start_servers(self) -> None:
        first = start_server(
            self.home, database_url=self.database_url, virtual_gpus=self.cfg.gpus, extra_env=self.env()
        )
        self.servers.append(first)
        for _ in range(1, self.cfg.servers):
            self.servers.append(
                start_server(
                    self.home,
                    database_url=self.database_url,
                    virtual_gpus=self.cfg.gpus,
                    extra_env=self.env(),
                    token=first.token,
                )
            )

    def live_server(self) -> CorralServer:
        alive = [s for s in self.servers if s.proc is not None and s.proc.poll() is None]
        return self.submit_rng.choice(alive) if alive else self.servers[0]

    # -- submit -------------------------------------------------------------------------------

    def submit_all(self) -> None:
        """Submit the planned jobs in order with `submitters` clients at once: one client spends
        most of a submit waiting on a server that chaos keeps restarting."""
        queue = iter(self.planned)

        def submitter() -> None:
            while True:
                with self.lock:
                    job = next(queue, None)
                if job is None:
                    return
                self.submit_one(job)

        threads = [threading.Thread(target=submitter) for _ in range(max(1, self.cfg.submitters))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def submit_one(self, job: Planned) -> None:
        """Submit until a server answers 201. A refused connection created nothing: try again.
        Any other failure may have created the job (the answer lost on the way): find it by its
        unique name before trying again (`resolve_lost_answer`)."""
        for _ in range(1000):
            srv = self.live_server()
            proc = srv.proc  # the very process that takes this request (a restart makes another)
            try:
                with srv.client(timeout=30.0) as c:
                    r = c.post("/api/v1/jobs", json=job.spec())
                if r.status_code in (200, 201):
                    with self.lock:
                        self.ids[job.name] = int(r.json()["id"])
                    return
                if r.status_code == 422:  # the spec itself is wrong: no retry makes it right
                    raise RuntimeError(f"{job.name} refused: {r.text[:300]}")
                with self.lock:
                    self.submit_errors += 1
                # An error answer (a 503 while shutting down): the request is over, so what it
                # committed, if anything, is visible now.
                found = self.find_by_name(job.name)
            except httpx.ConnectError:
                with self.lock:
                    self.submit_waits += 1  # never reached a server: nothing was created
                found = None
            except httpx.HTTPError:
                with self.lock:
                    self.submit_errors += 1
                found = self.resolve_lost_answer(job.name, proc)  # no answer: it may still commit
            if found is not None:
                with self.lock:
                    self.ids[job.name] = found
                return
            time.sleep(0.2)
        raise RuntimeError(f"could not submit {job.name}")

    def resolve_lost_answer(self, name: str, proc: Any) -> int | None:
        """The job `name` if the failed submit created it, else None once it cannot any more: the
        server process that took the request is dead (no commit can follow), or the name stayed
        absent for LOST_ANSWER_WAIT_S (a live server commits or fails a submit well within
        that). Retrying earlier could create the job twice if the slow request commits later."""
        deadline = time.monotonic() + LOST_ANSWER_WAIT_S
        while True:
            dead = proc is None or proc.poll() is not None
            found = self.find_by_name(name)
            if found is not None or dead or time.monotonic() >= deadline:
                return found
            time.sleep(0.5)

    def find_by_name(self, name: str) -> int | None:
        for attempt in range(20):  # the database may be held a moment by a server's start-up
            try:
                snap = self.reader.snapshot()
                break
            except Exception:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        return next((jid for jid, (n, _) in snap.jobs.items() if n == name), None)

    # -- chaos --------------------------------------------------------------------------------

    def chaos_loop(self) -> None:
        actions: dict[str, Callable[[], bool]] = {
            "server_kill": self.kill_server,
            "supervisor_kill": self.kill_supervisor,
            "job_kill": self.kill_job_process,
            "node_down": self.node_down,
            "gpu_ecc": lambda: self.gpu_fault(ecc_uncorrected=1),
            "gpu_xid": lambda: self.gpu_fault(xid=79),
            "gpu_lose": lambda: self.gpu_fault(lost=True),
        }
        names = [n for n in FAULTS if self.cfg.weights.get(n, 0) > 0]
        weights = [self.cfg.weights[n] for n in names]
        node_up_at: float | None = None
        wait = self.rng.expovariate(1.0 / self.cfg.chaos_every_s)
        while not self.stop_chaos.wait(wait):
            if self.cfg.chaos_faults is not None and len(self.opened) >= self.cfg.chaos_faults:
                break  # enough; the undo below still runs (node up, GPU faults cleared)
            now = time.monotonic()
            if node_up_at is not None and now >= node_up_at:
                set_node_silenced(self.home, NODE, False)
                node_up_at = None
            self.tend_gpus(now)
            opening = self.cfg.opening[len(self.opened) :]
            name = opening[0] if opening else self.rng.choices(names, weights=weights)[0]
            try:
                done = actions[name]()
            except Exception as exc:  # e.g. a restarted server not ready in time: say so, go on
                print(f"  ({name} failed: {type(exc).__name__}: {str(exc)[:300]})", flush=True)
                done = False
            if done:
                self.faults[name] += 1
                self.opened.append(name)
                if name == "node_down":
                    node_up_at = time.monotonic() + self.rng.uniform(*self.cfg.node_down_s)
            # An opening fault that found nothing to hit (no attempt running yet, a GPU still
            # faulted) is tried again soon, so that every kind lands while there is work to hit.
            opening_left = bool(opening) and not done
            wait = 0.2 if opening_left else self.rng.expovariate(1.0 / self.cfg.chaos_every_s)
        set_node_silenced(self.home, NODE, False)
        self.end_gpu_faults()

    def kill_server(self) -> bool:
        srv = self.rng.choice(self.servers)
        srv.kill()
        time.sleep(self.rng.uniform(0.0, 1.0))
        began = time.monotonic()
        srv.start(RESTART_TIMEOUT_S)
        self.restart_s.append(time.monotonic() - began)
        return True

    def live_attempt_dirs(self) -> list[tuple[Path, int]]:
        return [
            (adir, pid)
            for numbers in attempt_dirs(self.home).values()
            for adir in numbers.values()
            if (pid := supervisor_alive(adir) or 0)
        ]

    def kill_supervisor(self) -> bool:
        live = self.live_attempt_dirs()
        if not live:
            return False
        _adir, pid = self.rng.choice(live)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return True

    def kill_job_process(self) -> bool:
        """SIGKILL the job's own command (a `sleep` inside the sandbox) of a live attempt."""
        import psutil

        live = self.live_attempt_dirs()
        self.rng.shuffle(live)
        for _adir, pid in live:
            try:
                sleeps = [p for p in psutil.Process(pid).children(recursive=True) if p.name() == "sleep"]
            except psutil.Error:
                continue
            if sleeps:
                with contextlib.suppress(psutil.Error):
                    self.rng.choice(sleeps).kill()
                return True
        return False

    def node_down(self) -> bool:
        from corral.monitor.chaos import silenced_nodes

        if NODE in silenced_nodes(self.home):
            return False
        set_node_silenced(self.home, NODE, True)
        return True

    def gpu_fault(self, **fault: Any) -> bool:
        """A fault on a GPU not faulted now; cleared GPU_FAULT_S later, once the server acted."""
        free = [i for i in range(self.cfg.gpus) if i not in self.gpu_faults]
        if not free:
            return False
        index = self.rng.choice(free)
        update_fault(self.home, NODE, index, **fault)
        self.gpu_faults[index] = time.monotonic() + self.rng.uniform(*GPU_FAULT_S)
        return True

    def tend_gpus(self, now: float) -> None:
        """The hardware and the operator: a fault ends once its time is up and the diagnosis watch
        has taken the GPU out (quarantined, or lost when it fell off the bus), or GPU_UNSEEN_S
        after that if the watch never saw it; then the operator returns every GPU that is out
        while no fault is on it (the watch never returns one by itself), including one the watch
        took out after its fault had already ended."""
        try:
            health = self.reader.gpu_health()
        except Exception:  # the database held a moment by a server's start-up: next time
            return
        for index, clear_at in list(self.gpu_faults.items()):
            out = health.get((NODE, index), "healthy") != "healthy"
            if now >= clear_at and (out or now >= clear_at + GPU_UNSEEN_S):
                update_fault(self.home, NODE, index, clear=True)
                del self.gpu_faults[index]
        for (node, index), state in health.items():
            if state != "healthy" and index not in self.gpu_faults:
                # a server down: the next call tries again
                with contextlib.suppress(httpx.HTTPError), self.live_server().client(timeout=10.0) as c:
                    c.post(f"/api/v1/nodes/{node}/gpus/{index}/return")

    def end_gpu_faults(self) -> None:
        for index in range(self.cfg.gpus):
            update_fault(self.home, NODE, index, clear=True)
        self.gpu_faults.clear()
        self.tend_gpus(time.monotonic())

    # -- holds --------------------------------------------------------------------------------

    def hold_loop(self) -> None:
        """Hold a queued job every HOLD_EVERY_S on average and release it HOLD_S later; when
        chaos stops, release every job still held (retried until a server answers: a job left
        held would never run)."""
        next_hold = time.monotonic() + self.hold_rng.expovariate(1.0 / HOLD_EVERY_S)
        while not self.stop_chaos.wait(0.5):
            now = time.monotonic()
            for jid, release_at in list(self.held.items()):
                if now >= release_at and self.hold_call(jid, "release") is not False:
                    del self.held[jid]
            if now >= next_hold:
                self.hold_one()
                next_hold = now + self.hold_rng.expovariate(1.0 / HOLD_EVERY_S)
        deadline = time.monotonic() + RESTART_TIMEOUT_S * 2
        while self.held and time.monotonic() < deadline:
            for jid in list(self.held):
                if self.hold_call(jid, "release") is not False:
                    del self.held[jid]
            if self.held:
                time.sleep(1.0)
        if self.held:
            print(f"  (jobs left held: {sorted(self.held)})", flush=True)

    def hold_one(self) -> None:
        try:
            snap = self.reader.snapshot()
        except Exception:  # the database held a moment by a server's start-up: next time
            return
        with self.lock:
            submitted = set(self.ids.values())
        queued = sorted(j for j, (_n, s) in snap.jobs.items() if s == "queued" and j in submitted)
        queued = [j for j in queued if j not in self.held]
        if queued:
            jid = self.hold_rng.choice(queued)
            # Held unless refused: an answer lost on the way may have held it, and the release of
            # a job that is not held changes nothing.
            if self.hold_call(jid, "hold") is not None:
                self.held[jid] = time.monotonic() + self.hold_rng.uniform(*HOLD_S)

    def hold_call(self, jid: int, action: str) -> bool | None:
        """POST /jobs/{jid}/{action} (hold or release). True: done (or nothing to do); False: no
        answer or a server error (it may have been done: try again); None: refused (409, the job
        is no longer queued)."""
        try:
            with self.live_server().client(timeout=10.0) as c:
                r = c.post(f"/api/v1/jobs/{jid}/{action}")
        except httpx.HTTPError:
            return False
        if r.status_code == 409:
            self.holds[f"{action}_refused"] += 1
            return None
        if r.status_code != 200:
            return False
        if r.json().get("changed"):
            self.holds["held" if action == "hold" else "released"] += 1
        return True

    # -- invariants ---------------------------------------------------------------------------

    def violate(self, invariant: str, detail: str, key: str | None = None) -> None:
        """Count one incident of `invariant`; the same `key` (default: the detail) seen again by
        a later poll is the same incident."""
        with self.lock:
            if (invariant, key or detail) in self.incidents:
                return
            self.incidents.add((invariant, key or detail))
            self.violations[invariant] += 1
            self.examples.setdefault(invariant, detail)

    def watch_loop(self) -> None:
        while not self.stop_watch.wait(self.cfg.poll_s):
            try:
                self.check(final=False)
            except Exception as exc:  # a server restart may hold the database for a moment
                print(f"  (check skipped: {type(exc).__name__}: {exc})", flush=True)

    def check(self, final: bool) -> Snapshot:
        with self.lock:
            submitted = dict(self.ids)
        snap = self.reader.snapshot()
        self.checks += 1
        for name, jid in submitted.items():
            if jid not in snap.jobs:
                self.violate("lost_job", f"{name} (job {jid}) is gone")
        by_name: dict[str, list[int]] = {}
        for jid, (name, _state) in snap.jobs.items():
            by_name.setdefault(name, []).append(jid)
        for name, jids in by_name.items():
            if len(jids) > 1:
                self.violate("duplicate_job", f"{name} is jobs {sorted(jids)}", name)
        for jid, (_name, state) in snap.jobs.items():
            before = self.seen_terminal.get(jid)
            if before is not None and state != before:
                self.violate("terminal_reopened", f"job {jid}: {before} then {state}")
            if state in TERMINAL:
                self.seen_terminal[jid] = state
        live = [a for a in snap.attempts if a[3] in LIVE_ATTEMPT]
        per_job = Counter(a[1] for a in live)
        for jid, count in per_job.items():
            if count > 1:
                self.violate("two_live_attempts", f"job {jid} has {count} live attempts", f"{jid}")
        holders: dict[tuple[str, int], set[int]] = {}
        for node, index, pk in snap.claims:
            holders.setdefault((node, index), set()).add(pk)
        for pk, _jid, _n, _state, placement in live:
            for inst in placement:
                for index in inst.get("gpu_indices", ()):
                    holders.setdefault((inst["node"], int(index)), set()).add(pk)
        for gpu, pks in holders.items():
            if len(pks) > 1:
                self.violate("gpu_overallocated", f"GPU {gpu} held by attempts {sorted(pks)}")
        for jid, number, held_at, released_at in held_placements(snap):
            self.violate(
                "held_placed",
                f"job {jid}: attempt {number} created while held (hold at {held_at:.3f}, "
                f"release at {released_at:.3f})",
                f"{jid}:{number}",
            )
        self.check_engine(final)
        return snap

    def check_engine(self, final: bool) -> None:
        for jid, numbers in attempt_dirs(self.home).items():
            alive = [n for n, adir in numbers.items() if supervisor_alive(adir)]
            if len(alive) > 1:
                self.violate(
                    "engine_overlap", f"job {jid}: live supervisors of attempts {alive}", f"{jid}:live"
                )
            if final or len(numbers) > 1:
                for key, problem in engine_overlaps(numbers):
                    self.violate("engine_overlap", f"job {jid}: {problem}", f"{jid}:{key}")

    def check_logs(self, snap: Snapshot) -> None:
        by_job = attempt_dirs(self.home)
        succeeded = {a[1]: a for a in snap.attempts if a[3] == "succeeded"}
        for jid, (name, state) in snap.jobs.items():
            if state != "succeeded":
                continue
            attempt = succeeded.get(jid)
            adir = by_job.get(jid, {}).get(attempt[2]) if attempt else None
            ranks = len(attempt[4]) if attempt else 0
            for rank in range(max(ranks, 1)):
                log = adir / f"rank-{rank}.log" if adir else None
                text = log.read_text(errors="replace") if log and log.exists() else ""
                lines = text.strip().splitlines()
                if not lines or lines[-1] != f"end-{jid}-{rank}":
                    self.violate("log_incomplete", f"{name} (job {jid}) rank {rank}: {lines[-1:]!r}")

    # -- run ----------------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.start_servers()
        watcher = threading.Thread(target=self.watch_loop, daemon=True)
        chaos = threading.Thread(target=self.chaos_loop, daemon=True)
        self.holder = threading.Thread(target=self.hold_loop, daemon=True)
        watcher.start()
        chaos.start()
        self.holder.start()
        try:
            self.began = time.monotonic()
            self.submit_all()
            submitted_s = time.monotonic() - started
            self.drain(chaos)
        finally:  # also on Ctrl-C / SIGTERM: no fault may land while the servers are stopped
            self.stop_chaos.set()
            self.stop_watch.set()
            chaos.join()
            self.holder.join()
            watcher.join()
        snap = self.check(final=True)
        self.check_logs(snap)
        unfinished = self.check_settled(snap)
        abandoned = [
            adir.name
            for numbers in attempt_dirs(self.home).values()
            for adir in numbers.values()
            if not (adir / "status.json").exists() and not supervisor_alive(adir)
        ]
        states = Counter(state for _n, state in self.reader.snapshot().jobs.values())
        return {
            "seed": self.cfg.seed,
            "servers": self.cfg.servers,
            "database": "postgresql" if self.database_url else "sqlite",
            "jobs": len(self.planned),
            "submitted": len(self.ids),
            "submit_retries": self.submit_errors,
            "submit_refused": self.submit_waits,
            "server_restart_s": round(sum(self.restart_s) / len(self.restart_s), 1)
            if self.restart_s
            else None,
            "faults": {name: self.faults.get(name, 0) for name in FAULTS},
            "holds": {k: self.holds.get(k, 0) for k in ("held", "hold_refused", "released")},
            "violations": {name: self.violations.get(name, 0) for name in INVARIANTS},
            "examples": dict(self.examples),
            "final_states": dict(sorted(states.items())),
            "unfinished": unfinished,
            # attempt records not written off whose supervisor is not running (died, never started)
            "engine_records_open": sorted(abandoned)[:20],
            "checks": self.checks,
            "submit_s": round(submitted_s, 1),
            "wall_s": round(time.monotonic() - started, 1),
            "loadavg": [round(x, 2) for x in os.getloadavg()],
        }

    def drain(self, chaos: threading.Thread) -> None:
        """Wait, up to the drain bound, for every job to end. Chaos goes on while the work
        drains, until `chaos_faults` faults were injected or four fifths of the run's bound are
        gone, so the jobs it hit last can settle (requeues run again) before the bound. The bound
        is the run's, or a quarter of it after the last submit where submitting took longer."""
        duration = self.cfg.duration_s
        deadline = max(self.began + duration, time.monotonic() + duration / 4)
        calm_at = self.began + duration * 0.8
        while time.monotonic() < deadline:
            injected = sum(self.faults.values())
            enough = self.cfg.chaos_faults is not None and injected >= self.cfg.chaos_faults
            settled = self.settled()
            if enough or time.monotonic() >= calm_at or settled:
                self.stop_chaos.set()
                chaos.join()
                self.holder.join()  # every hold released
                if settled or self.settled():  # again only when chaos was running until now
                    break
                self.tend_gpus(time.monotonic())  # one the watch took out after the last clear
            time.sleep(1.0)
        self.stop_chaos.set()
        chaos.join()

    def check_settled(self, first: Snapshot) -> int:
        """Jobs neither terminal nor queued at the end. One whose latest attempt still runs on
        the engine is unfinished (the drain bound came first; counted, returned). One that shows
        the same state and attempt on a second snapshot SETTLE_CONFIRM_S later while the engine
        runs nothing of it is stuck: a `not_settled` violation."""
        pending = open_jobs(first)
        if not pending:
            return 0
        time.sleep(SETTLE_CONFIRM_S)
        second = self.reader.snapshot()
        dirs = attempt_dirs(self.home)
        unfinished = 0
        for jid, (state, number) in open_jobs(second).items():
            if pending.get(jid) != (state, number):
                continue  # moved on meanwhile
            adir = dirs.get(jid, {}).get(number)
            if adir is not None and supervisor_alive(adir):
                unfinished += 1
            else:
                self.violate("not_settled", f"job {jid} stuck {state}: attempt {number} runs nowhere")
        return unfinished

    def settled(self) -> bool:
        """Every submitted job terminal (queued ones count when chaos is over and nothing runs)."""
        if len(self.ids) < len(self.planned):
            return False
        snap = self.reader.snapshot()
        return all(state in TERMINAL for _n, state in snap.jobs.values())

    def close(self) -> None:
        for srv in reversed(self.servers):
            srv.stop()


def run_soak(cfg: SoakConfig, postgres_url: Callable[[], str] | None = None) -> dict[str, Any]:
    """One soak in a fresh home; `postgres_url` makes a fresh PostgreSQL database (else SQLite)."""
    home = Path(tempfile.mkdtemp(prefix="corral-soak-"))
    soak = Soak(cfg, home, postgres_url() if postgres_url else None)
    try:
        return soak.run()
    finally:
        soak.close()
        shutil.rmtree(home, ignore_errors=True)


def report(result: dict[str, Any]) -> None:
    print(f"\n== {result['database']}, {result['servers']} server(s), seed {result['seed']} ==")
    print(
        f"jobs {result['jobs']} submitted {result['submitted']} (submit retries "
        f"{result['submit_retries']}, refused {result['submit_refused']}; "
        f"mean server restart {result['server_restart_s']} s)"
    )
    print("faults injected: " + ", ".join(f"{k} {v}" for k, v in result["faults"].items()))
    holds = result["holds"]
    print(
        f"holds:           held {holds['held']}, refused {holds['hold_refused']}, "
        f"released {holds['released']}"
    )
    print("violations:      " + ", ".join(f"{k} {v}" for k, v in result["violations"].items()))
    for name, example in result["examples"].items():
        print(f"  first {name}: {example}")
    states = ", ".join(f"{k} {v}" for k, v in result["final_states"].items())
    print(
        f"final states:    {states} (still running at the bound: {result['unfinished']}; "
        f"not submitted in the bound: {result['jobs'] - result['submitted']})"
    )
    print(f"invariant checks {result['checks']}; submit {result['submit_s']} s; wall {result['wall_s']} s")
    print(f"load average {result['loadavg']}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument("--config", choices=["sqlite", "postgres", "both"], default="both")
    parser.add_argument("--chaos-every", type=float, default=2.0, help="mean seconds between faults")
    parser.add_argument(
        "--duration",
        type=float,
        default=1800.0,
        help="bound on each configuration's run (s): faults in the first 80 %%; the drain ends by "
        "it, or a quarter of it after the last submit",
    )
    parser.add_argument("--gpus", type=int, default=4, help="virtual GPUs on the node")
    parser.add_argument("--submitters", type=int, default=4, help="clients submitting at once")
    parser.add_argument("--sleep", default="0.1,1.5", help="MIN,MAX seconds each job sleeps (a uniform draw)")
    args = parser.parse_args()
    low, _comma, high = args.sleep.partition(",")
    sleep_s = (float(low), float(high or low))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # stop servers and PostgreSQL too
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    results = []
    started = time.monotonic()
    if args.config in ("sqlite", "both"):
        cfg = SoakConfig(
            jobs=args.jobs,
            seed=seed,
            chaos_every_s=args.chaos_every,
            duration_s=args.duration,
            gpus=args.gpus,
            submitters=args.submitters,
            sleep_s=sleep_s,
        )
        results.append(run_soak(cfg))
        report(results[-1])
    if args.config in ("postgres", "both"):
        from tests.pg import PostgresServer, find_pg_bin

        bin_dir = find_pg_bin()
        if bin_dir is None:
            print("PostgreSQL (initdb/pg_ctl) not found", file=sys.stderr)
            return 2
        pg = PostgresServer(bin_dir)
        pg.start()
        try:
            cfg = SoakConfig(
                jobs=args.jobs, seed=seed, servers=2, postgres=True,
                chaos_every_s=args.chaos_every, duration_s=args.duration, gpus=args.gpus,
                submitters=args.submitters, sleep_s=sleep_s,
            )  # fmt: skip
            results.append(run_soak(cfg, pg.create_database))
        finally:
            pg.stop()
        report(results[-1])
    total = sum(sum(r["violations"].values()) for r in results)
    print(
        json.dumps(
            {
                "seed": seed,
                "wall_s": round(time.monotonic() - started, 1),
                "violations_total": total,
                "runs": results,
            }
        )
    )
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
