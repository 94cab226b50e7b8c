"""`GET /cluster/summary`: GPUs allocated/free by model, nodes and jobs by state (dashboard)."""

from __future__ import annotations

from fastapi import APIRouter

from corral.api.deps import DB, CurrentUser
from corral.services.nodes import ClusterSummary, cluster_summary

router = APIRouter(tags=["cluster"])


@router.get("/cluster/summary")
def summary(db: DB, _principal: CurrentUser) -> ClusterSummary:
    return cluster_summary(db)
