"""Rotation arithmetic (corral.services.rotation) across the end of daylight saving time in
Europe/Berlin (2026-10-25 03:00 CEST -> 02:00 CET): handoffs stay at the local wall-clock time, so
the shift spanning the change lasts 25 hours; overrides and gaps on the same night."""

from __future__ import annotations

from datetime import date, datetime, time
from zoneinfo import ZoneInfo

import pytest

from corral.services.rotation import Layer, Override, Rotation, RotationError

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
