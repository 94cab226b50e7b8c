"""Catalogues: environments, job templates and the model registry (docs/catalogues.md)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from corral.sdk.base import BaseClient, seg
from corral.sdk.errors import CorralError
from corral.storage.code import check_path as check_code_path


class CataloguesApi(BaseClient):
    """Environments, templates and models."""

    # --- environments catalogue (corral.environments; docs/catalogues.md) -----------------------
    def environments(self) -> list[dict[str, Any]]:
        return self.request("GET", "/environments")

    def environment(self, name: str) -> dict[str, Any]:
        """An environment with its versions (state, lock, cache key, build job)."""
        return self.request("GET", f"/environments/{seg(name)}")

    def environment_version(self, name: str, version: int) -> dict[str, Any]:
        return self.request("GET", f"/environments/{seg(name)}/versions/{int(version)}")

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
        self.request("DELETE", f"/environments/{seg(name)}", params=params)

    # --- catalogues: job templates and the model registry (corral.catalog) -----------------------
    def templates(self) -> list[dict[str, Any]]:
        return self.request("GET", "/templates")

    def template(self, name: str, version: int | None = None) -> dict[str, Any]:
        """A template with its parameters and (the latest or the given version's) spec."""
        params = {"version": version} if version is not None else None
        return self.request("GET", f"/templates/{seg(name)}", params=params)

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
        return self.request("POST", f"/templates/{seg(name)}/use", json=body)

    def share_template(self, name: str, visibility: str, group: str | None = None) -> dict[str, Any]:
        body = {"visibility": visibility, "group": group}
        return self.request("POST", f"/templates/{seg(name)}/share", json=body)

    def delete_template(self, name: str) -> None:
        self.request("DELETE", f"/templates/{seg(name)}")

    def models(self) -> list[dict[str, Any]]:
        return self.request("GET", "/models")

    def model(self, name: str) -> dict[str, Any]:
        """A model with its versions (stage, metrics, size)."""
        return self.request("GET", f"/models/{seg(name)}")

    def model_version(self, name: str, version: int | str) -> dict[str, Any]:
        """One version with its card and lineage: a number, or a stage ("production": the newest
        version in it)."""
        return self.request("GET", f"/models/{seg(name)}/versions/{seg(version)}")

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
        return self.request("POST", f"/models/{seg(name)}/versions", json=body)

    def promote_model(self, name: str, version: int, stage: str) -> dict[str, Any]:
        path = f"/models/{seg(name)}/versions/{seg(version)}/stage"
        return self.request("POST", path, json={"stage": stage})

    def compare_models(self, name: str, a: int, b: int) -> dict[str, Any]:
        return self.request("GET", f"/models/{seg(name)}/compare", params={"a": a, "b": b})

    def share_model(self, name: str, visibility: str, group: str | None = None) -> dict[str, Any]:
        return self.request(
            "POST", f"/models/{seg(name)}/share", json={"visibility": visibility, "group": group}
        )

    def delete_model(self, name: str, version: int | None = None) -> None:
        """Delete one version, or the model (refused while a job not yet ended mounts it)."""
        self.request(
            "DELETE", f"/models/{seg(name)}" + (f"/versions/{seg(version)}" if version is not None else "")
        )

    def pull_model(self, name: str, version: int | str, directory: Path) -> list[Path]:
        """Download a version's files into `directory`; `version` a number, or a stage (resolved
        to its number first, so every file comes from that one version)."""
        if not isinstance(version, int):
            version = int(self.model_version(name, version)["version"])
        items = self.request("GET", f"/models/{seg(name)}/versions/{seg(version)}/files")["items"]
        where = f"/models/{seg(name)}/versions/{seg(version)}/file"
        pulled = []
        for item in items:
            try:
                dest = Path(directory) / check_code_path(item["path"])  # never outside `directory`
            except ValueError as exc:
                raise CorralError(f"model {name}@{version}: refusing file path: {exc}") from None
            self.download_to(
                where, {"path": item["path"]}, dest, expected_size=item.get("size"), label=item["path"]
            )
            pulled.append(dest)
        return pulled
