"""A model version's files on the storage root: `<root>/model/<model id>/v<N>/`, a read-only copy
(files 0444, dirs 0555) of a directory or file under a finished job's outputs. The version owns
its copy, so deleting the job (or its retention) never touches the model.

Copying is staged: the files go to `model/.staging/<random>/` first, are checksummed on the way,
and are renamed into place only when the registration commits (a crash before leaves a staging
dir, removed on the next registration; one between the rename and the commit leaves a dir no row
names, replaced when that version number is next used). Nothing is followed through a symlink:
a job's uid owns its outputs and may have planted links to the server's files."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from corral.datasets.store import make_read_only, remove_tree
from corral.storage.code import PATH_PART, CodeError, check_path
from corral.storage.layout import outputs_dir

STAGING = ".staging"
METRICS_FILE = "metrics.json"
MAX_METRICS_DEPTH = 32  # nested mappings in metrics.json flattened this deep at most
MAX_METRICS = 256
BLOCK = 1 << 20
# What `normalise_path` accepts, for the API schema (the service says why it refuses the rest):
# parts as a job names its files (`my model`, `.best`), not as a user or group name.
PATH_PATTERN = rf"^(/outputs/?|(/outputs/)?{PATH_PART}(/{PATH_PART})*/?)?$"


class OutsideOutputs(ValueError):
    """A path that does not name a place under the job's outputs (the request is wrong: 422)."""


class MissingOutputs(ValueError):
    """The path is well formed but the job's outputs hold nothing there (404)."""


class UnusableOutputs(ValueError):
    """What the outputs hold there cannot be a model: a symlink, no files (the job's state: 409)."""


@dataclass
class Copied:
    path: Path  # the staging dir
    files: int = 0
    bytes: int = 0
    digest: str = ""
    manifest: list[tuple[str, int, str]] = field(default_factory=list)


def version_dir(root: Path, model_id: int, version: int) -> Path:
    return root / "model" / str(int(model_id)) / f"v{int(version)}"


def normalise_path(path: str) -> str:
    """The path under /outputs: "" (all of it), "ckpt/best" or "/outputs/ckpt/best"."""
    text = path
    if text in ("", "/outputs", "/outputs/"):
        return ""
    if text.startswith("/outputs/"):
        text = text[len("/outputs/") :]
    elif text.startswith("/"):
        raise OutsideOutputs(f"path {path!r} is outside the job's outputs (/outputs)")
    text = text.removesuffix("/")
    try:
        return check_path(text, "path")
    except CodeError as exc:
        raise OutsideOutputs(
            f"path {path!r} is outside the job's outputs or not a plain path: {exc}"
        ) from None


def _open_under(top: Path, rel: str) -> int:
    """An fd of `top/rel`, every component opened without following a symlink."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(top, flags | os.O_DIRECTORY)
    try:
        for part in [p for p in rel.split("/") if p]:
            nxt = os.open(part, flags | os.O_NONBLOCK, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except OSError:
        os.close(fd)
        raise
    return fd


def _copy_fd(src_fd: int, dest: Path) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    with os.fdopen(os.dup(src_fd), "rb") as src, open(dest, "xb") as out:
        while block := src.read(BLOCK):
            h.update(block)
            out.write(block)
            size += len(block)
    return size, h.hexdigest()


def _check_name(path: str) -> None:
    """A name the manifest ("path<TAB>size<TAB>sha256" lines), JSON and URLs can carry: UTF-8,
    no control characters (a job names its files as it likes)."""
    shown = path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise UnusableOutputs(
            f"{shown!r} is not a UTF-8 file name; a model's names must be (rename it)"
        ) from None
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise UnusableOutputs(
            f"{shown!r} holds a control character; a model's file names may not (rename it)"
        )


def _copy_tree(dir_fd: int, dest: Path, rel: str, copied: Copied) -> None:
    for name in sorted(os.listdir(dir_fd)):
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        path = f"{rel}/{name}" if rel else name
        _check_name(path)
        if stat.S_ISLNK(st.st_mode):
            raise UnusableOutputs(f"{path} is a symlink; a model holds plain files and directories")
        if stat.S_ISDIR(st.st_mode):
            (dest / name).mkdir(mode=0o700)
            sub = os.open(name, flags | os.O_DIRECTORY, dir_fd=dir_fd)
            try:
                _copy_tree(sub, dest / name, path, copied)
            finally:
                os.close(sub)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(name, flags, dir_fd=dir_fd)
            try:
                size, sha = _copy_fd(fd, dest / name)
            finally:
                os.close(fd)
            copied.manifest.append((path, size, sha))
        # sockets, fifos, devices: not files of a model; skipped


def stage_copy(root: Path, job_id: int, sub: str) -> Copied:
    """Copy `sub` (normalised) of job `job_id`'s outputs into a new staging dir, read-only."""
    top = outputs_dir(root, job_id)
    staging_root = root / "model" / STAGING
    staging_root.mkdir(mode=0o700, parents=True, exist_ok=True)
    copied = Copied(staging_root / secrets.token_hex(8))
    copied.path.mkdir(mode=0o700)
    try:
        try:
            fd = _open_under(top, sub)
        except OSError:
            where = f"/outputs/{sub}" if sub else "/outputs"
            raise MissingOutputs(f"job {job_id} has no {where} (or it goes through a symlink)") from None
        try:
            if stat.S_ISDIR(os.fstat(fd).st_mode):
                _copy_tree(fd, copied.path, "", copied)
            elif stat.S_ISREG(os.fstat(fd).st_mode):
                name = sub.rsplit("/", 1)[-1]
                size, sha = _copy_fd(fd, copied.path / name)
                copied.manifest.append((name, size, sha))
            else:
                raise UnusableOutputs(f"/outputs/{sub} is not a file or directory")
        finally:
            os.close(fd)
        if not copied.manifest:
            raise UnusableOutputs(f"/outputs/{sub or ''} of job {job_id} holds no files".replace("//", "/"))
        copied.manifest.sort()
        text = "".join(f"{p}\t{s}\t{h}\n" for p, s, h in copied.manifest)
        copied.digest = hashlib.sha256(text.encode()).hexdigest()
        copied.files = len(copied.manifest)
        copied.bytes = sum(s for _, s, _ in copied.manifest)
        make_read_only(copied.path)
    except BaseException:
        remove_tree(copied.path)
        raise
    return copied


def read_metrics(path: Path) -> dict[str, Any]:
    """Numbers and short texts from a `metrics.json` at the top of a copied version ({} if none
    or unreadable: metrics are optional). Nested mappings are flattened with '.', down to
    MAX_METRICS_DEPTH levels. The job wrote the file: one nested too deeply for the parser is
    unreadable too (its RecursionError was answered as "the request body is nested too deeply")."""
    try:
        data = json.loads((path / METRICS_FILE).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any, depth: int = 0) -> None:
        if isinstance(node, dict):
            if depth >= MAX_METRICS_DEPTH:
                return
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value, depth + 1)
        elif len(out) < MAX_METRICS and (
            isinstance(node, bool | int | float) or (isinstance(node, str) and len(node) <= 256)
        ):
            out[prefix] = node

    if isinstance(data, dict):
        walk("", data)
    return out


def publish(staged: Path, final: Path) -> None:
    """Rename a staged copy into place; an orphan left at `final` by a crash is replaced."""
    final.parent.mkdir(mode=0o755, exist_ok=True)
    os.chmod(final.parent, 0o755)
    if final.exists():
        remove_tree(final)
    os.rename(staged, final)


def discard(path: Path) -> None:
    if path.exists():
        remove_tree(path)


def list_files(top: Path) -> list[dict[str, Any]]:
    found = []
    for dirpath, _dirs, names in os.walk(top):
        for name in names:
            full = Path(dirpath, name)
            found.append({"path": full.relative_to(top).as_posix(), "size": full.stat().st_size})
    return sorted(found, key=lambda f: str(f["path"]))


def file_of(top: Path, rel: str) -> Path:
    """A file of a version (which holds no links: it was copied without them). `rel` is checked
    as the registration checked the job's names (`_check_name`), not as a user or group name:
    `.hidden`, `my weights (1).bin`, a long or non-ASCII name were copied into the version and
    must come out of it again."""
    if "\x00" in rel or rel.startswith("/"):
        raise OutsideOutputs(f"path {rel!r} must be relative to the version, e.g. weights/model.pt")
    if any(part in ("", ".", "..") for part in rel.split("/")):
        raise OutsideOutputs(f"path {rel!r} holds an empty, '.' or '..' part")
    if any(ord(c) < 32 or ord(c) == 127 for c in rel):
        raise OutsideOutputs(f"path {rel!r} holds a control character; no file of a version does")
    path = top / rel
    if not path.is_file():
        raise FileNotFoundError(rel)
    return path
