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

import base64
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import yaml

from corral.config import default_home
from corral.exec_client import ExecResult, ExecSession, run_collect
from corral.spec import SpecError, load_spec_text
from corral.storage.code import CHUNK_MAX as CODE_CHUNK
from corral.storage.code import check_path as check_code_path
from corral.storage.code import sha256_file
from corral.storage.ignore import CodeDirError
from corral.storage.ignore import scan as scan_code

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
        self._token = token
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
    def submit(self, spec: Mapping[str, Any] | str | Path, *, code: str | None = None) -> dict[str, Any]:
        """Submit a spec given as a mapping, YAML text, or a path to a YAML file. `code`: a code
        snapshot id (upload_code) the job runs in, mounted read-only at /code."""
        if isinstance(spec, Path):
            spec = spec.read_text()
        if code is not None:
            try:
                data = load_spec_text(spec) if isinstance(spec, str) else dict(spec)
            except SpecError as exc:
                raise CorralError(str(exc))
            if not isinstance(data, dict):
                raise CorralError("the spec must be a mapping with fields such as 'name' and 'tasks'")
            return self.request("POST", "/jobs", json={**data, "code": code})
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

    # storage (corral.storage): `--code` snapshots and job outputs
    def upload_code(self, directory: Path) -> CodeUpload:
        """Snapshot `directory` (minus .gitignore/.corralignore matches) on the server: hashes
        every file, uploads only the blobs the server lacks (in chunks), then the manifest."""
        try:
            files = scan_code(Path(directory))
        except (CodeDirError, OSError) as exc:
            raise CorralError(str(exc))
        if not files:
            raise CorralError(f"--code {directory}: no files to upload (all ignored?)")
        hashes = {f.path: sha256_file(f.abs_path) for f in files}
        missing = set(
            self.request("POST", "/code/missing", json={"hashes": sorted(set(hashes.values()))})["missing"]
        )
        sent = 0
        for f in files:
            sha = hashes[f.path]
            if sha in missing:
                sent += self._upload_blob(f.abs_path, sha)
                missing.discard(sha)
        manifest = "".join(f"{hashes[f.path]} {'x' if f.executable else '-'} {f.path}\n" for f in files)
        snap = self.request(
            "POST", "/code/snapshots", content=manifest.encode(), headers={"Content-Type": "text/plain"}
        )
        return CodeUpload(snap["id"], len(files), sum(f.size for f in files), sent)

    def _upload_blob(self, path: Path, sha: str) -> int:
        """One blob in chunks; resumes where the server's partial copy ends (409 names it)."""
        offset = 0
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            while True:
                f.seek(offset)
                chunk = f.read(CODE_CHUNK)
                final = offset + len(chunk) >= size
                try:
                    self.request(
                        "PUT",
                        f"/code/blobs/{sha}",
                        params={"offset": offset, "final": str(final).lower()},
                        content=chunk,
                        headers={"Content-Type": "application/octet-stream"},
                    )
                except ApiError as exc:
                    resume = re.search(r"resume at offset (\d+)", exc.message)
                    if exc.status_code != 409 or resume is None or int(resume.group(1)) == offset:
                        raise
                    offset = int(resume.group(1))
                    continue
                offset += len(chunk)
                if final:
                    return size

    def storage_identities(self) -> list[dict[str, Any]]:
        """Admin: [{kind: user|group, name, id, current}] (allocates ids not given yet)."""
        items: list[dict[str, Any]] = self.request("POST", "/storage/identities")["items"]
        return items

    def job_outputs(self, job_id: int) -> list[dict[str, Any]]:
        """The files the job wrote under /outputs: [{path, size, modified_at}]."""
        items: list[dict[str, Any]] = self.request("GET", f"/jobs/{job_id}/outputs")["items"]
        return items

    def download_output(self, job_id: int, path: str, dest: Path) -> int:
        """One output file to `dest` (written to a temp name, renamed when complete)."""
        tmp = dest.with_name(f".{dest.name}.part")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self._http.stream("GET", f"/jobs/{job_id}/outputs/file", params={"path": path}) as response:
            if not response.is_success:
                response.read()
                raise ApiError(describe_detail(response.json().get("detail")), response.status_code)
            with open(tmp, "wb") as f:
                for block in response.iter_bytes():
                    f.write(block)
        os.replace(tmp, dest)
        return dest.stat().st_size

    def pull_outputs(self, job_id: int, directory: Path) -> list[Path]:
        """Every output file of the job into `directory`, keeping their relative paths."""
        pulled = []
        for item in self.job_outputs(job_id):
            try:
                rel = check_code_path(item["path"])  # never outside `directory`
            except ValueError as exc:
                raise CorralError(f"job {job_id}: refusing output path: {exc}")
            dest = Path(directory) / rel
            self.download_output(job_id, item["path"], dest)
            pulled.append(dest)
        return pulled

    # --- on-call, escalation and pages (`corral oncall`; docs/operations.md) --------------------
    def on_call_now(self, schedule: str | None = None) -> list[dict[str, Any]]:
        """Who is on call now per schedule (or for `schedule`), until when, and who is next."""
        return self.request("GET", "/oncall/now", params={"schedule": schedule} if schedule else None)

    def schedules(self) -> list[dict[str, Any]]:
        return self.request("GET", "/oncall/schedules")

    def schedule(self, name: str, *, days: float = 7.0) -> dict[str, Any]:
        return self.request("GET", f"/oncall/schedules/{quote(name, safe='')}", params={"days": days})

    def put_schedule(self, name: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace a schedule: {time_zone, description, fallback_user, layers: [...]}.
        The answer's `warnings` name its gaps in the next 14 days."""
        return self.request("PUT", f"/oncall/schedules/{quote(name, safe='')}", json=dict(definition))

    def delete_schedule(self, name: str) -> None:
        self.request("DELETE", f"/oncall/schedules/{quote(name, safe='')}")

    def add_override(self, schedule: str, user: str, start: float, end: float) -> dict[str, Any]:
        body = {"user": user, "start": start, "end": end}
        return self.request("POST", f"/oncall/schedules/{quote(schedule, safe='')}/overrides", json=body)

    def remove_override(self, schedule: str, override_id: int) -> None:
        self.request("DELETE", f"/oncall/schedules/{quote(schedule, safe='')}/overrides/{override_id}")

    def schedule_ical(self, name: str) -> str:
        """The schedule's iCalendar feed (text)."""
        response = self._http.get(f"/oncall/schedules/{quote(name, safe='')}/ical")
        if not response.is_success:
            self.request("GET", f"/oncall/schedules/{quote(name, safe='')}")  # raises the named error
            raise ApiError(response.text, response.status_code, response.text)
        return response.text

    def policies(self) -> list[dict[str, Any]]:
        return self.request("GET", "/oncall/policies")

    def put_policy(self, name: str, definition: Mapping[str, Any]) -> dict[str, Any]:
        """Create or replace an escalation policy: {steps: [{schedule|user, wait_minutes}], repeat}."""
        return self.request("PUT", f"/oncall/policies/{quote(name, safe='')}", json=dict(definition))

    def delete_policy(self, name: str) -> None:
        self.request("DELETE", f"/oncall/policies/{quote(name, safe='')}")

    def pages(self, *, state: str | None = None, limit: int = 50) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"limit": limit} | ({"state": state} if state else {})
        return self.request("GET", "/oncall/pages", params=params)

    def page(self, policy: str, subject: str, body: str = "", *, key: str | None = None) -> dict[str, Any]:
        """Page through `policy` by hand (admins), e.g. to test the set-up."""
        data = {"policy": policy, "subject": subject, "body": body} | ({"key": key} if key else {})
        return self.request("POST", "/oncall/pages", json=data)

    def ack_page(self, page_id: int) -> dict[str, Any]:
        return self.request("POST", f"/oncall/pages/{page_id}/ack")

    def cancel_page(self, page_id: int) -> dict[str, Any]:
        return self.request("POST", f"/oncall/pages/{page_id}/cancel")

    def contacts(self, user: str) -> dict[str, Any]:
        return self.request("GET", f"/users/{quote(user, safe='')}/contacts")

    def set_email(self, user: str, email: str | None) -> dict[str, Any]:
        return self.request("PUT", f"/users/{quote(user, safe='')}/email", json={"email": email})

    def add_contact(self, user: str, kind: str, address: str) -> dict[str, Any]:
        """kind: email | webhook (generic JSON) | slack (Slack/Mattermost incoming webhook)."""
        return self.request(
            "POST", f"/users/{quote(user, safe='')}/contacts", json={"kind": kind, "address": address}
        )

    def remove_contact(self, user: str, contact_id: int) -> None:
        self.request("DELETE", f"/users/{quote(user, safe='')}/contacts/{contact_id}")

    # --- admin audit log (admins) ---------------------------------------------------------------

    def audit(
        self,
        *,
        actor: str | None = None,
        action: str | None = None,
        target: str | None = None,
        since: str | float | None = None,
        until: str | float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> dict[str, Any]:
        """One page of the audit log, newest first: {"items", "total", "limit", "offset"}.
        `action` is a dotted prefix ("group" matches "group.quota.set"); `target` is "KIND" or
        "KIND:ID"; `since`/`until` are ages ("7d", "12h"), unix seconds or ISO times."""
        filters = {"actor": actor, "action": action, "target": target, "since": since, "until": until}
        params: dict[str, Any] = {k: str(v) for k, v in filters.items() if v is not None}
        return self.request("GET", "/audit", params={**params, "limit": limit, "offset": offset})

    # --- secrets for jobs (`corral secret`; values are write-only: nothing returns one) -----------
    def secrets(self, *, group: str | None = None) -> list[dict[str, Any]]:
        """Your secrets and your groups' (or only `group`'s): names, scope and times."""
        return self.request("GET", "/secrets", params={"group": group} if group else None)

    def set_secret(self, name: str, value: str | bytes, *, group: str | None = None) -> dict[str, Any]:
        """Create or replace your secret `name` (or `group`'s, as its admin). Bytes that are not
        UTF-8 travel as base64."""
        body: dict[str, str]
        if isinstance(value, bytes):
            try:
                body = {"value": value.decode()}
            except UnicodeDecodeError:
                body = {"value_base64": base64.b64encode(value).decode()}
        else:
            body = {"value": value}
        params = {"group": group} if group else None
        return self.request("PUT", f"/secrets/{quote(name, safe='')}", json=body, params=params)

    def delete_secret(self, name: str, *, group: str | None = None) -> None:
        params = {"group": group} if group else None
        self.request("DELETE", f"/secrets/{quote(name, safe='')}", params=params)

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
        return self.request(
            "GET", f"/workspaces/{quote(name, safe='')}", params={"user": user} if user else None
        )

    def start_workspace(self, name: str, *, user: str | None = None) -> dict[str, Any]:
        params = {"user": user} if user else None
        return self.request("POST", f"/workspaces/{quote(name, safe='')}/start", params=params)

    def stop_workspace(self, name: str, *, user: str | None = None) -> dict[str, Any]:
        params = {"user": user} if user else None
        return self.request("POST", f"/workspaces/{quote(name, safe='')}/stop", params=params)

    def remove_workspace(self, name: str, *, user: str | None = None) -> None:
        params = {"user": user} if user else None
        self.request("DELETE", f"/workspaces/{quote(name, safe='')}", params=params)

    def workspace_policies(self) -> list[dict[str, Any]]:
        return self.request("GET", "/workspaces/policies")

    def set_workspace_policy(
        self, group: str, *, default_idle_timeout: str | None = None, max_idle_timeout: str | None = None
    ) -> dict[str, Any]:
        body = {"default_idle_timeout": default_idle_timeout, "max_idle_timeout": max_idle_timeout}
        return self.request("PUT", f"/workspaces/policies/{quote(group, safe='')}", json=body)

    # --- incidents and remediation rules (admins; corral.services.incidents / .remediation) ------
    def incidents(self, **filters: Any) -> dict[str, Any]:
        """Incidents, newest first: filters state, severity, node, open, limit, offset."""
        params = {k: v for k, v in filters.items() if v is not None}
        return self.request("GET", "/incidents", params=params)

    def incident(self, incident_id: int) -> dict[str, Any]:
        return self.request("GET", f"/incidents/{incident_id}")

    def incident_action(self, incident_id: int, action: str, **body: Any) -> dict[str, Any]:
        """ack | comment (text=) | mitigate (note=) | resolve (note=) | close."""
        return self.request("POST", f"/incidents/{incident_id}/{action}", json=body)

    def edit_incident(self, incident_id: int, **changes: Any) -> dict[str, Any]:
        return self.request("PATCH", f"/incidents/{incident_id}", json=changes)

    def write_postmortem(self, incident_id: int, **postmortem: Any) -> dict[str, Any]:
        """summary, impact, root_cause, action_items=[{what, owner, due: YYYY-MM-DD}]."""
        path = f"/incidents/{incident_id}/postmortem"
        return self.request("PUT", path, json=postmortem)

    def remediation_rules(self, version: int | None = None) -> dict[str, Any]:
        path = "/remediation/rules" if version is None else f"/remediation/rules/{version}"
        return self.request("GET", path)

    def apply_remediation_rules(self, text: str) -> dict[str, Any]:
        return self.request("PUT", "/remediation/rules", json={"text": text})

    def remediation_history(self) -> list[dict[str, Any]]:
        return self.request("GET", "/remediation/rules/history")["items"]

    def remediation_runs(self, limit: int = 100) -> list[dict[str, Any]]:
        return self.request("GET", "/remediation/runs", params={"limit": limit})["items"]

    # --- datasets and storage (corral.datasets; transfers in corral.datasets.transfer) ----------
    def datasets(self) -> list[dict[str, Any]]:
        return self.request("GET", "/datasets")

    def dataset(self, name: str) -> dict[str, Any]:
        """A dataset with its versions (sizes, files, digests)."""
        return self.request("GET", f"/datasets/{name}")

    def push_dataset(
        self,
        name: str,
        directory: str | Path,
        *,
        group: str | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, Any]:
        """Upload `directory` as the next version of `name` (resumes an interrupted push of the
        same content); `progress(bytes_done, bytes_total)` is called as chunks go. Returns the
        new version."""
        from corral.datasets.transfer import push

        return push(self, name, Path(directory), group=group, progress=progress)

    def pull_dataset(
        self,
        name: str,
        directory: str | Path,
        *,
        version: int | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> dict[str, Any]:
        """Download a version (latest by default) into `directory`, each file checked against its
        sha256; files already there and identical are kept. Returns {version, files, bytes}."""
        from corral.datasets.transfer import pull

        return pull(self, name, Path(directory), version=version, progress=progress)

    def delete_dataset(self, name: str, version: int | None = None) -> None:
        """Delete one version, or the dataset (refused while a job that has not ended uses it)."""
        path = f"/datasets/{name}" + (f"/versions/{version}" if version is not None else "")
        self.request("DELETE", path)

    def share_dataset(
        self,
        name: str,
        *,
        add_groups: list[str] | None = None,
        remove_groups: list[str] | None = None,
        public: bool | None = None,
    ) -> dict[str, Any]:
        body = {"add_groups": add_groups or [], "remove_groups": remove_groups or [], "public": public}
        return self.request("PUT", f"/datasets/{name}/share", json=body)

    def import_dataset(self, name: str, path: str, *, group: str | None = None) -> dict[str, Any]:
        """Admins: a new version copied from a server directory under CORRAL_DATASET_IMPORT_ROOTS."""
        return self.request("POST", "/datasets/import", json={"name": name, "path": path, "group": group})

    def uploads(self) -> list[dict[str, Any]]:
        """The caller's dataset uploads still open (interrupted pushes)."""
        return self.request("GET", "/datasets/uploads")

    def storage_usage(self) -> list[dict[str, Any]]:
        return self.request("GET", "/storage/usage")

    def set_storage_quota(
        self,
        scope: str,
        name: str,
        *,
        max_bytes: int | Keep | None = KEEP,
        max_files: int | Keep | None = KEEP,
    ) -> dict[str, Any]:
        """Admins: scope "user" or "group"; None = no limit, KEEP = leave as it is."""
        body = {
            k: v
            for k, v in {"max_bytes": max_bytes, "max_files": max_files}.items()
            if not isinstance(v, Keep)
        }
        return self.request("PUT", f"/storage/quota/{scope}/{name}", json=body)

    # --- sandbox entry and SSH keys (corral.exec_client; docs/workspaces.md) ---------------------

    def ssh_keys(self) -> list[dict[str, Any]]:
        return self.request("GET", "/ssh-keys")

    def add_ssh_key(self, public_key: str, name: str) -> dict[str, Any]:
        return self.request("POST", "/ssh-keys", json={"name": name, "public_key": public_key})

    def remove_ssh_key(self, key_id: int) -> None:
        self.request("DELETE", f"/ssh-keys/{key_id}")

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

    # --- environments catalogue (corral.environments; docs/catalogues.md) -----------------------
    def environments(self) -> list[dict[str, Any]]:
        return self.request("GET", "/environments")

    def environment(self, name: str) -> dict[str, Any]:
        """An environment with its versions (state, lock, cache key, build job)."""
        return self.request("GET", f"/environments/{quote(name, safe='')}")

    def environment_version(self, name: str, version: int) -> dict[str, Any]:
        return self.request("GET", f"/environments/{quote(name, safe='')}/versions/{int(version)}")

    def create_environment(
        self,
        name: str,
        source: str,
        *,
        source_kind: str = "requirements",
        visibility: str = "private",
        group: str | None = None,
        official: bool = False,
        description: str = "",
    ) -> dict[str, Any]:
        """Queue the build of a new version from a requirements.txt (or pyproject.toml) text."""
        body = {
            "name": name,
            "source": source,
            "source_kind": source_kind,
            "visibility": visibility,
            "group": group,
            "official": official,
            "description": description,
        }
        return self.request("POST", "/environments", json=body)

    def wait_environment(
        self, name: str, version: int, *, timeout_s: float | None = None, poll_s: float = 0.5
    ) -> dict[str, Any]:
        """Poll until the version's build has ended (ready or failed); returns the version."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            found = self.environment_version(name, version)
            if found["state"] != "building":
                return found
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"environment {name}@{version} is still building after {timeout_s} s")
            time.sleep(poll_s)

    def delete_environment(self, name: str, version: int | None = None) -> None:
        """Delete one version, or the environment (refused while an active job uses it)."""
        params = {"version": version} if version is not None else None
        self.request("DELETE", f"/environments/{quote(name, safe='')}", params=params)

    # --- catalogues: job templates and the model registry (corral.catalog) -----------------------
    def templates(self) -> list[dict[str, Any]]:
        return self.request("GET", "/templates")

    def template(self, name: str, version: int | None = None) -> dict[str, Any]:
        """A template with its parameters and (the latest or the given version's) spec."""
        params = {"version": version} if version is not None else None
        return self.request("GET", f"/templates/{quote(name)}", params=params)

    def publish_template(
        self,
        name: str,
        spec: str | Mapping[str, Any] | Path | None = None,
        *,
        from_job: int | None = None,
        description: str | None = None,
        group: str | None = None,
        visibility: str | None = None,
    ) -> dict[str, Any]:
        """A new template (or version) from a spec with `parameters:` (text, mapping or a file),
        or from a job's spec (`from_job`: "save as template")."""
        body = spec.read_text() if isinstance(spec, Path) else spec
        payload = {"name": name, "spec": body, "from_job": from_job, "description": description}
        payload |= {"group": group, "visibility": visibility}
        return self.request("POST", "/templates", json={k: v for k, v in payload.items() if v is not None})

    def use_template(
        self,
        name: str,
        values: Mapping[str, Any] | None = None,
        *,
        version: int | None = None,
        models: list[str] | None = None,
    ) -> dict[str, Any]:
        """Submit a job from a template; `models` ("name", "name@3", "name@production") are mounted
        read-only at /models/<name> (fine-tune from). Returns the job."""
        body = {"values": dict(values or {}), "version": version, "models": models or []}
        return self.request("POST", f"/templates/{quote(name)}/use", json=body)

    def share_template(self, name: str, visibility: str, group: str | None = None) -> dict[str, Any]:
        body = {"visibility": visibility, "group": group}
        return self.request("POST", f"/templates/{quote(name)}/share", json=body)

    def delete_template(self, name: str) -> None:
        self.request("DELETE", f"/templates/{quote(name)}")

    def models(self) -> list[dict[str, Any]]:
        return self.request("GET", "/models")

    def model(self, name: str) -> dict[str, Any]:
        """A model with its versions (stage, metrics, size)."""
        return self.request("GET", f"/models/{quote(name)}")

    def model_version(self, name: str, version: int) -> dict[str, Any]:
        """One version with its card and lineage."""
        return self.request("GET", f"/models/{quote(name)}/versions/{version}")

    def register_model(
        self,
        name: str,
        job_id: int,
        *,
        path: str = "",
        framework: str = "",
        metrics: Mapping[str, Any] | None = None,
        card: str = "",
        code_checksum: str | None = None,
        group: str | None = None,
        description: str | None = None,
    ) -> dict[str, Any]:
        """A new version of `name` from a succeeded job's outputs (`path` under /outputs)."""
        body = {
            "job_id": job_id,
            "path": path,
            "framework": framework,
            "metrics": dict(metrics or {}),
            "card": card,
            "code_checksum": code_checksum,
            "group": group,
            "description": description,
        }
        body = {k: v for k, v in body.items() if v is not None}
        return self.request("POST", f"/models/{quote(name)}/versions", json=body)

    def promote_model(self, name: str, version: int, stage: str) -> dict[str, Any]:
        return self.request("POST", f"/models/{quote(name)}/versions/{version}/stage", json={"stage": stage})

    def compare_models(self, name: str, a: int, b: int) -> dict[str, Any]:
        return self.request("GET", f"/models/{quote(name)}/compare", params={"a": a, "b": b})

    def share_model(self, name: str, visibility: str, group: str | None = None) -> dict[str, Any]:
        return self.request(
            "POST", f"/models/{quote(name)}/share", json={"visibility": visibility, "group": group}
        )

    def delete_model(self, name: str, version: int | None = None) -> None:
        """Delete one version, or the model (refused while a job not yet ended mounts it)."""
        self.request(
            "DELETE", f"/models/{quote(name)}" + (f"/versions/{version}" if version is not None else "")
        )

    def pull_model(self, name: str, version: int, directory: Path) -> list[Path]:
        """Download a version's files into `directory`."""
        items = self.request("GET", f"/models/{quote(name)}/versions/{version}/files")["items"]
        pulled = []
        for item in items:
            dest = directory / check_code_path(item["path"])
            dest.parent.mkdir(parents=True, exist_ok=True)
            query = f"/models/{quote(name)}/versions/{version}/file?path={quote(item['path'])}"
            with self.download(query) as response, dest.open("wb") as fh:
                for block in response.iter_bytes():
                    fh.write(block)
            pulled.append(dest)
        return pulled

    def download(self, path: str) -> AbstractContextManager[httpx.Response]:
        """GET a raw (non-JSON) body as a streamed response (a context manager); errors raise
        like `request`."""
        return self._stream(path)

    @contextmanager
    def _stream(self, path: str) -> Iterator[httpx.Response]:
        try:
            with self._http.stream("GET", path) as response:
                if not response.is_success:
                    response.read()
                    try:
                        detail = response.json().get("detail")
                    except ValueError:
                        detail = response.text
                    raise ApiError(describe_detail(detail), response.status_code, detail)
                yield response
        except httpx.TransportError as exc:
            raise ServerUnreachable(f"cannot talk to the Corral server at {self.url}: {exc}")


@dataclass(frozen=True)
class CodeUpload:
    id: str  # the snapshot id: the spec's `code`
    files: int
    total_bytes: int
    uploaded_bytes: int  # 0 when the server had every file already
