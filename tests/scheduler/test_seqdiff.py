"""`seqdiff.appended_diff`: the removals and the appended tail that turn one tuple into the next."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from corral.scheduler.seqdiff import MAX_GONE, DiffMemo, appended_diff, common_run_iter, common_run_loop


class Item:  # compared by identity, as the schedulers' jobs are
    def __init__(self, n: int) -> None:
        self.n = n

    def __repr__(self) -> str:
        return f"Item({self.n})"


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 30), st.data())
def test_removals_and_an_appended_tail_are_found(size: int, data: st.DataObject) -> None:
    old = tuple(Item(i) for i in range(size))
    keep = data.draw(st.lists(st.booleans(), min_size=size, max_size=size))
    tail = [Item(100 + i) for i in range(data.draw(st.integers(0, 5)))]
    new = (*(x for x, k in zip(old, keep, strict=True) if k), *tail)
    found = appended_diff(old, new)
    removed = [i for i, k in enumerate(keep) if not k]
    if len(removed) > MAX_GONE:
        assert found is None
        return
    assert found == (removed, size - len(removed))


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.data())
def test_any_answer_rebuilds_the_new_tuple(size: int, data: st.DataObject) -> None:
    """Whatever the new tuple is (reordered, items repeated, new ones anywhere), an answer is one
    that rebuilds it: the old without the removed positions, then the tail."""
    old = tuple(Item(i) for i in range(size))
    pool = [*old, *(Item(100 + i) for i in range(3))]
    new = tuple(data.draw(st.lists(st.sampled_from(pool), max_size=size + 3))) if pool else ()
    found = appended_diff(old, new)
    if found is None:
        return
    gone, start = found
    assert gone == sorted(set(gone)) and all(0 <= i < size for i in gone)
    kept = [x for i, x in enumerate(old) if i not in set(gone)]
    assert len(kept) == start and all(a is b for a, b in zip(kept, new[:start], strict=True))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=12))
def test_the_kept_difference_is_the_one_of_the_very_two_tuples_asked(pairs: list[tuple[int, int]]) -> None:
    """`DiffMemo.diff` answers as `appended_diff` over any run of asks: the same two tuples again,
    the same new tuple after another old one, the same old one before another new one (the free
    capacity and the queue index share one memo and may each hold another last tuple)."""
    base = tuple(Item(i) for i in range(6))
    tuples = [base, base[1:], (*base[:2], *base[3:], Item(50)), (*base[2:], Item(60), Item(61))]
    memo = DiffMemo()
    for a, b in pairs:
        old, new = tuples[a], tuples[b]
        assert memo.diff(old, new) == appended_diff(old, new)
        assert memo.old is old and memo.new is new


@settings(max_examples=300, deadline=None)
@given(st.integers(0, 12), st.data())
def test_the_common_run_is_counted_alike_compiled_or_not(size: int, data: st.DataObject) -> None:
    """The loop (compiled builds) and the iterator chain (pure Python) count the same run of
    identical items from any two positions: to the first pair that differs, or to either end."""
    old = tuple(Item(i) for i in range(size))
    pool = [*old, Item(100)]
    new = tuple(data.draw(st.lists(st.sampled_from(pool), max_size=size + 2)))
    i = data.draw(st.integers(0, size))
    j = data.draw(st.integers(0, len(new)))
    want = 0
    while i + want < len(old) and j + want < len(new) and old[i + want] is new[j + want]:
        want += 1
    assert common_run_iter(old, new, i, j) == want
    assert common_run_loop(old, new, i, j) == want
