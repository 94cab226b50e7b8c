"""Interactive work: workspaces, entering a running job's sandbox, SSH keys."""

from __future__ import annotations

from collections.abc import Sequence
from types import EllipsisType
from typing import Any

from corral.exec_client import ExecResult, ExecSession, run_collect
from corral.sdk.base import BaseClient, seg


class WorkspacesApi(BaseClient):
    """Workspaces (docs/workspaces.md) and sandbox entry (corral.exec_client)."""

    # --- interactive workspaces (`corral ws`; docs/workspaces.md) ---------------------------------
    def workspaces(self, *, user: str | None = None, all_users: bool = False) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"user": user} if user else {}
        if all_users:
            params["all"] = "true"
        return self.request("GET", "/workspaces", params=params or None)

    def create_workspace(self, name: str | None = None, **fields: Any) -> dict[str, Any]:
        """Create and start a workspace. `fields`: gpus, gpu_model, cpus, memory ("16GiB"),
        environment, idle_timeout ("2h"), group, start (False: create it stopped)."""
        body = {k: v for k, v in fields.items() if v is not None}
        if name is not None:
            body["name"] = name
        return self.request("POST", "/workspaces", json=body)

    def workspace(self, name: str, *, user: str | None = None) -> dict[str, Any]:
        return self.request("GET", f"/workspaces/{seg(name)}", params={"user": user} if user else None)

    def start_workspace(self, name: str, *, user: str | None = None) -> dict[str, Any]:
        params = {"user": user} if user else None
        return self.request("POST", f"/workspaces/{seg(name)}/start", params=params)

    def stop_workspace(self, name: str, *, user: str | None = None) -> dict[str, Any]:
        params = {"user": user} if user else None
        return self.request("POST", f"/workspaces/{seg(name)}/stop", params=params)

    def remove_workspace(self, name: str, *, user: str | None = None) -> None:
        params = {"user": user} if user else None
        self.request("DELETE", f"/workspaces/{seg(name)}", params=params)

    def workspace_policies(self) -> list[dict[str, Any]]:
        return self.request("GET", "/workspaces/policies")

    def set_workspace_policy(
        self,
        group: str,
        *,
        default_idle_timeout: str | EllipsisType | None = ...,
        max_idle_timeout: str | EllipsisType | None = ...,
    ) -> dict[str, Any]:
        """Each value given replaces the group's (None: back to the server's); one left out keeps
        the group's. The answer's `*_source` says whose each value is ("group" or "server")."""
        given = {"default_idle_timeout": default_idle_timeout, "max_idle_timeout": max_idle_timeout}
        body = {k: v for k, v in given.items() if not isinstance(v, EllipsisType)}
        return self.request("PUT", f"/workspaces/policies/{seg(group)}", json=body)

    # --- sandbox entry and SSH keys (corral.exec_client; docs/workspaces.md) ---------------------

    def ssh_keys(self) -> list[dict[str, Any]]:
        return self.request("GET", "/ssh-keys")

    def add_ssh_key(self, public_key: str, name: str) -> dict[str, Any]:
        return self.request("POST", "/ssh-keys", json={"name": name, "public_key": public_key})

    def remove_ssh_key(self, key_id: int) -> None:
        self.request("DELETE", f"/ssh-keys/{seg(key_id)}")

    def exec_session(
        self,
        job_id: int,
        argv: Sequence[str],
        *,
        rank: int = 0,
        tty: bool = False,
        rows: int = 24,
        cols: int = 80,
    ) -> ExecSession:
        """A process inside the running job's sandbox (owner or admin); ExecError if refused."""
        request = {"argv": list(argv), "rank": rank, "tty": tty, "rows": rows, "cols": cols}
        return ExecSession.open(self.url, self._token, job_id, request)

    def exec(self, job_id: int, argv: Sequence[str], *, rank: int = 0, stdin: bytes = b"") -> ExecResult:
        """Runs `argv` in the job's sandbox to the end: exit code, stdout and stderr."""
        with self.exec_session(job_id, argv, rank=rank) as session:
            return run_collect(session, stdin)

    def port_relay(self, job_id: int, port: int, *, rank: int = 0) -> ExecSession:
        """A byte stream to 127.0.0.1:`port` in the job's network namespace (one TCP connection)."""
        return ExecSession.open(self.url, self._token, job_id, {"port": port, "rank": rank})
