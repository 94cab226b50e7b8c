"""Nodes, the cluster's summary, usage and the simulator's export of the live cluster."""

from __future__ import annotations

from typing import Any

from corral.sdk.base import BaseClient, seg


class ClusterApi(BaseClient):
    """Nodes and the cluster as a whole."""

    def nodes(self) -> list[dict[str, Any]]:
        return self.request("GET", "/nodes")

    # --- anomaly detection (corral.monitor.risk)
    def node_risk(self, min_risk: float = 0.0) -> dict[str, Any]:
        """{"updated_at", "nodes": [{"node", "risk", "reasons", "gpus"}]}, highest risk first."""
        return self.request("GET", "/nodes/risk", params={"min_risk": min_risk})

    def node_action(self, name: str, action: str) -> dict[str, Any]:
        """action: cordon | uncordon | drain (admin)."""
        return self.request("POST", f"/nodes/{seg(name)}/{seg(action)}")

    def remove_node(self, name: str) -> None:
        """Delete a cordoned, drained or down node with nothing on it (admin)."""
        self.request("DELETE", f"/nodes/{seg(name)}")

    def cluster_summary(self) -> dict[str, Any]:
        return self.request("GET", "/cluster/summary")

    def gpu_usage(self) -> dict[str, Any]:
        """{"gpus": [{"node", "gpu", "model", "allocated", "job_id", "group", "present",
        "utilization_percent", "memory_used_mib", "sampled_at"}], "workspace_gpu_hours_reclaimed"}:
        every GPU's latest reading; `job_id` and `group` only where the caller may see them."""
        return self.request("GET", "/gpus")

    def usage(
        self, *, since: float | str | None = None, until: float | str | None = None, by: str = "user"
    ) -> dict[str, Any]:
        """GPU-hours and CPU-hours per user or group over [since, until): each unix seconds, an
        age such as "7d", "12h" or "30m" (that long before now) or an ISO time (UTC unless it
        says otherwise)."""
        params: dict[str, Any] = {"by": by}
        params.update({k: v for k, v in {"since": since, "until": until}.items() if v is not None})
        return self.request("GET", "/usage", params=params)

    def sim_export(
        self, *, since: str = "30d", anonymise: bool = False, unfinished: bool = False
    ) -> dict[str, Any]:
        """The platform's job history since `since` (an age such as "30d", unix seconds or an ISO
        time) as a simulator trace with the current cluster and quotas (admins only;
        docs/simulator.md, "What-if on the live cluster")."""
        params = {"since": since, "anonymise": anonymise, "unfinished": unfinished}
        return self.request("GET", "/admin/sim-export", params=params)

    def me(self) -> dict[str, Any]:
        return self.request("GET", "/me")
