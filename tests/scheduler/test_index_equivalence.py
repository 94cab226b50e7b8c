"""The bucket index is an accelerator only: it must pick exactly what the plain scan picks."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings

from corral.scheduler import PROFILES
from tests.scheduler.builders import plan_for
from tests.scheduler.strategies import snapshots


@settings(max_examples=60, deadline=None)
@given(snapshots())
def test_index_and_scan_agree(s) -> None:  # type: ignore[no-untyped-def]
    for name in ("default", "fifo-backfill"):
        for placement in ("bestfit", "spread"):
            fast = PROFILES[name].with_placement(placement)
            slow = dataclasses.replace(fast, use_index=False)
            assert plan_for(s, fast) == plan_for(s, slow)
