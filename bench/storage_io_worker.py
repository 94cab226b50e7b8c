"""The I/O loop of bench/storage_io.py: ONE program that runs the same way on both sides, once on
the host path and once inside a Corral job (sandboxed by the local engine) against the bind mount
of the same directory. Standard library only (the job runs it from its `--code` snapshot).

    python storage_io_worker.py io   DIR TAG SMALL_FILES LARGE_MIB [--drop-to UID:GID,GID...]
    python storage_io_worker.py list DIR [--drop-to ...]
    python storage_io_worker.py peek DIR      (the first entry only: a job that just mounts DIR)

Only the I/O loops are timed (perf_counter around each), never the interpreter's start. The page
cache is in a known state before each timed loop, the same on both sides:

- writes: into a fresh directory, each write made durable INSIDE the timed region (fsync per
  10 KB file; one fsync after the last 1 MiB block of the large file), so neither side is flattered
  or penalised by dirty pages that the kernel's writeback flushes at a time of its choosing;
- cold reads: every file dropped from the page cache first (clean after its fsync, then
  POSIX_FADV_DONTNEED) and the drop checked with mincore(2): the page count still resident is
  part of the result and must be 0;
- warm reads: the same files read again right after the cold read (all pages resident): the
  figure that isolates the path through the mount (open, lookup, copy) from the disk.

Each loop is timed twice: wall clock (the figure a user sees) and the process's CPU time (user +
system: the kernel's path walk, page-cache lookups and copies done for this process). A bind
mount can only cost CPU in that path, and CPU time is not inflated by waiting for the disk or for
a core on a shared machine the way wall time is.

`--drop-to` makes the host side run as the job's own uid, private gid and supplementary groups
(the job gets these from the engine's setpriv): the same identity, the same umask (007), on both
sides. Prints one JSON line.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys
import time
from collections.abc import Callable

SMALL_BYTES = 10 * 1024
BLOCK = 1024 * 1024
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
MAP_FAILED = ctypes.c_void_p(-1).value


def resident_pages(path: str) -> int:
    """Pages of `path` in the page cache (mincore on a mapping that never touches them)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return 0
        addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, MAP_FAILED):
            raise OSError(ctypes.get_errno(), f"mmap {path}")
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(addr, size, vec) != 0:
                raise OSError(ctypes.get_errno(), f"mincore {path}")
            return sum(v & 1 for v in vec)
        finally:
            _libc.munmap(addr, size)
    finally:
        os.close(fd)


def drop_cached(paths: list[str]) -> int:
    """Drop the (clean) pages of `paths`; returns the pages still resident after up to 3 tries."""
    left = 0
    for _ in range(3):
        for path in paths:
            fd = os.open(path, os.O_RDONLY)
            os.fdatasync(fd)  # already clean after the timed fsync: a no-op that makes sure
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        left = sum(resident_pages(p) for p in paths)
        if left == 0:
            return 0
    return left


class Timer:
    """Wall and CPU seconds of the block it wraps."""

    def __enter__(self) -> Timer:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def cold_then_warm(read_all: Callable[[], None]) -> list[Timer]:
    """The same reads twice: from the disk (the caller dropped the cache), then from the cache."""
    reads = []
    for _ in ("cold", "warm"):
        with Timer() as read:
            read_all()
        reads.append(read)
    return reads


def figures(
    kind: str, amount: float, units: tuple[str, str], write: Timer, reads: list[Timer], left: int
) -> dict[str, float]:
    """`<kind>_<op>_<rate unit>` (amount per second) and `<kind>_<op>_<cpu unit>` (CPU seconds per
    amount, x 1e6: us per file, ms per GB) for write, cold and warm read."""
    rate, cpu = units
    out: dict[str, float] = {}
    for op, timer in (("write", write), ("read_cold", reads[0]), ("read_warm", reads[1])):
        out[f"{kind}_{op}_{rate}"] = amount / timer.wall
        out[f"{kind}_{op}_{cpu}"] = timer.cpu / amount * 1e6
    out[f"{kind}_resident_pages_before_cold_read"] = left
    return out


def small_files(work: str, count: int) -> dict[str, float]:
    payload = os.urandom(SMALL_BYTES)
    names = [os.path.join(work, f"s{i:06d}") for i in range(count)]
    with Timer() as write:
        for name in names:
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o660)
            os.write(fd, payload)
            os.fsync(fd)
            os.close(fd)
    left = drop_cached(names)

    def read_all() -> None:
        for name in names:
            fd = os.open(name, os.O_RDONLY)
            while os.read(fd, 65536):
                pass
            os.close(fd)

    reads = cold_then_warm(read_all)
    for name in names:
        os.unlink(name)
    return figures("small", count, ("iops", "cpu_us"), write, reads, left)


def large_file(work: str, mib: int) -> dict[str, float]:
    path = os.path.join(work, "large")
    block = os.urandom(BLOCK)
    with Timer() as write:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o660)
        for _ in range(mib):
            os.write(fd, block)
        os.fsync(fd)
        os.close(fd)
    left = drop_cached([path])
    buf = bytearray(BLOCK)

    def read_all() -> None:
        fd = os.open(path, os.O_RDONLY)
        while os.readv(fd, [buf]):
            pass
        os.close(fd)

    reads = cold_then_warm(read_all)
    os.unlink(path)
    return figures("large", mib * BLOCK / 1e6, ("mbs", "cpu_ms_per_gb"), write, reads, left)


def list_dir(top: str) -> dict[str, float]:
    """Entries of `top` counted by scandir: once untimed (dentries and directory blocks cached on
    both sides alike), then timed."""
    sum(1 for _ in os.scandir(top))
    with Timer() as listing:
        entries = sum(1 for _ in os.scandir(top))
    return {"list_entries": entries, "list_s": listing.wall, "list_cpu_s": listing.cpu}


def mount_of(path: str) -> str:
    """The mount point `path` is under and the root of that mount (a bind's source), as the
    kernel says: shows that the job side went through a bind mount and the host side did not."""
    best = ("", "")
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            root, point = fields[3], fields[4]
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) >= len(best[1]):
                best = (root, point)
    return f"{best[1]} (root {best[0]})"


def drop_to(spec: str) -> None:
    uid_text, _, gids_text = spec.partition(":")
    gids = [int(g) for g in gids_text.split(",") if g]
    os.setgroups(gids[1:])
    os.setgid(gids[0])
    os.setuid(int(uid_text))


def main(argv: list[str]) -> None:
    if "--drop-to" in argv:
        i = argv.index("--drop-to")
        drop_to(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    os.umask(0o007)  # a job's umask (engine): the same file modes on both sides
    mode, top = argv[0], argv[1]
    out: dict[str, object] = {
        "uid": os.getuid(),
        "gids": [os.getgid(), *sorted(set(os.getgroups()) - {os.getgid()})],
        "mount": mount_of(os.path.realpath(top)),
    }
    if mode == "list":
        out |= list_dir(top)
    elif mode == "peek":
        with os.scandir(top) as entries:
            out["first_entry"] = next((e.name for e in entries), None)
    else:
        tag, small, large_mib = argv[2], int(argv[3]), int(argv[4])
        work = os.path.join(top, tag)
        os.mkdir(work)
        out |= small_files(work, small) | large_file(work, large_mib)
        os.rmdir(work)
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1:])
