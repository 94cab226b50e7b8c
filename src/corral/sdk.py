"""Python SDK for Corral's REST API (httpx). The `corral` CLI is built on it, so AutoML tools get
exactly the same calls:

    from corral.sdk import Client
    client = Client.from_config()            # $CORRAL_URL/$CORRAL_TOKEN or $CORRAL_HOME/config.yaml
    job = client.submit({"name": "t", "command": "python train.py", "resources": {"gpus": 1}})
    job = client.wait(job["id"])

Also home of the CLI config file (`$CORRAL_HOME/config.yaml`, mode 0600: url + token) that the
server writes for the bootstrapped admin.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

from corral.config import default_home

DEFAULT_URL = "http://127.0.0.1:8080"
CONFIG_FILE = "config.yaml"
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled"})


# --- CLI config ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientConfig:
    url: str = DEFAULT_URL
    token: str | None = None


def config_path(home: Path | None = None) -> Path:
    return (home or default_home()) / CONFIG_FILE


def write_cli_config(url: str, token: str, home: Path | None = None) -> Path:
    """Write url + token to `$CORRAL_HOME/config.yaml`, readable by its owner only (0600)."""
    path = config_path(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Create with 0600 from the start so the token is never briefly world-readable.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump({"url": url, "token": token}, fh)
    os.chmod(path, 0o600)
    return path


def load_cli_config(home: Path | None = None, env: Mapping[str, str] | None = None) -> ClientConfig:
    """The config file, overridden by CORRAL_URL / CORRAL_TOKEN from the environment."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    path = config_path(home)
    if path.exists():
        loaded = yaml.safe_load(path.read_text()) or {}
        if isinstance(loaded, dict):
            data = loaded
    url = env.get("CORRAL_URL") or data.get("url") or DEFAULT_URL
    token = env.get("CORRAL_TOKEN") or data.get("token")
    return ClientConfig(url=str(url).rstrip("/"), token=str(token) if token else None)


# --- errors -------------------------------------------------------------------------------------


class CorralError(Exception):
    """Anything that went wrong talking to Corral, with a message fit for a person."""

    def __init__(self, message: str, status_code: int | None = None, detail: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.detail = detail


class ServerUnreachable(CorralError):
    pass


class AuthenticationFailed(CorralError):
    pass


class ApiError(CorralError):
    pass


def describe_detail(detail: Any) -> str:
    """`{"detail": ...}` as one readable text (422 lists become "field.path: message" lines)."""
    if isinstance(detail, list):
        lines = []
        for item in detail:
            if isinstance(item, dict):
                loc = [str(p) for p in item.get("loc", []) if p not in ("body", "query", "path")]
                where = ".".join(loc)
                lines.append(f"{where}: {item.get('msg')}" if where else str(item.get("msg")))
            else:
                lines.append(str(item))
        return "\n".join(lines)
    return str(detail)


# --- client -------------------------------------------------------------------------------------


class Keep:
    """The type of KEEP: "leave this setting as it is" where None already means "no limit"."""

    def __repr__(self) -> str:
        return "KEEP"


KEEP = Keep()


class Client:
    def __init__(
        self,
        url: str = DEFAULT_URL,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=f"{self.url}/api/v1", headers=headers, timeout=timeout, transport=transport
        )

    @classmethod
    def from_config(cls, home: Path | None = None, **kwargs: Any) -> Client:
        cfg = load_cli_config(home)
        return cls(cfg.url, cfg.token, **kwargs)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.ConnectError:
            raise ServerUnreachable(
                f"cannot reach the Corral server at {self.url}; is it running "
                "(`corral up`) and is CORRAL_URL right?"
            )
        except httpx.TimeoutException:
            raise ServerUnreachable(f"the Corral server at {self.url} did not answer in time")
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"cannot talk to the Corral server at {self.url}: {exc}")
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = {"detail": response.text}
        if response.is_success:
            return body
        detail = body.get("detail") if isinstance(body, dict) else body
        text = describe_detail(detail)
        if response.status_code == 401:
            raise AuthenticationFailed(
                f"authentication failed: {text}. Check CORRAL_TOKEN or {config_path()}", 401, detail
            )
        raise ApiError(text, response.status_code, detail)

    # jobs
    def submit(self, spec: Mapping[str, Any] | str | Path) -> dict[str, Any]:
        """Submit a spec given as a mapping, YAML text, or a path to a YAML file."""
        if isinstance(spec, Path):
            spec = spec.read_text()
        if isinstance(spec, str):
            return self.request(
                "POST", "/jobs", content=spec.encode(), headers={"Content-Type": "application/yaml"}
            )
        return self.request("POST", "/jobs", json=dict(spec))

    def jobs(
        self,
        *,
        state: str | None = None,
        user: str | None = None,
        group: str | None = None,
        sort: str = "created_at",
        order: str = "desc",
        limit: int = 50,
        offset: int = 0,
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"sort": sort, "order": order, "limit": limit, "offset": offset}
        params.update({k: v for k, v in {"state": state, "user": user, "group": group}.items() if v})
        return self.request("GET", "/jobs", params=params)

    def job(self, job_id: int) -> dict[str, Any]:
        return self.request("GET", f"/jobs/{job_id}")

    def cancel(self, job_id: int) -> dict[str, Any]:
        return self.request("POST", f"/jobs/{job_id}/cancel")

    def delete(self, job_id: int) -> None:
        """Delete a finished job and its logs (owner or admin)."""
        self.request("DELETE", f"/jobs/{job_id}")

    def events(self, job_id: int) -> list[dict[str, Any]]:
        return self.request("GET", f"/jobs/{job_id}/events")

    def logs(
        self, job_id: int, *, attempt: int | None = None, rank: int = 0, offset: int = 0
    ) -> dict[str, Any]:
        params: dict[str, Any] = {"rank": rank, "offset": offset}
        if attempt is not None:
            params["attempt"] = attempt
        return self.request("GET", f"/jobs/{job_id}/logs", params=params)

    def follow_logs(self, job_id: int, *, rank: int = 0, poll_s: float = 0.5) -> Iterator[str]:
        """Yield log text as it arrives until the job has ended and everything was read. Follows
        a retried job onto its newest attempt."""
        attempt: int | None = None
        offset = 0
        while True:
            chunk = self.logs(job_id, attempt=attempt, rank=rank, offset=offset)
            if chunk.get("attempt") is not None and attempt is None:
                attempt = chunk["attempt"]
            if chunk["data"]:
                yield chunk["data"]
            offset = chunk["next_offset"]
            if chunk["eof"]:
                job = self.job(job_id)
                newest = job["attempts"][-1]["number"] if job["attempts"] else None
                if newest is not None and attempt is not None and newest != attempt:
                    attempt, offset = newest, 0
                    continue
                if job["state"] in TERMINAL_STATES:
                    return
            if not chunk["data"]:
                time.sleep(poll_s)

    def wait(self, job_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> dict[str, Any]:
        """Poll until the job reaches a terminal state; returns the job. TimeoutError on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            job = self.job(job_id)
            if job["state"] in TERMINAL_STATES:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is still {job['state']} after {timeout_s} s")
            time.sleep(poll_s)

    # nodes and cluster
    def nodes(self) -> list[dict[str, Any]]:
        return self.request("GET", "/nodes")

    # --- anomaly detection (corral.monitor.risk)
    def node_risk(self, min_risk: float = 0.0) -> dict[str, Any]:
        """{"updated_at", "nodes": [{"node", "risk", "reasons", "gpus"}]}, highest risk first."""
        return self.request("GET", "/nodes/risk", params={"min_risk": min_risk})

    def node_action(self, name: str, action: str) -> dict[str, Any]:
        """action: cordon | uncordon | drain (admin)."""
        return self.request("POST", f"/nodes/{name}/{action}")

    def cluster_summary(self) -> dict[str, Any]:
        return self.request("GET", "/cluster/summary")

    def usage(
        self, *, since: float | None = None, until: float | None = None, by: str = "user"
    ) -> dict[str, Any]:
        """GPU-hours and CPU-hours per user or group over [since, until) (unix seconds)."""
        params: dict[str, Any] = {"by": by}
        params.update({k: v for k, v in {"since": since, "until": until}.items() if v is not None})
        return self.request("GET", "/usage", params=params)

    def me(self) -> dict[str, Any]:
        return self.request("GET", "/me")

    # groups
    def groups(self) -> list[dict[str, Any]]:
        return self.request("GET", "/groups")

    def create_group(self, name: str, **fields: Any) -> dict[str, Any]:
        return self.request("POST", "/groups", json={"name": name, **fields})

    def group(self, name: str) -> dict[str, Any]:
        return self.request("GET", f"/groups/{name}")

    def set_quota(
        self,
        group: str,
        *,
        gpu_model: str = "*",
        guaranteed: int | None = None,
        max_gpus: int | Keep | None = KEEP,
        **group_fields: Any,
    ) -> dict[str, Any]:
        """Change only what is passed. The GPU quota of `gpu_model` changes when `guaranteed` or
        `max_gpus` is passed (`max_gpus=None`: no limit); the rest keeps its value. Group-wide
        fields: user_max_gpus, weight, borrowing, cpus_guaranteed, cpus_max,
        memory_guaranteed_mib, memory_max_mib (None clears the limits: no per-user cap, no max)."""
        body: dict[str, Any] = dict(group_fields)
        if guaranteed is not None or not isinstance(max_gpus, Keep):
            body["gpu_model"] = gpu_model
            if guaranteed is not None:
                body["guaranteed"] = guaranteed
            if not isinstance(max_gpus, Keep):
                body["max"] = max_gpus
        return self.request("PUT", f"/groups/{group}/quota", json=body)

    def add_member(self, group: str, user: str, role: str = "member") -> dict[str, Any]:
        return self.request("POST", f"/groups/{group}/members", json={"user": user, "role": role})

    # users and tokens
    def users(self) -> list[dict[str, Any]]:
        return self.request("GET", "/users")

    def create_user(
        self,
        name: str,
        *,
        password: str | None = None,
        is_admin: bool = False,
        groups: list[str] | None = None,
        default_group: str | None = None,
    ) -> dict[str, Any]:
        body = {
            "name": name,
            "password": password,
            "is_admin": is_admin,
            "groups": groups or [],
            "default_group": default_group,
        }
        return self.request("POST", "/users", json=body)

    def set_default_group(self, user: str, group: str) -> dict[str, Any]:
        return self.request("PUT", f"/users/{user}/default-group", json={"group": group})

    def set_password(self, user: str, password: str, *, current_password: str | None = None) -> None:
        body = {"password": password, "current_password": current_password}
        self.request("PUT", f"/users/{user}/password", json=body)

    def tokens(self) -> list[dict[str, Any]]:
        return self.request("GET", "/tokens")

    def create_token(
        self, name: str = "cli", *, user: str | None = None, expires_in_days: float | None = None
    ) -> dict[str, Any]:
        return self.request(
            "POST", "/tokens", json={"name": name, "user": user, "expires_in_days": expires_in_days}
        )

    def revoke_token(self, token_id: int) -> None:
        self.request("DELETE", f"/tokens/{token_id}")
