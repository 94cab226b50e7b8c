"""Node failure risk in the server: the GPU sampling loop feeds each pass to the anomaly detector
(corral.monitor.anomaly, kept in the loop's memory) and stores the scores in `monitor_state`
under the key "anomaly", so that every reader sees the same figures whichever process sampled:
`/metrics` (`corral_gpu_anomaly_score`, `corral_node_failure_risk`), `GET /api/v1/nodes/risk`
(the "risky nodes" view of `corral node risk` and the portal's Nodes page).

The detector's baselines live in memory: after a restart they are rebuilt from new samples (the
residual signals wait for `min_baseline` readings per load level; lost, flapping, ECC and Xid are
scored at once). The stored scores are the last pass's; `updated_at` says when that was.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import APIRouter, Query
from sqlalchemy.orm import Session

from corral.api.deps import DB, CurrentUser
from corral.monitor.anomaly import AnomalyDetector, DetectorConfig, NodeRisk
from corral.monitor.collector import Family, _esc
from corral.monitor.config import AnomalyRules
from corral.monitor.gpu import GpuSample
from corral.monitor.models import MonitorState

STATE_KEY = "anomaly"
MAX_REASONS = 5  # per node, in the stored view: enough to say why, short enough to scan

router = APIRouter()


def detector_config(rules: AnomalyRules) -> DetectorConfig:
    return DetectorConfig(
        window_s=rules.window, recent_s=rules.recent, trend_s=rules.trend, settle_s=rules.settle,
        baseline_refresh_s=rules.baseline_refresh, ecc_window_s=rules.ecc_window,
        min_baseline=rules.min_baseline, temp_limit_c=rules.temperature_limit_c,
    )  # fmt: skip


def update_risk(
    session: Session, detector: AnomalyDetector, samples: Sequence[GpuSample], now: float
) -> None:
    """Feed one sampling pass to the detector and store its scores (the caller commits)."""
    detector.observe(samples, now)
    detector.forget((s.node, s.index) for s in samples)  # GPUs no longer sampled (node removed)
    value = {"updated_at": now, "nodes": [_node_dict(r) for r in detector.node_risks()]}
    row = session.get(MonitorState, STATE_KEY)
    if row is None:
        session.add(MonitorState(key=STATE_KEY, value=value))
    else:
        row.value = value


def _node_dict(risk: NodeRisk) -> dict[str, Any]:
    return {
        "node": risk.node,
        "risk": risk.risk,
        "reasons": risk.reasons[:MAX_REASONS],
        "gpus": [{"index": g.index, "score": g.score, "reasons": list(g.reasons)} for g in risk.gpus],
    }


def read_risk(session: Session) -> dict[str, Any]:
    """{"updated_at": float | None, "nodes": [...]} with nodes highest risk first."""
    row = session.get(MonitorState, STATE_KEY)
    if row is None:
        return {"updated_at": None, "nodes": []}
    return {"updated_at": row.value.get("updated_at"), "nodes": list(row.value.get("nodes", []))}


def risk_families(session: Session) -> list[Family]:
    """The detector's scores as metric families (rendered by corral.monitor.collector)."""
    gpu = Family(
        "corral_gpu_anomaly_score",
        "gauge",
        "How far the GPU's readings are from its own baseline, 0-1.",
    )
    node = Family(
        "corral_node_failure_risk",
        "gauge",
        "Risk that the node starts failing jobs soon, 0-1.",
    )
    for entry in read_risk(session)["nodes"]:
        name = f'node="{_esc(str(entry["node"]))}"'
        node.add(name, float(entry["risk"]))
        for g in entry["gpus"]:
            gpu.add(f'{name},gpu="{int(g["index"])}"', float(g["score"]))
    return [gpu, node]


@router.get("/api/v1/nodes/risk")
def get_node_risk(
    db: DB,
    _user: CurrentUser,
    min_risk: float = Query(0.0, ge=0.0, le=1.0, description="only nodes at least this risky"),
) -> dict[str, Any]:
    """Nodes by failure risk, highest first, with the reasons the detector gives."""
    data = read_risk(db)
    data["nodes"] = [n for n in data["nodes"] if n["risk"] >= min_risk]
    return data
