"""Quota admission's model answers kept between cycles (a pure cache, owned by a Scheduler).

`QuotaLedger.allowed_models` asks, per group, which GPU models a job of `need` GPUs may use within
the group's limits. The answer reads only the group's configuration and the GPUs the group holds
under each of its quota keys. A cycle's ledger used to work every answer out again (about 120,000
times in a 1,500-job synth replay, nearly all the first time in their cycle), although one job
starting or ending changes what one group holds and leaves the others' answers as they were.
"""

from __future__ import annotations

from collections.abc import Mapping

from corral.scheduler.types import ANY_MODEL, Group

AllowedKey = tuple[tuple[str, ...], int, bool]  # (models, need, borrow)


def quota_keys(group: Group) -> tuple[str, ...]:
    """Every quota key `QuotaLedger.key` can give for the group: a model named in its guarantee or
    its max, else the any-model key."""
    named = set(group.guaranteed)
    if group.max is not None:
        named.update(group.max)
    named.add(ANY_MODEL)
    return tuple(sorted(named))


class KeptAllowed:
    """Per group, the answers worked out under one (Group object, GPUs held per quota key): the
    same object and the same holdings give the same answers. The Group is compared by identity
    (and held, so its id is never reused); a group rebuilt each cycle simply never matches."""

    def __init__(self) -> None:
        # per group name: (the Group, its quota keys, GPUs held per key, the answers for those)
        self._kept: dict[
            str, tuple[Group, tuple[str, ...], tuple[int, ...], dict[AllowedKey, frozenset[str]]]
        ] = {}

    def answers(self, group: Group, used: Mapping[tuple[str, str], int]) -> dict[AllowedKey, frozenset[str]]:
        """The answers dict for the group as it holds now (`used`: the ledger's GPUs in use per
        (group, quota key)); the caller adds what it works out, which stays valid for that state."""
        name = group.name
        kept = self._kept.get(name)
        if kept is not None and kept[0] is not group:
            kept = None  # the group was read again: its keys may differ
        keys = quota_keys(group) if kept is None else kept[1]
        held = tuple([used.get((name, k), 0) for k in keys])
        if kept is not None and kept[2] == held:
            return kept[3]
        fresh: dict[AllowedKey, frozenset[str]] = {}
        self._kept[name] = (group, keys, held, fresh)
        return fresh
