"""Storage: `--code` snapshots, job outputs, datasets and storage quotas."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.datasets.names import BadName, check_name
from corral.sdk.base import KEEP, BaseClient, Keep, seg
from corral.sdk.errors import ApiError, CorralError
from corral.storage.code import CHUNK_MAX as CODE_CHUNK
from corral.storage.code import check_path as check_code_path
from corral.storage.code import sha256_file
from corral.storage.ignore import CodeDirError
from corral.storage.ignore import scan as scan_code


@dataclass(frozen=True)
class CodeUpload:
    id: str  # the snapshot id: the spec's `code`
    files: int
    total_bytes: int
    uploaded_bytes: int  # 0 when the server had every file already


class StorageApi(BaseClient):
    """Files in and out: code snapshots, outputs, datasets (transfers in corral.datasets.transfer)."""

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
        items: list[dict[str, Any]] = self.request("GET", f"/jobs/{seg(job_id)}/outputs")["items"]
        return items

    def download_output(self, job_id: int, path: str, dest: Path) -> int:
        """One output file to `dest` (written to a temp name, renamed when complete)."""
        return self.download_to(f"/jobs/{seg(job_id)}/outputs/file", {"path": path}, dest)

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

    # --- datasets and storage (corral.datasets; transfers in corral.datasets.transfer) ----------
    def datasets(self) -> list[dict[str, Any]]:
        return self.request("GET", "/datasets")

    def dataset(self, name: str) -> dict[str, Any]:
        """A dataset with its versions (sizes, files, digests)."""
        return self.request("GET", f"/datasets/{dataset_name(name)}")

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

        return push(self, dataset_name(name), Path(directory), group=group, progress=progress)

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

        return pull(self, dataset_name(name), Path(directory), version=version, progress=progress)

    def delete_dataset(self, name: str, version: int | None = None) -> None:
        """Delete one version, or the dataset (refused while a job that has not ended uses it)."""
        version_path = f"/versions/{seg(version)}" if version is not None else ""
        path = f"/datasets/{dataset_name(name)}{version_path}"
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
        return self.request("PUT", f"/datasets/{dataset_name(name)}/share", json=body)

    def import_dataset(self, name: str, path: str, *, group: str | None = None) -> dict[str, Any]:
        """Admins: a new version copied from a server directory under CORRAL_DATASET_IMPORT_ROOTS."""
        body = {"name": dataset_name(name), "path": path, "group": group}
        return self.request("POST", "/datasets/import", json=body)

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
        return self.request("PUT", f"/storage/quota/{seg(scope)}/{seg(name)}", json=body)


def dataset_name(name: str) -> str:
    """`name` checked before it goes into a URL path: the HTTP client resolves '..' there, so
    delete_dataset("../users/bob") sent DELETE /users/bob, and `corral data show ../users/bob`
    printed a traceback from another route's answer."""
    try:
        return check_name(name)
    except BadName as exc:
        raise CorralError(str(exc)) from None
