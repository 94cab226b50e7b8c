"""Thin wrapper over Slurm's command-line tools (sbatch, squeue, sinfo, scancel, scontrol).

Why the CLI and not slurmrestd: see docs/slurm.md. The one trap worth knowing here: with
slurmctld down, `squeue --json` and `sinfo --json` still exit 0 and print an empty list plus an
`errors` array, so "no jobs" must never be trusted without looking at `errors`.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypedDict, cast

from corral.engine.base import EngineUnavailable

# Messages with which the Slurm tools say "I could not talk to slurmctld" (as opposed to "slurmctld
# answered no"). Only these become EngineUnavailable; any other failure is Slurm's own answer.
_UNREACHABLE_MARKERS = (
    "unable to contact slurm controller",
    "socket timed out",
    "connection refused",
    "zero bytes were transmitted",
    "communication connection failure",
    "transport endpoint is not connected",
    "could not establish a configuration source",
    "unable to establish controller machine",
    "slurm_load_jobs",
    "slurm_load_node",
    "slurm_load_partitions",
)


# slurmctld's answer to `squeue --jobs=<one id>` for a job it does not know (purged after
# MinJobAge, or never there), printed as "slurm_load_jobs error: Invalid job id specified": an
# answer, not an outage, although it names slurm_load_jobs.
UNKNOWN_JOB = "invalid job id specified"


def looks_unreachable(message: str) -> bool:
    low = message.lower()
    if UNKNOWN_JOB in low:
        return False
    return any(marker in low for marker in _UNREACHABLE_MARKERS)


class SlurmJob(TypedDict, total=False):
    """A job as `SlurmCli.jobs` reads it from `squeue --Format` (parse_squeue): the fields the
    engine uses."""

    job_id: int | str  # str only in the stand-in the engine builds for a job Slurm purged
    name: str
    job_state: str | list[str]  # later openapi versions give a list of flags
    exit_code: int  # the raw wait status
    start_time: int
    end_time: int
    restart_cnt: int
    state_reason: str
    nodes: str
    comment: str  # only from SlurmCli.jobs(comment=True)


# The job fields poll() reads, as `squeue --Format` prints them: "|" after each (no width, so no
# truncation), the name last so that a "|" in another user's job name cannot shift the others.
SQUEUE_FIELDS = ("JobID", "State", "exit_code", "StartTime", "EndTime", "RestartCnt", "Reason", "NodeList")
SQUEUE_FORMAT = ",".join(f"{f}:|" for f in SQUEUE_FIELDS) + ",Name:"
# The same, then the comment, last in its turn: only where every job listed is one of Corral's
# (`--name=corral-<attempt id>`, or `--jobs=` of such jobs' ids), whose names have no "|".
SQUEUE_FORMAT_COMMENT = ",".join(f"{f}:|" for f in (*SQUEUE_FIELDS, "Name")) + ",Comment:"


def _epoch(text: str) -> int:
    """squeue's local ISO time ("2026-11-27T22:22:09") as unix seconds; 0 for N/A, NONE, Unknown."""
    try:
        return int(datetime.fromisoformat(text).timestamp())
    except ValueError:
        return 0


def parse_squeue(text: str, comment: bool = False) -> list[SlurmJob]:
    """`squeue --noheader --Format=SQUEUE_FORMAT` lines -> the same fields `squeue --json` gives
    (exit_code is the raw wait status in both). Lines that are not such a line are skipped.
    `comment`: lines of SQUEUE_FORMAT_COMMENT."""
    jobs: list[SlurmJob] = []
    n = len(SQUEUE_FIELDS) + comment
    for line in text.splitlines():
        parts = line.split("|", n)
        if len(parts) != n + 1 or not parts[0].isdigit():
            continue
        job_id, state, code, start, end, restarts, reason, nodes, name = parts[:9]
        job = SlurmJob(
            job_id=int(job_id),
            name=name,
            job_state=state,
            exit_code=int(code) if code.isdigit() else 0,
            start_time=_epoch(start),
            end_time=_epoch(end),
            restart_cnt=int(restarts) if restarts.isdigit() else 0,
            state_reason=reason,
            nodes=nodes,
        )
        if comment:
            job["comment"] = parts[9]
        jobs.append(job)
    return jobs


class SlurmNode(TypedDict, total=False):
    """The fields of a `sinfo --json` node that the engine reads (also kept in nodes.json)."""

    name: str
    state: str
    state_flags: list[str]
    reason: str
    gres: str
    partitions: list[str]
    features: str
    cpus: int
    real_memory: int
    address: str


class SlurmError(TypedDict, total=False):
    source: str
    description: str
    error: str


class SlurmReply(TypedDict, total=False):
    """A `sinfo --json` answer: the engine reads `nodes`."""

    nodes: list[SlurmNode]
    errors: list[SlurmError]


@dataclass(frozen=True, slots=True)
class CliResult:
    returncode: int
    stdout: str
    stderr: str

    @property
    def message(self) -> str:
        """Slurm's own words, without the `sbatch: error: ` prefixes."""
        lines = []
        for line in (self.stderr or self.stdout).splitlines():
            line = line.strip()
            for prefix in ("sbatch: error: ", "scancel: error: ", "scontrol: error: ", "squeue: error: "):
                if line.startswith(prefix):
                    line = line[len(prefix) :]
            if line:
                lines.append(line)
        return "; ".join(lines)


class SlurmCli:
    """Runs Slurm client commands against one cluster (SLURM_CONF) with a timeout."""

    def __init__(self, slurm_conf: str | None = None, timeout_s: float = 20.0, bin_dir: str | None = None):
        self.slurm_conf = slurm_conf
        self.timeout_s = timeout_s
        self.bin_dir = bin_dir
        env = dict(os.environ)
        if slurm_conf:
            env["SLURM_CONF"] = slurm_conf
        self._env: Mapping[str, str] = env

    def _argv(self, tool: str, args: Sequence[str]) -> list[str]:
        return [os.path.join(self.bin_dir, tool) if self.bin_dir else tool, *args]

    def submit_env(self, path: str) -> dict[str, str]:
        """The environment sbatch runs with, which the job inherits (--export=ALL): nothing of
        the server's own environment (no secrets), just enough to find programs and Slurm.
        Not --export=NONE: that makes slurmd build a login environment for the user (`su -`,
        the user's shell profile), which took 1-2 s per job here and is not ours to run."""
        env = {"PATH": path, "LANG": "C.UTF-8", "HOME": "/"}
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env

    def run(self, tool: str, *args: str, env: Mapping[str, str] | None = None) -> CliResult:
        """Run a tool; raise EngineUnavailable when it cannot reach slurmctld or is missing."""
        argv = self._argv(tool, args)
        try:
            proc = subprocess.run(
                argv,
                env=dict(env) if env is not None else self._env,
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError as exc:
            raise EngineUnavailable(f"Slurm tool {tool!r} not found ({exc}); is slurm-client installed?")
        except subprocess.TimeoutExpired:
            raise EngineUnavailable(f"`{' '.join(argv[:2])}` gave no answer within {self.timeout_s:.0f}s")
        result = CliResult(proc.returncode, proc.stdout, proc.stderr)
        if proc.returncode != 0 and looks_unreachable(proc.stderr):
            raise EngineUnavailable(f"Slurm is unreachable: {result.message}")
        return result

    def jobs(self, *filters: str, comment: bool = False) -> list[SlurmJob]:
        """The jobs `squeue --states=all <filters>` lists. The plain format, not --json: with a few
        hundred jobs in MinJobAge, `squeue --json` took 170-220 ms and printed 1.5 MB here, this
        20-25 ms and 30 kB, and (unlike --json in Slurm 22.05) it honours --users and --name.
        Anything on stderr means the answer cannot be trusted to be complete (an unknown user in
        --users prints an error and no jobs, exit 0): raised, never read as "no jobs".
        `comment`: with each job's comment too (SQUEUE_FORMAT_COMMENT: only with a --name filter)."""
        fmt = SQUEUE_FORMAT_COMMENT if comment else SQUEUE_FORMAT
        result = self.run("squeue", "--noheader", "--states=all", f"--Format={fmt}", *filters)
        if result.returncode != 0 or result.stderr.strip():
            raise EngineUnavailable(f"`squeue` failed: {result.message or f'exit {result.returncode}'}")
        return parse_squeue(result.stdout, comment)

    def jobs_by_id(self, job_ids: Sequence[str], comment: bool = False) -> list[SlurmJob]:
        """The jobs of these ids that Slurm still knows (`squeue --states=all --jobs=...`): only
        their lines, where `jobs(--users=...)` prints every job of the accounts within MinJobAge
        (hundreds in a burst, each parsed in Python at every poll). A job Slurm no longer knows is
        left out, as in `jobs`; asked alone, Slurm answers "Invalid job id specified" for it.
        Only the output is smaller: for two ids or more, squeue loads every job of the cluster
        from slurmctld and filters them itself (Slurm 22.05's squeue), where `--users` of one
        account was filtered in slurmctld. `comment`: as in `jobs` (only for ids of Corral's jobs,
        whose names have no "|")."""
        if not job_ids:
            return []
        try:
            return self.jobs(f"--jobs={','.join(job_ids)}", comment=comment)
        except EngineUnavailable as exc:
            if len(job_ids) == 1 and UNKNOWN_JOB in str(exc).lower():
                return []
            raise

    def node_hold(self, node: str) -> tuple[str, str] | None:
        """(state, reason) of a node as `sinfo` prints them (%T and %E: "drained", "disk check";
        the reason is "none" when there is none); None when Slurm lists no such node."""
        result = self.run("sinfo", "--noheader", "--Node", f"--nodes={node}", "--format=%T|%E")
        lines = result.stdout.splitlines() if result.returncode == 0 else []
        if not lines or "|" not in lines[0]:
            return None
        state, reason = lines[0].split("|", 1)
        return state.strip(), reason.strip()

    def run_json(self, tool: str, *args: str) -> SlurmReply:
        """Run a `--json` query. Errors reported inside the JSON (slurmctld down) are raised."""
        result = self.run(tool, *args, "--json")
        if result.returncode != 0:
            raise EngineUnavailable(f"`{tool} --json` failed: {result.message}")
        try:
            data: object = json.loads(result.stdout)
        except json.JSONDecodeError as exc:
            raise EngineUnavailable(f"`{tool} --json` printed no JSON: {exc}")
        if not isinstance(data, dict):
            raise EngineUnavailable(f"`{tool} --json` printed {type(data).__name__}, not an object")
        errors = data.get("errors") or []
        if errors:
            texts = "; ".join(
                f"{e.get('source', '?')}: {e.get('description') or e.get('error')}"
                for e in errors
                if isinstance(e, dict)
            )
            raise EngineUnavailable(f"Slurm is unreachable ({tool}): {texts}")
        # The JSON edge: Slurm's openapi schema is trusted here, once, rather than re-checked by
        # every reader (mapping.py reads each field defensively with .get and str()/int()).
        return cast(SlurmReply, data)
