"""Translations between Slurm's words and Corral's: job states -> AttemptStatus, sinfo nodes ->
NodeReport, Corral node states -> `scontrol update` arguments."""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason, NodeReport
from corral.engine.slurm.cli import SlurmJob, SlurmNode
from corral.scheduler.types import GPU, NodeState

if TYPE_CHECKING:
    from corral.engine.slurm.state import StopRequest

PENDING_STATES = frozenset(
    {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"}
)
RUNNING_STATES = frozenset(
    {"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING", "STAGE_OUT", "SPECIAL_EXIT"}
)
# Corral writes the kind of hold into the drain reason, so that a cordon and a drain come back apart
CORDON_PREFIX = "corral cordon"
DRAIN_PREFIX = "corral drain"
DOWN_PREFIX = "corral down"
CORRAL_REASONS = (CORDON_PREFIX, DRAIN_PREFIX, DOWN_PREFIX)
# The end of a job Corral killed because it could not read its status for too long, read once it
# could be (its own end, unreadable.failed_status, was not recorded then)
UNREADABLE_KILLED = (
    "cancelled by Corral: how its instances ended could not be read for too long "
    "(CORRAL_SLURM_UNREADABLE_GRACE_S); the traceback is in the server's log"
)


def slurm_state(job: SlurmJob) -> str:
    state = job.get("job_state", "")
    if isinstance(state, list):  # later openapi versions give a list of flags
        state = state[0] if state else ""
    return str(state).upper()


def decode_exit(raw: int) -> tuple[int, int | None]:
    """Slurm's exit_code in squeue --json is the raw wait status: (code, signal or None). A
    signal N is reported as code 128+N, like a shell and like the local engine."""
    if raw & 0x7F:
        return 128 + (raw & 0x7F), raw & 0x7F
    return shell_exit((raw >> 8) & 0xFF)


def shell_exit(code: int) -> tuple[int, int | None]:
    """A shell reports a child killed by signal N as 128+N: (code, signal or None)."""
    if 128 < code < 128 + 65:
        return code, code - 128
    return code, None


def _times(job: SlurmJob) -> tuple[float | None, float | None]:
    start = job.get("start_time") or 0
    end = job.get("end_time") or 0
    return (float(start) if start else None, float(end) if end else None)


_HINTS = {126: " (command not executable)", 127: " (command not found)"}


def failed_status(
    attempt_id: str,
    ref: str,
    code: int,
    signal: int | None,
    rank: int | None,
    started_at: float | None,
    finished_at: float | None,
) -> AttemptStatus:
    who = f"rank {rank}" if rank is not None else f"Slurm job {ref}"
    if signal is not None:
        reason, message = FailureReason.SIGNAL, f"{who} was killed by signal {signal}"
    else:
        reason, message = FailureReason.EXIT_CODE, f"{who} exited with code {code}{_HINTS.get(code, '')}"
    return AttemptStatus(
        attempt_id,
        AttemptPhase.FAILED,
        exit_code=code,
        reason=reason,
        message=message,
        started_at=started_at,
        finished_at=finished_at,
        engine_ref=ref,
    )


class SandboxRefusal(NamedTuple):
    """A rank whose bwrap refused to set up its sandbox (state.StateStore.sandbox_refusal)."""

    rank: int
    code: int  # the rank's exit: bwrap's own (1-127)
    why: str  # bwrap's words
    ran: tuple[int, ...] = ()  # the ranks whose command may have run (then it is the job's failure)


def terminal_status(
    attempt_id: str,
    job: SlurmJob,
    rank_exits: Mapping[int, int],
    stop_kind: str | None,
    refused: SandboxRefusal | None = None,
) -> AttemptStatus:
    """Status of a job Slurm reports as finished. `rank_exits` are the exit codes the instances
    wrote themselves, in the order they ended (more precise than Slurm's single code: the first
    failure is the cause); `stop_kind` is "stopped", "timeout" or "status_unreadable" (killed by
    engine.SlurmEngine._fail_unreadable, whose end was not recorded) when Corral asked the job to stop
    before it ended (then it counts as stopped even if it exited 0 on SIGTERM: a preempted job
    must not look done). `refused`: when the first rank to fail was bwrap refusing to set up its
    sandbox (state.StateStore.sandbox_refusal): launch_failed, the platform's, not the rank's exit
    1, only when no rank's command may have run; once one may have (its side effects, partial
    outputs), the job's own failure with bwrap's words, so that a re-run is charged to the job
    (the local engine's rule, local/supervisor.py Supervisor.refusal_outcome)."""
    ref = str(job.get("job_id", ""))
    state = slurm_state(job)
    started, finished = _times(job)
    code, sig = decode_exit(int(job.get("exit_code") or 0))
    failing = [(r, c) for r, c in rank_exits.items() if c != 0]
    rank: int | None = None
    if failing:
        rank, rank_code = failing[0]
        code, sig = shell_exit(rank_code)

    def status(phase: AttemptPhase, reason: FailureReason | None, message: str) -> AttemptStatus:
        exit_code = code if phase is not AttemptPhase.LOST else None
        return AttemptStatus(attempt_id, phase, exit_code, reason, message, started, finished, ref)

    if state == "NODE_FAIL" or state == "BOOT_FAIL":
        return status(
            AttemptPhase.LOST, FailureReason.NODE_LOST, f"Slurm job {ref}: {state} on {job.get('nodes')}"
        )
    if stop_kind is not None:
        if stop_kind == "timeout":
            return status(AttemptPhase.FAILED, FailureReason.TIMEOUT, "exceeded max_runtime")
        if stop_kind == FailureReason.STATUS_UNREADABLE.value:  # its end was not recorded then
            return status(AttemptPhase.FAILED, FailureReason.STATUS_UNREADABLE, UNREADABLE_KILLED)
        return status(AttemptPhase.FAILED, FailureReason.STOPPED, "stopped by Corral")
    if state in ("TIMEOUT", "DEADLINE"):
        return status(AttemptPhase.FAILED, FailureReason.TIMEOUT, f"Slurm time limit ({state})")
    if state == "OUT_OF_MEMORY":
        return status(AttemptPhase.FAILED, FailureReason.OOM, "Slurm: OUT_OF_MEMORY")
    if refused is not None and refused.ran:
        ranks = f"rank{'s' if len(refused.ran) > 1 else ''} {', '.join(map(str, refused.ran))}"
        message = (
            f"rank {refused.rank}: the sandbox did not start the job: {refused.why}; "
            f"{ranks} may have run the job's command, so this is the job's own failure"
        )
        return status(AttemptPhase.FAILED, FailureReason.EXIT_CODE, message)  # code: refused.code
    if refused is not None:
        message = f"rank {refused.rank}: the sandbox did not start the job: {refused.why}"
        return AttemptStatus(
            attempt_id,
            AttemptPhase.FAILED,
            None,
            FailureReason.LAUNCH_FAILED,
            message,
            started,
            finished,
            ref,
        )
    if failing:  # an instance failed (and the engine may have cancelled the rest of the gang)
        return failed_status(attempt_id, ref, code, sig, rank, started, finished)
    if state == "COMPLETED" and code == 0:
        return status(AttemptPhase.SUCCEEDED, None, "")
    if state == "CANCELLED":
        return status(
            AttemptPhase.FAILED, FailureReason.SIGNAL, f"Slurm job {ref} was cancelled outside Corral"
        )
    if state == "PREEMPTED":
        return status(AttemptPhase.FAILED, FailureReason.SIGNAL, f"Slurm job {ref} was preempted by Slurm")
    if code == 0:
        # FAILED without an exit code: Slurm could not start it (e.g. JobLaunchFailure)
        reason_text = str(job.get("state_reason") or "")
        return status(
            AttemptPhase.FAILED, FailureReason.LAUNCH_FAILED, f"Slurm: {state} {reason_text}".strip()
        )
    return failed_status(attempt_id, ref, code, sig, rank, started, finished)


def stop_kind(stop: StopRequest | None, job: SlurmJob) -> str | None:
    """terminal_status's `stop_kind`: the stop Corral requested, unless the job had ended before
    it (Slurm times are whole seconds)."""
    if stop is None:
        return None
    end = int(job.get("end_time") or 0)
    return stop.kind if not end or end >= int(stop.requested_at) else None


def live_status(attempt_id: str, job: SlurmJob) -> AttemptStatus:
    started, _ = _times(job)
    state = slurm_state(job)
    phase = AttemptPhase.PENDING if state in PENDING_STATES else AttemptPhase.RUNNING
    reason = str(job.get("state_reason") or "") if phase is AttemptPhase.PENDING else ""
    # what users read while Corral says "starting" (reconcile.note_engine_waits)
    message = f"Slurm holds it pending: {reason}" if reason and reason != "None" else ""
    return AttemptStatus(
        attempt_id,
        phase,
        message=message,
        started_at=started if phase is AttemptPhase.RUNNING else None,
        engine_ref=str(job.get("job_id", "")),
    )


# ---- nodes -----------------------------------------------------------------------------------------

_GRES_ENTRY = re.compile(r"^gpu(?::(?P<type>[^:(]+))?:(?P<count>\d+)")


def parse_gpu_gres(gres: str) -> list[tuple[str | None, int]]:
    """'gpu:a100:2(S:0),gpu:v100:2' -> [('a100', 2), ('v100', 2)]; 'gpu:4' -> [(None, 4)]."""
    entries, depth, cur = [], 0, ""
    for ch in gres:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            entries.append(cur)
            cur = ""
        else:
            cur += ch
    entries.append(cur)
    out: list[tuple[str | None, int]] = []
    for entry in entries:
        m = _GRES_ENTRY.match(entry.strip())
        if m:
            out.append((m.group("type"), int(m.group("count"))))
    return out


def _state_parts(node: SlurmNode) -> tuple[str, set[str], str]:
    """A `sinfo --json` node's base state (lower case), state flags (upper case) and reason."""
    flags = {str(f).upper() for f in node.get("state_flags") or []}
    return str(node.get("state", "")).lower(), flags, str(node.get("reason") or "")


def _drained(base: str, flags: set[str]) -> bool:
    return "DRAIN" in flags or base in ("drained", "draining", "drain")


def node_state(node: SlurmNode) -> tuple[NodeState, str]:
    base, flags, reason = _state_parts(node)
    if base in ("down", "future") or "FAIL" in flags:
        return NodeState.DOWN, reason or f"Slurm: {base}"
    if base == "unknown" or "NOT_RESPONDING" in flags:
        return NodeState.UNKNOWN, reason or "Slurm: node not responding"
    if _drained(base, flags):
        if reason.startswith(CORDON_PREFIX):
            return NodeState.CORDONED, reason
        return NodeState.DRAINING, reason or "Slurm: drain"
    return NodeState.READY, ""


def node_hold(node: SlurmNode) -> tuple[str, str]:
    """(state, reason) of a `sinfo --json` node in the terms of sinfo's %T and %E, as far as
    `held_in_slurm` reads them (does the state start with "drain"): "drained" when it is drained
    or draining (whatever its base state, as %T prints it), else its base state; the reason,
    "none" when there is none."""
    base, flags, reason = _state_parts(node)
    return ("drained" if _drained(base, flags) else base), reason or "none"


class NodeHolds:
    """Each node's `node_hold` from the engine's last `sinfo --json` (nodes()), for set_node_state's
    "is this node held in Slurm?": the node loop pushes right after its report. None for a node
    it did not list, one Corral set since (`forget`), or when it is older than FRESH_S: then the
    engine asks `sinfo` for that node."""

    FRESH_S = 2.0

    def __init__(self) -> None:
        self._holds: dict[str, tuple[str, str]] = {}
        self._at = float("-inf")

    def keep(self, nodes: Mapping[str, SlurmNode], at: float) -> None:
        self._holds = {name: node_hold(n) for name, n in nodes.items()}
        self._at = at

    def get(self, node: str) -> tuple[str, str] | None:
        if time.monotonic() - self._at > self.FRESH_S:
            return None
        return self._holds.get(node)

    def forget(self, node: str | None = None) -> None:
        """One node (set since the report), or all (Slurm unreachable)."""
        if node is None:
            self._holds = {}
        else:
            self._holds.pop(node, None)


def gpu_uuid(node: str, index: int) -> str:
    """Slurm does not tell GPU UUIDs: a stable stand-in (the devices a job gets are Slurm's choice,
    see scripts.py, so the stand-in is never translated back)."""
    return f"SLURM-{node}-gpu{index}"


def node_report(node: SlurmNode, default_gpu_model: str) -> NodeReport:
    name = str(node["name"])
    gpus: list[GPU] = []
    for gpu_type, count in parse_gpu_gres(str(node.get("gres") or "")):
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                GPU(index=index, uuid=f"SLURM-{name}-gpu{index}", model=gpu_type or default_gpu_model)
            )
    state, message = node_state(node)
    labels = {
        "slurm.partitions": ",".join(node.get("partitions") or []),
        "slurm.state": "+".join([str(node.get("state", "")), *(node.get("state_flags") or [])]),
    }
    if node.get("features"):
        labels["slurm.features"] = str(node["features"])
    return NodeReport(
        name=name,
        cpus=float(node.get("cpus") or 0),
        memory_mib=int(node.get("real_memory") or 0),
        gpus=tuple(gpus),
        state=state,
        address=str(node.get("address") or name),
        labels=labels,
        message=message,
    )


def held_in_slurm(state: NodeState, sinfo_state: str, reason: str) -> bool:
    """Whether setting a node to Corral's `state` would undo or take over a hold made in Slurm
    itself (an admin's `scontrol update ... state=drain|down`, slurmctld's "Not responding"): the
    node has a reason Corral did not write. Corral resumes only its own holds; nor does it relabel
    another's drain as its cordon or drain, which its uncordon would then resume (a node that is
    down is still drained, so that it stays out once back). `sinfo_state`, `reason`: sinfo's %T
    and %E ("drained", "disk check"; "none" for no reason)."""
    if reason in ("", "none") or reason.startswith(CORRAL_REASONS):
        return False
    if state is NodeState.READY:
        return True
    return state in (NodeState.CORDONED, NodeState.DRAINING) and sinfo_state.startswith("drain")


def scontrol_state_args(node: str, state: NodeState, reason: str) -> list[str]:
    """`scontrol update` arguments for a Corral node state."""
    if state is NodeState.READY:
        return ["update", f"nodename={node}", "state=resume"]
    if state is NodeState.CORDONED:
        return [
            "update",
            f"nodename={node}",
            "state=drain",
            f"reason={CORDON_PREFIX}: {reason or 'cordoned'}",
        ]
    if state is NodeState.DRAINING:
        return ["update", f"nodename={node}", "state=drain", f"reason={DRAIN_PREFIX}: {reason or 'drained'}"]
    if state is NodeState.DOWN:
        return ["update", f"nodename={node}", "state=down", f"reason={DOWN_PREFIX}: {reason or 'down'}"]
    raise ValueError(
        f"cannot set node {node} to {state.value!r} in Slurm; use ready, cordoned, draining or down"
    )
