"""Rotation arithmetic (corral.services.rotation) across the end of daylight saving time in
Europe/Berlin (2026-10-25 03:00 CEST -> 02:00 CET): handoffs stay at the local wall-clock time, so
the shift spanning the change lasts 25 hours; overrides and gaps on the same night."""

from __future__ import annotations

import itertools
from datetime import date, datetime, time
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.services.rotation import Layer, OnCall, Override, Rotation, RotationError

BERLIN = ZoneInfo("Europe/Berlin")
H = 3600.0


def at(text: str) -> float:
    return datetime.fromisoformat(text).replace(tzinfo=BERLIN).timestamp()


def daily(**kw: object) -> Layer:
    fields: dict[str, object] = {"name": "primary", "rotation": "daily", "start_date": date(2026, 10, 20)}
    fields.update(handoff=time(9, 0), members=("ann", "bob", "cy"))
    fields.update(kw)
    return Layer(**fields)  # type: ignore[arg-type]


def test_daily_handoff_keeps_local_time_across_dst_end() -> None:
    rotation = Rotation(BERLIN, (daily(),))
    # 2026-10-24 is day 4 of the rotation: bob (4 % 3 == 1); at 08:59 the next morning still bob.
    assert rotation.on_call(at("2026-10-24T09:00")).user == "bob"
    assert rotation.on_call(at("2026-10-25T08:59")).user == "bob"
    assert rotation.on_call(at("2026-10-25T09:00")).user == "cy"
    assert rotation.on_call(at("2026-10-20T08:59")).user is None  # before the layer starts: a gap
    shifts = rotation.shifts(at("2026-10-24T12:00"), at("2026-10-27T12:00"))
    assert [s.user for s in shifts] == ["bob", "cy", "ann", "bob"]
    bob_start = at("2026-10-24T09:00")
    spanning = next(s for s in rotation.shifts(bob_start, at("2026-10-26T00:00")) if s.user == "bob")
    assert spanning.end - spanning.start == 25 * H  # 09:00 CEST to 09:00 CET
    assert datetime.fromtimestamp(shifts[1].start, BERLIN).hour == 9
    assert shifts[1].start - shifts[0].start == 22 * H  # 12:00 CEST to 09:00 CET: 21 wall-clock hours + 1


def test_weekly_rotation_spans_the_change_with_one_more_hour() -> None:
    layer = daily(rotation="weekly", start_date=date(2026, 10, 19), members=("ann", "bob"))
    rotation = Rotation(BERLIN, (layer,))
    week = rotation.shifts(at("2026-10-19T09:00"), at("2026-11-02T09:00"))
    assert [s.user for s in week] == ["ann", "bob"]
    assert week[0].end - week[0].start == 7 * 24 * H + H
    assert week[1].end - week[1].start == 7 * 24 * H


def test_override_across_the_change_and_a_higher_layer() -> None:
    # dave takes 20:00 CEST on the 24th to 08:00 CET on the 25th: 13 hours, over the repeated hour.
    swap = Override(1, "dave", at("2026-10-24T20:00"), at("2026-10-25T08:00"))
    weekend = daily(name="weekend", members=("eve",), restrict_from=time(10, 0), restrict_to=time(12, 0))
    rotation = Rotation(BERLIN, (daily(), weekend), (swap,))
    assert swap.end - swap.start == 13 * H
    shifts = rotation.shifts(at("2026-10-24T18:00"), at("2026-10-25T13:00"))
    assert [(s.user, s.source) for s in shifts] == [
        ("bob", "layer primary"),
        ("dave", "override"),
        ("bob", "layer primary"),
        ("cy", "layer primary"),
        ("eve", "layer weekend"),  # the higher layer wins in its window
        ("cy", "layer primary"),
    ]
    assert rotation.on_call(at("2026-10-25T02:30")).user == "dave"


def test_gap_is_reported_and_the_fallback_covers_it() -> None:
    office = daily(restrict_from=time(9, 0), restrict_to=time(17, 0))
    rotation = Rotation(BERLIN, (office,), fallback=None)
    gaps = rotation.gaps(at("2026-10-24T12:00"), at("2026-10-25T12:00"))
    assert [(g.start, g.end) for g in gaps] == [(at("2026-10-24T17:00"), at("2026-10-25T09:00"))]
    assert gaps[0].end - gaps[0].start == 17 * H  # 16 wall-clock hours plus the repeated one
    assert rotation.on_call(at("2026-10-24T20:00")).user is None
    covered = Rotation(BERLIN, (office,), fallback="root")
    assert covered.on_call(at("2026-10-24T20:00")).user == "root"
    assert covered.on_call(at("2026-10-24T20:00")).source == "fallback"
    assert covered.gaps(at("2026-10-24T12:00"), at("2026-10-25T12:00")) == gaps  # still a gap, warned


def test_bad_definitions_are_named() -> None:
    with pytest.raises(RotationError, match="rotation must be daily or weekly"):
        daily(rotation="monthly")
    with pytest.raises(RotationError, match="members must name at least one user"):
        daily(members=())
    with pytest.raises(RotationError, match="both restrict_from and restrict_to"):
        daily(restrict_from=time(9, 0))


NEW_YORK = ZoneInfo("America/New_York")


@pytest.mark.parametrize(
    ("zone", "spring", "fall", "repeated"),
    [(BERLIN, "2026-03-29", "2026-10-25", "02"), (NEW_YORK, "2026-03-08", "2026-11-01", "01")],
)
def test_a_handoff_in_the_skipped_or_repeated_hour_is_one_instant_for_every_answer(
    zone: ZoneInfo, spring: str, fall: str, repeated: str
) -> None:
    # Both zones skip 02:00-03:00 in spring: 02:30 does not exist that day and is read with the
    # offset before the change (03:30 new time, RFC 5545 3.3.5, zoneinfo fold=0). In autumn the
    # hour `repeated`:00-:59 occurs twice and a handoff in it is its first occurrence. "Who is on
    # call" must hand over at the instant the shift list and the iCal feed show.
    def local(text: str, fold: int = 0) -> float:
        return datetime.fromisoformat(text).replace(tzinfo=zone, fold=fold).timestamp()

    def rotation(handoff: time) -> Rotation:
        return Rotation(zone, (daily(start_date=date(2026, 1, 1), handoff=handoff, members=("ann", "bob")),))

    spring_rotation = rotation(time(2, 30))
    handover = local(f"{spring}T03:30")
    assert handover == local(f"{spring}T02:30")  # the skipped time, moved forward by the gap
    shifts = spring_rotation.shifts(handover - 6 * H, handover + 6 * H)
    assert [s.start for s in shifts[1:]] == [handover]
    before, after = shifts[0].user, shifts[1].user
    assert before != after
    answers = [spring_rotation.on_call(local(f"{spring}T{t}")).user for t in ("03:00", "03:29", "03:30")]
    assert answers == [before, before, after]

    fall_rotation = rotation(time(int(repeated), 30))
    first = local(f"{fall}T{repeated}:30")  # the first (summer time) occurrence
    shifts = fall_rotation.shifts(first - 6 * H, first + 6 * H)
    assert [s.start for s in shifts[1:]] == [first]
    before, after = shifts[0].user, shifts[1].user
    # the second :00-:30 of the repeated hour comes after the hand-over: the new person stays
    answers = [fall_rotation.on_call(local(f"{fall}T{repeated}:{m}", fold=1)).user for m in ("00", "15")]
    assert answers == [after, after]


@settings(max_examples=60, deadline=None)
@given(
    zone=st.sampled_from([BERLIN, NEW_YORK, ZoneInfo("Australia/Lord_Howe")]),  # Lord Howe: 30 min
    day=st.sampled_from(["2026-03-08", "2026-03-29", "2026-04-05", "2026-10-04", "2026-10-25", "2026-11-01"]),
    handoff=st.builds(time, st.sampled_from([1, 2, 2, 3]) | st.integers(0, 23), st.integers(0, 59)),
    window=st.none() | st.tuples(st.integers(0, 23 * 60 + 59), st.integers(1, 23 * 60 + 59)),
    probe=st.floats(0.0, 1.0),
)
def test_shifts_tile_time_and_agree_with_who_is_on_call_across_clock_changes(
    zone: ZoneInfo, day: str, handoff: time, window: tuple[int, int] | None, probe: float
) -> None:
    restrict: dict[str, object] = {}
    if window is not None and window[1] % (24 * 60) != window[0]:
        begin, end = window[0], (window[0] + window[1]) % (24 * 60)
        restrict = {"restrict_from": time(begin // 60, begin % 60), "restrict_to": time(end // 60, end % 60)}
    layer = daily(start_date=date(2026, 1, 1), handoff=handoff, members=("ann", "bob"), **restrict)
    rotation = Rotation(zone, (daily(start_date=date(2026, 1, 1), members=("cy",)), layer))
    start = datetime.fromisoformat(f"{day}T00:00").replace(tzinfo=zone).timestamp() - 12 * H
    shifts = rotation.shifts(start, start + 48 * H)
    assert shifts[0].start == start and shifts[-1].end == start + 48 * H
    for previous, shift in itertools.pairwise(shifts):
        assert previous.end == shift.start  # no gap, no overlap
    for shift in shifts:
        for inside in (shift.start, shift.start + probe * (shift.end - shift.start - 1), shift.end - 1):
            assert rotation.on_call(inside) == OnCall(shift.user, shift.source)
