"""Who is on call when: the pure arithmetic of a schedule (no database), shared by "who is on
call now", the shift list, the gap warning and the iCal feed (corral.services.oncall).

A layer rotates its ordered members at a wall-clock handoff time in the schedule's IANA time
zone: shift n starts on `start_date + n * length` days at `handoff` local time, so a shift that
spans a DST change is 23 or 25 hours long and every handoff stays at the same local hour (a
local time the clocks skip moves forward by the gap: `instant`). Every answer compares instants,
never wall-clock times of day, so "who is on call" changes exactly where the shifts do. A layer
may cover only a daily window (`restrict_from`..`restrict_to`, local, may wrap midnight). Where
several layers cover an instant the highest (last) wins; an override wins over every layer. An
instant nobody covers is a gap: the schedule's fallback user (if any) is paged then.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

ROTATION_DAYS = {"daily": 1, "weekly": 7}


def instant(day: date, moment: time, zone: ZoneInfo) -> float:
    """The unix time of local `moment` on `day`, the one reading the shift list, the iCal feed and
    "who is on call" share. A time the clocks skip that day (spring forward) is read with the
    offset before the change, so it moves forward by the gap (02:30 on a day that jumps from 02:00
    to 03:00 is 03:30), as RFC 5545 3.3.5 says and zoneinfo's fold=0 does; a time that occurs
    twice (fall back) is its first occurrence. Comparing wall-clock times of day instead put the
    hand-over at 03:00 for "who is on call" while the shifts said 03:30, and gave the shift back
    to the previous person during the repeated hour."""
    return datetime.combine(day, moment, tzinfo=zone).timestamp()


def _zone(local: datetime) -> ZoneInfo:
    if not isinstance(local.tzinfo, ZoneInfo):
        raise TypeError("an aware datetime in the schedule's ZoneInfo is needed")
    return local.tzinfo


class RotationError(ValueError):
    """A schedule definition that cannot be used; the message names the field."""


def parse_hhmm(text: str, what: str) -> time:
    try:
        hours, minutes = text.split(":")
        if len(hours) != 2 or len(minutes) != 2:
            raise ValueError
        return time(int(hours), int(minutes))
    except ValueError:
        raise RotationError(f"{what}: {text!r} is not a time of day HH:MM (00:00-23:59)") from None


def parse_zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise RotationError(
            f"time_zone: {name!r} is not an IANA time zone (e.g. Europe/Berlin, UTC)"
        ) from None


@dataclass(frozen=True)
class Layer:
    name: str
    rotation: str  # daily | weekly
    start_date: date
    handoff: time
    members: tuple[str, ...]  # user names, in rotation order
    restrict_from: time | None = None
    restrict_to: time | None = None

    def __post_init__(self) -> None:
        if self.rotation not in ROTATION_DAYS:
            raise RotationError(
                f"layer {self.name!r}: rotation must be daily or weekly, not {self.rotation!r}"
            )
        if not self.members:
            raise RotationError(f"layer {self.name!r}: members must name at least one user")
        if (self.restrict_from is None) != (self.restrict_to is None):
            raise RotationError(f"layer {self.name!r}: give both restrict_from and restrict_to, or neither")
        if self.restrict_from is not None and self.restrict_from == self.restrict_to:
            raise RotationError(f"layer {self.name!r}: restrict_from equals restrict_to (an empty window)")

    def shift_start(self, n: int, zone: ZoneInfo) -> datetime:
        day = self.start_date + timedelta(days=n * ROTATION_DAYS[self.rotation])
        return datetime.combine(day, self.handoff, tzinfo=zone)

    def shift_index(self, local: datetime) -> int | None:
        """The shift covering the aware local time `local` (None: before the layer starts)."""
        ts, zone = local.timestamp(), _zone(local)
        day = local.date() + timedelta(1)  # the latest day whose handoff instant is not after ts
        while instant(day, self.handoff, zone) > ts:
            day -= timedelta(1)
        days = (day - self.start_date).days
        if days < 0:
            return None
        return days // ROTATION_DAYS[self.rotation]

    def in_window(self, local: datetime) -> bool:
        if self.restrict_from is None or self.restrict_to is None:
            return True
        ts, zone = local.timestamp(), _zone(local)
        closes_next_day = self.restrict_to < self.restrict_from  # wraps midnight
        for opened in (local.date() - timedelta(1), local.date()):
            closed = opened + timedelta(1) if closes_next_day else opened
            if instant(opened, self.restrict_from, zone) <= ts < instant(closed, self.restrict_to, zone):
                return True
        return False

    def who(self, local: datetime) -> str | None:
        n = self.shift_index(local)
        if n is None or not self.in_window(local):
            return None
        return self.members[n % len(self.members)]


@dataclass(frozen=True)
class Override:
    id: int
    user: str
    start: float
    end: float


@dataclass(frozen=True)
class OnCall:
    user: str | None  # None: a gap, and no fallback
    source: str  # "override" | "layer <name>" | "fallback" | "gap"


@dataclass(frozen=True)
class Shift:
    user: str | None
    source: str
    start: float
    end: float


@dataclass(frozen=True)
class Rotation:
    zone: ZoneInfo
    layers: tuple[Layer, ...]
    overrides: tuple[Override, ...] = field(default=())
    fallback: str | None = None

    def covering(self, ts: float) -> OnCall:
        """Who is on call at unix time `ts` before the fallback: user None with source "gap"."""
        for override in sorted(self.overrides, key=lambda o: -o.start):  # the latest-made start wins
            if override.start <= ts < override.end:
                return OnCall(override.user, "override")
        local = datetime.fromtimestamp(ts, self.zone)
        for layer in reversed(self.layers):
            user = layer.who(local)
            if user is not None:
                return OnCall(user, f"layer {layer.name}")
        return OnCall(None, "gap")

    def on_call(self, ts: float) -> OnCall:
        found = self.covering(ts)
        if found.user is None and self.fallback is not None:
            return OnCall(self.fallback, "fallback")
        return found

    def _edges(self, start: float, end: float) -> Iterator[float]:
        """Every instant in (start, end) at which the answer may change."""
        first = datetime.fromtimestamp(start, self.zone).date() - timedelta(days=1)
        last = datetime.fromtimestamp(end, self.zone).date() + timedelta(days=1)
        day = first
        while day <= last:
            for layer in self.layers:
                for moment in (layer.handoff, layer.restrict_from, layer.restrict_to):
                    if moment is not None:
                        yield instant(day, moment, self.zone)
            day += timedelta(days=1)
        for override in self.overrides:
            yield override.start
            yield override.end

    def shifts(self, start: float, end: float, *, with_fallback: bool = True) -> list[Shift]:
        """The coverage of [start, end) as consecutive shifts (gaps included, user None)."""
        if end <= start:
            return []
        cuts = sorted({start, end, *(t for t in self._edges(start, end) if start < t < end)})
        answer = self.on_call if with_fallback else self.covering
        out: list[Shift] = []
        for begin, finish in itertools.pairwise(cuts):
            who = answer(begin)
            if out and out[-1].user == who.user and out[-1].source == who.source:
                out[-1] = Shift(who.user, who.source, out[-1].start, finish)
            else:
                out.append(Shift(who.user, who.source, begin, finish))
        return out

    def gaps(self, start: float, end: float) -> list[Shift]:
        """Spans in [start, end) no layer or override covers (the fallback is paged there)."""
        return [s for s in self.shifts(start, end, with_fallback=False) if s.user is None]


def utc_text(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
