"""The datasets' part of the storage root, on disk:

    <storage root>/data/<dataset id>/v<N>/...        a complete version: files 0444, dirs 0555
    <storage root>/data/<dataset id>/v<N>.manifest   its manifest: "path<TAB>size<TAB>sha256" lines
    <storage root>/data/.uploads/<upload id>/...     an upload being received (staging)
    <storage root>/data/.trash/<random>              a version or dataset being deleted

Staging lives on the same filesystem as the versions, so completing an upload is one rename:
a version directory either is not there or holds every file. Only this module touches these paths.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from corral.datasets.names import BadName, check_path, manifest_line

HASH_BLOCK = 1024 * 1024
# A chunk (8 MiB by default) is written in pieces of this size: one 8 MiB write(2) into the page
# cache cost 4-6x the CPU of eight 1 MiB ones on the development machine (measured with 512 MiB:
# 0.5-0.9 s vs 0.15 s), and dominated the server's side of a push.
WRITE_PIECE = 1024 * 1024


class UploadGone(Exception):
    """The upload's staging directory is gone: aborted, completed or removed after its timeout."""


class Store:
    def __init__(self, storage_root: Path) -> None:
        self.data = storage_root / "data"
        self.uploads = self.data / ".uploads"
        self.trash = self.data / ".trash"

    def ensure(self) -> None:
        for path in (self.data, self.uploads, self.trash):
            path.mkdir(parents=True, exist_ok=True)
        # The staging and trash areas are the server's own: no job or user reads them.
        os.chmod(self.uploads, 0o700)
        os.chmod(self.trash, 0o700)

    # -- paths -----------------------------------------------------------------------------------

    def dataset_dir(self, dataset_id: int) -> Path:
        return self.data / str(dataset_id)

    def version_dir(self, dataset_id: int, version: int) -> Path:
        return self.dataset_dir(dataset_id) / f"v{version}"

    def manifest_file(self, dataset_id: int, version: int) -> Path:
        return self.dataset_dir(dataset_id) / f"v{version}.manifest"

    def staging_dir(self, upload_id: str) -> Path:
        return self.uploads / upload_id

    def file_in(self, top: Path, rel: str) -> Path:
        """`rel` (checked by names.check_path: no '..', not absolute) below `top`."""
        return top.joinpath(*check_path(rel).split("/"))

    # -- uploads ---------------------------------------------------------------------------------

    def write_chunk(self, upload_id: str, rel: str, offset: int, data: bytes) -> None:
        """Write `data` at `offset` of the staged file (see `write_at`)."""
        with self.staged_file(upload_id, rel) as fd:
            write_at(fd, offset, data)

    @contextmanager
    def staged_file(self, upload_id: str, rel: str) -> Iterator[int]:
        """The staged file `rel` of an upload, open for reading and writing and locked (flock, exclusive)
        until the block ends: two requests writing one file take turns, so the second can read
        what the first recorded before it writes. Parents are created here and nowhere else, and
        the staging tree never holds a link, so nothing written can land outside it. The staging
        directory itself is never made again here: when it is gone (the upload was aborted,
        completed or removed), UploadGone."""
        top = self.staging_dir(upload_id)
        target = self.file_in(top, rel)
        parent = top
        try:
            for part in target.relative_to(top).parent.parts:
                parent = parent / part
                parent.mkdir(exist_ok=True, mode=0o700)  # one level at a time: not `top` again
            if target.is_dir():
                raise BadName(f"file path {rel!r} is also a directory of the upload")
            fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        except (FileExistsError, NotADirectoryError):
            raise BadName(f"file path {rel!r}: one of its parent directories is also a file of the upload")
        except FileNotFoundError:
            raise UploadGone(f"the staging directory of upload {upload_id} is gone")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield fd
        finally:
            os.close(fd)  # and the lock with it

    def publish(
        self, source: Path, dataset_id: int, version: int, manifest: Iterable[tuple[str, int, str]]
    ) -> Path:
        """Make `source` (a staging tree) version `version`: manifest written, tree made
        read-only, then one rename. A directory left at the target by a crash between this rename
        and the database commit (it has no version row) is removed first."""
        target = self.version_dir(dataset_id, version)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(target.parent, 0o755)
        if target.exists():
            self.remove(target)
        manifest_path = self.manifest_file(dataset_id, version)
        tmp = manifest_path.with_suffix(".manifest.tmp")
        with tmp.open("w") as fh:
            for path, size, sha in sorted(manifest):
                fh.write(manifest_line(path, size, sha))
        os.chmod(tmp, 0o444)
        make_read_only(source)
        os.replace(tmp, manifest_path)
        source.rename(target)
        return target

    def unpublish(self, dataset_id: int, version: int) -> None:
        """Undo `publish` (the database refused the version row)."""
        self.remove(self.version_dir(dataset_id, version))
        self.manifest_file(dataset_id, version).unlink(missing_ok=True)

    # -- deletion --------------------------------------------------------------------------------

    def remove(self, path: Path) -> None:
        """Gone from its place at once (a rename into the trash), then deleted."""
        if not path.exists() and not path.is_symlink():
            return
        self.trash.mkdir(parents=True, exist_ok=True)
        doomed = self.trash / secrets.token_hex(8)
        path.rename(doomed)
        remove_tree(doomed)

    def empty_trash(self) -> None:
        if self.trash.exists():
            for entry in self.trash.iterdir():
                remove_tree(entry)


def write_at(fd: int, offset: int, data: bytes) -> None:
    """Write `data` at `offset` and cut anything after it (bytes a crash left past what the
    database recorded)."""
    view, done = memoryview(data), 0
    while done < len(data):  # pwrite may write less than asked
        done += os.pwrite(fd, view[done : done + WRITE_PIECE], offset + done)
    os.ftruncate(fd, offset + len(data))


def fd_sha256(fd: int) -> str:
    """sha256 of the open file `fd` (the staged file as locked, wherever its name is now)."""
    h, offset = hashlib.sha256(), 0
    while block := os.pread(fd, HASH_BLOCK, offset):
        h.update(block)
        offset += len(block)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def make_read_only(top: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(top):
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o444)
        os.chmod(dirpath, 0o555)


def remove_tree(path: Path) -> None:
    """rmtree that first gives back the write bit read-only versions took away."""
    if path.is_symlink() or path.is_file():
        path.unlink()
        return
    for dirpath, _dirnames, _filenames in os.walk(path):
        os.chmod(dirpath, 0o700)
    shutil.rmtree(path)


def walk_files(top: Path) -> Iterator[tuple[str, Path]]:
    """(relative '/'-path, absolute path) of every file below `top`, without following links.
    A link is refused when it points outside `top` (or anywhere, for directories); a link to a
    file inside `top` is copied as that file."""
    root = top.resolve()
    for dirpath, dirnames, filenames in os.walk(top):
        for name in list(dirnames):
            full = Path(dirpath, name)
            if full.is_symlink():
                raise BadName(f"{full}: a link to a directory; datasets hold plain files and directories")
        for name in filenames:
            full = Path(dirpath, name)
            rel = full.relative_to(top).as_posix()
            mode = os.lstat(full).st_mode
            if stat.S_ISLNK(mode):
                real = full.resolve()
                if not real.is_relative_to(root) or not real.is_file():
                    raise BadName(f"{full}: a link pointing outside the dataset ({real})")
            elif not stat.S_ISREG(mode):
                raise BadName(f"{full}: not a regular file")
            yield check_path(rel), full


def tree_usage(top: Path) -> tuple[int, int]:
    """(bytes, files) below `top`, by os.scandir without following links: the background scan."""
    total, files = 0, 0
    stack = [str(top)]
    while stack:
        current = stack.pop()
        try:
            entries = list(os.scandir(current))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    info = entry.stat(follow_symlinks=False)
                    total += info.st_size  # apparent size, as uploads are counted
                    files += 1
            except OSError:
                continue
    return total, files
