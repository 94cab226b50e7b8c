"""Quota admission's model answers kept between cycles (`quota_memo.KeptAllowed`): ledgers that
share one keep give the answers a fresh ledger gives, cycle after cycle, while the groups' holdings
change under them."""

from __future__ import annotations

import random

from corral.scheduler import ANY_MODEL
from corral.scheduler.admission import QuotaLedger
from corral.scheduler.quota_memo import KeptAllowed
from corral.scheduler.types import Group
from tests.scheduler.builders import job

MODELS = ("A100", "V100", "T4")
ASKS = (("A100",), ("V100", "T4"), MODELS, ("T4",))


def random_groups(rng: random.Random) -> list[Group]:
    groups = []
    for name in ("a", "b", "c"):
        keys = rng.sample((*MODELS, ANY_MODEL), rng.randint(0, 3))
        guaranteed = {k: rng.randint(0, 8) for k in keys}
        capped = rng.sample((*MODELS, ANY_MODEL), 2)
        cap = None if rng.random() < 0.3 else {k: rng.randint(0, 16) for k in capped}
        groups.append(Group(name, guaranteed=guaranteed, max=cap))
    return groups


def answers(ledger: QuotaLedger, group: str, rng: random.Random) -> list[frozenset[str]]:
    found = []
    for k in range(6):
        asks = ASKS[k % len(ASKS)]
        need = rng.choice((1, 2, 4, 8))
        j = job(f"q{k}", group=group, gpus=need)
        found.append(ledger.allowed_models(j, asks, rng.random() < 0.5, need))
    return found


def test_kept_answers_equal_a_fresh_ledgers_over_changing_holdings() -> None:
    for seed in range(40):
        rng = random.Random(seed)
        groups = random_groups(rng)
        kept = KeptAllowed()
        held: list[tuple[str, str, int]] = []  # (group, model, GPUs) running from cycle to cycle
        for cycle in range(12):
            if held and rng.random() < 0.4:
                held.pop(rng.randrange(len(held)))
            if rng.random() < 0.6:
                held.append((rng.choice("abcz"), rng.choice(MODELS), rng.randint(1, 4)))
            if rng.random() < 0.1:  # the groups read afresh (new objects, same or other limits)
                groups = random_groups(rng) if rng.random() < 0.5 else [Group(**vars_of(g)) for g in groups]
            ledgers = QuotaLedger(groups, kept), QuotaLedger(groups)
            for ledger in ledgers:
                for g, m, n in held:
                    ledger.charge(job(f"r{g}{m}{n}", group=g, gpus=n), {m: n})
            for step in range(4):  # charges within the cycle (placements, a search's releases)
                group_name = rng.choice("abcz")
                ask_seed = rng.randrange(10**6)
                got = [answers(ledger, group_name, random.Random(ask_seed)) for ledger in ledgers]
                assert got[0] == got[1], (seed, cycle, step)
                charge = (rng.choice("abcz"), rng.choice(MODELS), rng.randint(-2, 3))
                for ledger in ledgers:
                    ledger.charge(job("c", group=charge[0], gpus=abs(charge[2])), {charge[1]: charge[2]})


def vars_of(group: Group) -> dict[str, object]:
    return {"name": group.name, "guaranteed": dict(group.guaranteed), "max": group.max}


def test_answers_are_kept_for_the_same_group_and_holdings_only() -> None:
    group = Group("a", guaranteed={"A100": 4})
    kept = KeptAllowed()
    first = kept.answers(group, {("a", "A100"): 2})
    first[(("A100",), 1, False)] = frozenset({"A100"})
    assert kept.answers(group, {("a", "A100"): 2, ("b", "A100"): 5}) is first  # another group's use
    assert kept.answers(group, {("a", "A100"): 3}) is not first  # this group holds more
    assert kept.answers(group, {("a", "A100"): 2}) == {}  # the last holdings only
    again = kept.answers(group, {("a", "A100"): 2})
    assert kept.answers(Group("a", guaranteed={"A100": 4}), {("a", "A100"): 2}) is not again  # read afresh
