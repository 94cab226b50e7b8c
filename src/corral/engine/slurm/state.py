"""The Slurm engine's own durable memory: one JSON file per attempt, next to its scripts and logs.

It holds what Slurm may forget or never knew: the Slurm job id (so launch is idempotent and a
restarted server re-adopts), a stop Corral requested (kind, deadline) and the terminal status once
seen (so a finished attempt is reported the same way forever, exactly once as finished even after
Slurm purged the job after MinJobAge).
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from corral.engine.base import AttemptPhase, AttemptStatus, FailureReason


@dataclass
class StopRequest:
    requested_at: float
    grace_s: float
    kind: str = "stopped"  # "stopped" (cancel, preemption) or "timeout" (max_runtime)
    killed: bool = False  # the final kill after the grace period was sent

    @property
    def deadline(self) -> float:
        return self.requested_at + self.grace_s


@dataclass
class AttemptRecord:
    attempt_id: str
    slurm_job_id: str = ""
    submitted_at: float = 0.0
    n_ranks: int = 1
    max_runtime_s: float | None = None
    stop: StopRequest | None = None
    final: dict[str, Any] | None = field(default=None)  # AttemptStatus fields once finished

    @property
    def ref(self) -> str:
        return self.slurm_job_id

    def final_status(self) -> AttemptStatus | None:
        if self.final is None:
            return None
        f = dict(self.final)
        return AttemptStatus(
            attempt_id=self.attempt_id,
            phase=AttemptPhase(f["phase"]),
            exit_code=f.get("exit_code"),
            reason=FailureReason(f["reason"]) if f.get("reason") else None,
            message=f.get("message", ""),
            started_at=f.get("started_at"),
            finished_at=f.get("finished_at"),
            engine_ref=f.get("engine_ref", ""),
        )

    def set_final(self, status: AttemptStatus) -> None:
        self.final = {
            "phase": status.phase.value,
            "exit_code": status.exit_code,
            "reason": status.reason.value if status.reason else None,
            "message": status.message,
            "started_at": status.started_at,
            "finished_at": status.finished_at,
            "engine_ref": status.engine_ref,
        }


class StateStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.attempts = root / "attempts"
        self.attempts.mkdir(parents=True, exist_ok=True)

    def attempt_dir(self, attempt_id: str) -> Path:
        return self.attempts / attempt_id

    def _file(self, attempt_id: str) -> Path:
        return self.attempt_dir(attempt_id) / "attempt.json"

    def load(self, attempt_id: str) -> AttemptRecord | None:
        try:
            data = json.loads(self._file(attempt_id).read_text())
        except FileNotFoundError:
            return None
        stop = data.pop("stop", None)
        return AttemptRecord(**data, stop=StopRequest(**stop) if stop else None)

    def save(self, record: AttemptRecord) -> None:
        self._atomic_write(self._file(record.attempt_id), json.dumps(asdict(record), indent=1))

    def rank_exits(self, attempt_id: str) -> dict[int, int]:
        """Exit codes the instances wrote (rank-R.exit), in the order they ended (the first
        failure is the cause; the others were killed because of it). A killed rank writes none."""
        found: list[tuple[int, int, int]] = []
        for path in self.attempt_dir(attempt_id).glob("rank-*.exit"):
            try:
                found.append(
                    (path.stat().st_mtime_ns, int(path.stem.split("-", 1)[1]), int(path.read_text()))
                )
            except (ValueError, OSError):
                continue
        return {rank: code for _, rank, code in sorted(found)}

    def first_failure_time(self, attempt_id: str) -> float | None:
        """When the first instance ended with a non-zero code (unix seconds), if one did."""
        times = []
        for path in self.attempt_dir(attempt_id).glob("rank-*.exit"):
            try:
                if int(path.read_text()) != 0:
                    times.append(path.stat().st_mtime)
            except (ValueError, OSError):
                continue
        return min(times) if times else None

    def log_path(self, attempt_id: str, rank: int) -> Path:
        return self.attempt_dir(attempt_id) / f"rank-{rank}.log"

    def save_nodes(self, nodes: list[dict[str, Any]]) -> None:
        self._atomic_write(self.root / "nodes.json", json.dumps(nodes))

    def load_nodes(self) -> list[dict[str, Any]]:
        try:
            data = json.loads((self.root / "nodes.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return []
        return data if isinstance(data, list) else []

    @staticmethod
    def _atomic_write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
