"""The difference between two tuples of objects when the newer is the older with a few items
removed (the rest in the same order) and new items appended: what the simulator's and the live
loop's running and queued tuples usually are from one cycle to the next (a dict's values: jobs that
start, end or leave drop out, new ones join at the end). Found by identity, a few comparisons per
item at C speed, instead of a set of every item's id and two set differences (Occupied.sync and
QueueIndex.sync, whose answers must not depend on how the difference was found: they check it).
"""

from __future__ import annotations

from itertools import chain, islice
from operator import indexOf, is_
from typing import TypeVar

T = TypeVar("T")

MAX_GONE = 8  # more items removed than this: the caller's set difference is as cheap
_END = (False,)  # ends every run of identity comparisons
# Compiled (mypyc: this module is then an extension, not a .py file), a plain loop compares the
# items' pointers natively, about 9x faster than the iterator chain, which is the faster one in
# pure Python (about 3x). Both give the same length (tests/scheduler/test_seqdiff.py).
NATIVE = not __file__.endswith(".py")


def common_run_iter(old: tuple[T, ...], new: tuple[T, ...], i: int, j: int) -> int:
    """How many items from old[i] and new[j] on are the same objects, pair by pair: at C speed
    through iterators, stopping at the first difference (no slices of the tails and no list of
    their comparisons; a run may reach the end of either: _END)."""
    return indexOf(chain(map(is_, islice(old, i, None), islice(new, j, None)), _END), False)


def common_run_loop(old: tuple[T, ...], new: tuple[T, ...], i: int, j: int) -> int:
    """`common_run_iter` as a loop (the compiled build's)."""
    n = min(len(old) - i, len(new) - j)
    k = 0
    while k < n and old[i + k] is new[j + k]:
        k += 1
    return k


def appended_diff(old: tuple[T, ...], new: tuple[T, ...]) -> tuple[list[int], int] | None:
    """(positions in `old` of the items `new` lacks, index in `new` where its appended items
    begin) when `new` is `old` without those items, the others in their order, followed by
    `new[index:]`; None when that does not describe it within MAX_GONE removals. The appended
    items are not checked against `old` (a reordered item can look removed and appended): the
    caller checks that none of them is one it holds."""
    gone: list[int] = []
    i = j = 0
    n_old, n_new = len(old), len(new)
    while i < n_old and j < n_new:
        if old[i] is new[j]:
            k = common_run_loop(old, new, i, j) if NATIVE else common_run_iter(old, new, i, j)
            i += k
            j += k
            continue
        # old[i] is not new[j]: taken as removed. Checked before building a run: the live loop's
        # tuples are new objects every tick, where each failed try scanned the whole tail
        if len(gone) >= MAX_GONE:
            return None
        gone.append(i)
        i += 1
    if n_old - i + len(gone) > MAX_GONE:
        return None
    gone.extend(range(i, n_old))  # `new` ran out: the rest of `old` was removed
    return gone, j


class DiffMemo:
    """The last `appended_diff` worked out, by the identity of its two tuples: a Scheduler's free
    capacity (`Occupied.sync`) and its queue index's running-id check (`QueueIndex`) each diff the
    same two running tuples (the last cycle's and this one's) every cycle; the second asks here and
    gets the first's answer. Holds the two tuples (so their identities are not reused) and the
    answer, which its callers only read."""

    __slots__ = ("found", "new", "old")

    def __init__(self) -> None:
        self.old: tuple[object, ...] | None = None
        self.new: tuple[object, ...] | None = None
        self.found: tuple[list[int], int] | None = None

    def diff(self, old: tuple[object, ...], new: tuple[object, ...]) -> tuple[list[int], int] | None:
        """`appended_diff(old, new)`, the kept answer when both are the very tuples it was for."""
        if old is self.old and new is self.new:
            return self.found
        found = appended_diff(old, new)
        self.old, self.new, self.found = old, new, found
        return found
