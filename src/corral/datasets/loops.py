"""The datasets' background loops, leased singletons like the others (collected by
corral.server.runner through EXTRA_LOOP_MODULES):

- `datasets-stale` (every 60 s): removes uploads idle for CORRAL_DATASET_UPLOAD_TIMEOUT_S with
  their staged bytes, and directories a crash left without their row (uploads.clean_stale);
- `storage-scan` (every CORRAL_STORAGE_SCAN_INTERVAL_S, 600 s): the usage of each home
  (`<storage root>/home/<user>`) and group directory (`<storage root>/group/<group>`), by a
  scandir walk off every request path; the totals land in storage_accounts, where quotas and
  the schedule loop read them. One account per tick at most a few seconds apart is not needed:
  the scan of one root is one tick.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import select

from corral.datasets.quotas import account
from corral.datasets.store import Store, tree_usage
from corral.datasets.uploads import clean_stale
from corral.db.models import Group, User
from corral.server.context import BackgroundLoop, ServerContext

log = logging.getLogger("corral.datasets.loops")
STALE_INTERVAL_S = 60.0
SCAN_LOOP_INTERVAL_S = 5.0  # how often the scan loop looks whether a scan is due


def stale_tick(ctx: ServerContext, now: float) -> None:
    store = Store(ctx.settings.storage_path)
    with ctx.session_factory() as session:
        removed = clean_stale(session, store, now, ctx.settings.dataset_upload_timeout_s)
    if removed:
        log.info("removed %d stale dataset uploads: %s", len(removed), removed)


_last_scan: dict[str, float] = {}


def scan_tick(ctx: ServerContext, now: float) -> None:
    if now - _last_scan.get(ctx.owner_id, 0.0) < ctx.settings.storage_scan_interval_s:
        return
    _last_scan[ctx.owner_id] = now
    scan_storage(ctx)


def scan_storage(ctx: ServerContext) -> int:
    """Scan every home and group directory that exists; returns how many were scanned."""
    root = ctx.settings.storage_path
    with ctx.session_factory() as session:
        users = set(session.scalars(select(User.name)))
        groups = set(session.scalars(select(Group.name)))
    scanned = 0
    for scope, top, names in (("user", root / "home", users), ("group", root / "group", groups)):
        for name in sorted(names):
            path = top / name
            if not path.is_dir():
                continue
            nbytes, nfiles = tree_usage(path)  # outside any transaction: it may take a while
            with ctx.session_factory() as session:
                row = account(session, scope, name)
                row.scanned_bytes, row.scanned_files, row.scanned_at = nbytes, nfiles, time.time()
                session.commit()
            scanned += 1
    return scanned


LOOPS: list[BackgroundLoop] = [
    BackgroundLoop("datasets-stale", STALE_INTERVAL_S, stale_tick),
    BackgroundLoop("storage-scan", SCAN_LOOP_INTERVAL_S, scan_tick),
]
