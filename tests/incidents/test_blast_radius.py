"""The blast-radius guard's GPU floor (guard.min_gpu_removals, docs/operations.md): the shipped
rules let the one-node demo (4 GPUs, where 10 % is none) quarantine a second faulty GPU by
itself, and hold a third for a human, while a real cluster is still held at its share; the held
back incident says what was counted and what to do. On the real server's node and remediation
code over SQLite (tests/incidents/test_rules.py's world)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select

from corral.db.incident_models import Incident, RemediationRun
from corral.db.models import Gpu
from corral.services import incidents
from corral.services.remediation_rules import DEFAULT_RULES, RulesError, parse_rules
from tests.incidents.test_rules import World, apply, ecc, make_world

GUARD = "guard/gpu-fault"


def gpu_health(w: World) -> dict[str, str]:
    with w.ctx.session_factory() as session:
        return {f"{g.node_name}/{g.index}": g.health for g in session.scalars(select(Gpu))}


def guard_incident(w: World) -> Incident | None:
    with w.ctx.session_factory() as session:
        return session.scalars(select(Incident).where(Incident.fingerprint == GUARD)).one_or_none()


def test_the_demo_quarantines_its_second_faulty_gpu_and_holds_the_third(tmp_path: Path) -> None:
    w = make_world(tmp_path)  # one node, 4 GPUs, the shipped rules
    now = time.time()
    ecc(w, True, now, gpu=0)
    ecc(w, True, now + 60, gpu=1)  # was held back: a SEV2 "remediation held back" on the demo
    health = gpu_health(w)
    assert health == {"n1/0": "quarantined", "n1/1": "quarantined", "n1/2": "healthy", "n1/3": "healthy"}
    assert guard_incident(w) is None
    ecc(w, True, now + 120, gpu=2)  # three of four GPUs within the hour: a human decides
    assert gpu_health(w)["n1/2"] == "healthy"
    incident = guard_incident(w)
    assert incident is not None and incident.severity == "SEV2"
    assert incident.title == "remediation held back: blast-radius guard: quarantine_gpu GPU 2 on n1 refused"
    with w.ctx.session_factory() as session:
        opened = incidents.detail(session, incident.id, now + 121)["timeline"][0]["text"]
        outcomes = session.scalars(select(RemediationRun.outcome).order_by(RemediationRun.id)).all()
    assert outcomes == ["ran", "ran", "guarded"]
    said = " ".join(opened.split())
    assert (
        "rules took 2 of the cluster's 4 GPUs out of service within 60 min, the most the guard allows "
        "(2: max_fraction 0.1 of the GPUs, never below min_gpu_removals 2)"
    ) in said, said
    assert "take it out by hand (`corral node gpu n1 2 quarantine`)" in said, said
    assert "raise guard.min_gpu_removals or guard.max_fraction in the rules file" in said, said
    ecc(w, True, now + 3700, gpu=3)  # the window has room again an hour on
    assert gpu_health(w)["n1/3"] == "quarantined"


def test_a_real_cluster_is_still_held_at_its_share_of_gpus(tmp_path: Path) -> None:
    """20 nodes of 4 GPUs: a storm of faults on 20 GPUs quarantines 8 (10 % of 80), no more."""
    w = make_world(tmp_path, nodes=20)
    now = time.time()
    for i in range(20):
        ecc(w, True, now + i, node=f"n{i + 1}")
    quarantined = sorted(gpu for gpu, health in gpu_health(w).items() if health == "quarantined")
    assert quarantined == sorted(f"n{i + 1}/0" for i in range(8))
    incident = guard_incident(w)
    assert incident is not None and incident.fire_count == 12
    with w.ctx.session_factory() as session:
        opened = incidents.detail(session, incident.id, now + 21)["timeline"][0]["text"]
    assert "rules took 8 of the cluster's 80 GPUs out of service" in opened, opened


@pytest.mark.parametrize(("floor", "quarantined"), [(0, 0), (1, 1), (3, 3)])
def test_min_gpu_removals_sets_the_floor(tmp_path: Path, floor: int, quarantined: int) -> None:
    """0 quarantines nothing by itself below the share; 1 is the floor before this setting."""
    w = make_world(tmp_path)
    text = DEFAULT_RULES.replace("min_gpu_removals: 2}", f"min_gpu_removals: {floor}}}")
    assert parse_rules(text).guard.min_gpu_removals == floor
    apply(w, text)
    now = time.time()
    for gpu in range(4):
        ecc(w, True, now + gpu, gpu=gpu)
    assert list(gpu_health(w).values()).count("quarantined") == quarantined
    incident = guard_incident(w)
    assert incident is not None and incident.fire_count == 4 - quarantined
    with w.ctx.session_factory() as session:
        opened = " ".join(incidents.detail(session, incident.id, now + 5)["timeline"][0]["text"].split())
    counted = (
        f"rules took {floor} of the cluster's 4 GPUs out of service within 60 min, the most the guard "
        f"allows ({floor}: max_fraction 0.1 of the GPUs, never below min_gpu_removals {floor})"
        if floor
        else "the guard allows rules no removal on a cluster of 4 GPUs (max_fraction 0.1 of the GPUs, "
        "never below min_gpu_removals 0): look at"
    )
    assert counted in opened, opened


def test_the_shipped_rules_floor_gpu_quarantines_at_two_and_nodes_at_one() -> None:
    guard = parse_rules(DEFAULT_RULES).guard
    assert (guard.min_gpu_removals, guard.min_removals, guard.max_fraction) == (2, 1, 0.10)
    assert [guard.limit(gpus, guard.min_gpu_removals) for gpus in (4, 8, 19, 20, 64)] == [2, 2, 2, 2, 6]
    assert parse_rules("version: 1\n").guard.min_gpu_removals == 2  # a file without a guard


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("two", "'two' is not a number of GPUs: give a whole number, 0 or more"),
        ("-1", "-1 is not a number of GPUs"),
        ("2.5", "2.5 is not a number of GPUs"),
        ("true", "True is not a number of GPUs"),
        ("null", "None is not a number of GPUs"),
    ],
)
def test_a_bad_min_gpu_removals_is_refused_naming_it_and_its_line(value: str, said: str) -> None:
    with pytest.raises(RulesError) as caught:
        parse_rules(f"version: 1\nguard:\n  window: 1h\n  min_gpu_removals: {value}\n")
    assert caught.value.line == 4
    assert caught.value.reason.startswith(f"guard.min_gpu_removals: {said}"), caught.value.reason


def test_a_bad_min_removals_names_nodes() -> None:
    with pytest.raises(RulesError, match=r"guard\.min_removals: 'one' is not a number of nodes"):
        parse_rules("version: 1\nguard: {min_removals: one}\n")
