"""Incidents and remediation rules on a real SQLite database with the server's own node and
scheduling code (fake engine): an ECC alert under a running job, flapping, the blast-radius
guard, dry-run, rate limits, postmortems, SLAs and refused rule files."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from corral.db.audit_models import AuditRecord
from corral.db.diag_models import AttemptFault
from corral.db.incident_models import Incident, Postmortem, RemediationRun
from corral.db.models import Attempt, Gpu, GpuClaim, Job, Node
from corral.db.session import make_engine
from corral.monitor.alerts import record_alert
from corral.monitor.loops import incident_tick
from corral.scheduler import types as st
from corral.server.context import ServerContext
from corral.server.nodes import node_tick
from corral.server.reconcile import reconcile_tick
from corral.server.scheduling import apply_assignments
from corral.services import incident_flapping, incidents, remediation
from corral.services.errors import Conflict, Invalid
from corral.services.lifecycle import AttemptState, JobState, move_attempt, transition
from corral.services.remediation_rules import RulesError, parse_rules
from tests.pg import PostgresServer
from tests.server.fakes import FakeEngine, add_job, gpu_node, make_context, seed_tenant


@dataclass
class World:
    ctx: ServerContext
    group_id: int
    user_id: int


def make_world(tmp_path: Path, nodes: int = 1, url: str = "") -> World:
    fake = FakeEngine([gpu_node(f"n{i + 1}") for i in range(nodes)])
    ctx = make_context(make_engine(url or f"sqlite:///{tmp_path / 'db.sqlite'}"), fake, str(tmp_path))
    node_tick(ctx, time.time())
    with ctx.session_factory() as session:
        gid, uid = seed_tenant(session)
    return World(ctx, gid, uid)


@pytest.fixture(params=["sqlite", "postgresql"])
def world(request: pytest.FixtureRequest, tmp_path: Path) -> World:
    if request.param == "sqlite":
        return make_world(tmp_path)
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return make_world(tmp_path, url=server.create_database())


def running_job(w: World, node: str, gpu: int) -> int:
    with w.ctx.session_factory() as session:
        job_id = add_job(session, w.group_id, w.user_id)
    with w.ctx.session_factory() as session:
        placed = st.Allocation(str(job_id), (st.InstancePlacement("worker", 0, node, (gpu,), 1.0, 1024),))
        assert apply_assignments(session, [st.Assignment(str(job_id), placed)], time.time()) == 1
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        assert move_attempt(session, attempt, AttemptState.STARTING)
        assert move_attempt(session, attempt, AttemptState.RUNNING)
        session.commit()
    return job_id


def ecc(w: World, firing: bool, now: float, node: str = "n1", gpu: int = 0) -> list[tuple[str, float]]:
    labels = {"alertname": "CorralGpuEccErrors", "severity": "critical", "node": node, "gpu": str(gpu)}
    with w.ctx.session_factory() as session:
        summary = {"summary": f"GPU {gpu} on {node} has 1 ECC error"}
        status = "firing" if firing else "resolved"
        record_alert(
            session, labels=labels, status=status, now=now, channels=[], source="corral", annotations=summary
        )
        session.commit()
        return remediation.take_stops(session)


def all_incidents(w: World) -> list[Incident]:
    with w.ctx.session_factory() as session:
        return list(session.scalars(select(Incident).order_by(Incident.id)))


def apply(w: World, text: str) -> int:
    with w.ctx.session_factory() as session:
        version = remediation.apply_rules(session, text, "admin", time.time())
        session.commit()
        return version


def test_an_ecc_alert_under_a_running_job_quarantines_requeues_and_opens_one_sev2(world: World) -> None:
    job_id = running_job(world, "n1", 0)
    now = time.time()
    stops = ecc(world, True, now)
    assert stops == [(f"{job_id}.1", 0.0)]
    with world.ctx.session_factory() as session:
        assert session.get(Gpu, ("n1", 0)).health == "quarantined"  # type: ignore[union-attr]
        assert session.get(Gpu, ("n1", 1)).health == "healthy"  # type: ignore[union-attr]
        (fault,) = session.scalars(select(AttemptFault)).all()
        assert (fault.event, fault.node, fault.gpu_index) == ("gpu_error", "n1", 0)
        # the diagnosis watch's event for the same fault joins the incident and does nothing twice
        signal = remediation.Signal("GpuFault", {"node": "n1", "gpu": "0", "fault": "ecc"}, summary="ECC")
        remediation.on_signal(session, signal, now + 1)
        assert remediation.take_stops(session) == []
        session.commit()
    (incident,) = all_incidents(world)
    assert (incident.severity, incident.state, incident.fingerprint) == ("SEV2", "triggered", "gpu/n1/0")
    assert incident.links["gpus"] == ["n1/0"] and incident.links["nodes"] == ["n1"]
    with world.ctx.session_factory() as session:
        timeline = incidents.detail(session, incident.id, now)["timeline"]
        kinds = [e["kind"] for e in timeline]
        assert kinds[:2] == ["opened", "remedy"] and "fired" in kinds
        assert (
            "GPU 0 on n1 quarantined" in timeline[1]["text"]
            and f"requeued job {job_id}" in timeline[1]["text"]
        )
        audited = session.scalars(select(AuditRecord.action).where(AuditRecord.actor == "system:remediation"))
        assert {"gpu.quarantine", "remediation.run"} <= set(audited)
    ecc(world, False, now + 2)  # the fault cleared: the incident resolves by itself
    (incident,) = all_incidents(world)
    assert incident.state == "resolved"


def test_a_fault_toggled_20_times_in_a_minute_is_one_incident(world: World) -> None:
    start = time.time()
    for i in range(20):
        ecc(world, True, start + i * 3)
        ecc(world, False, start + i * 3 + 1.5)
    (incident,) = all_incidents(world)
    assert incident.fire_count == 20 and incident.state == "resolved"
    # long after it resolved, the same fault is a new incident
    ecc(world, True, start + 60 + incident_flapping.FLAP_WINDOW_S + 1)
    assert [i.state for i in all_incidents(world)] == ["resolved", "triggered"]


GUARD = "guard/cordon-everything"
CORDON_ALL = """\
version: 1
rules:
  - name: cordon-everything
    match: {name: NodeSick}
    actions: [cordon, {incident: {severity: SEV3, key: "sick/{node}"}}]
"""


def sick(w: World, node: str, now: float) -> None:
    with w.ctx.session_factory() as session:
        remediation.on_signal(session, remediation.Signal("NodeSick", {"node": node}, summary="sick"), now)
        session.commit()


def test_the_blast_radius_guard_stops_at_10_percent_of_nodes_then_opens_an_incident(tmp_path: Path) -> None:
    w = make_world(tmp_path, nodes=20)
    apply(w, CORDON_ALL)
    now = time.time()
    for i in range(20):
        sick(w, f"n{i + 1}", now + i)
    with w.ctx.session_factory() as session:
        cordoned = session.scalars(select(Node.name).where(Node.admin_state == "cordoned")).all()
        assert sorted(cordoned) == ["n1", "n2"]  # 10 % of 20
        outcomes = session.scalars(select(RemediationRun.outcome).order_by(RemediationRun.id)).all()
        assert outcomes == ["ran"] * 2 + ["guarded"] * 18
        guard = session.scalars(select(Incident).where(Incident.fingerprint == GUARD)).one()
        assert guard.severity == "SEV2" and guard.fire_count == 18
    # an hour later the window has room again
    sick(w, "n3", now + 3601)
    with w.ctx.session_factory() as session:
        assert session.get(Node, "n3").admin_state == "cordoned"  # type: ignore[union-attr]


def test_dry_run_records_what_it_would_do_and_changes_nothing(world: World) -> None:
    apply(world, CORDON_ALL.replace("version: 1\n", "version: 1\ndry_run: true\n"))
    job_id = running_job(world, "n1", 0)
    sick(world, "n1", time.time())
    with world.ctx.session_factory() as session:
        assert session.get(Node, "n1").admin_state == "none"  # type: ignore[union-attr]
        run = session.scalars(select(RemediationRun)).one()
        assert run.outcome == "dry_run" and run.incident_id is None
        assert [a["result"] for a in run.actions] == [
            "would open or join SEV3 incident sick/n1",
            "would cordon node n1",
        ]
        assert session.scalar(select(func.count()).select_from(Incident)) == 0
        assert session.get(Job, job_id).cancel_requested is False  # type: ignore[union-attr]


def placed_job(w: World, node: str, gpu: int, *moves: AttemptState) -> int:
    """A job placed on `node`'s GPU `gpu`, its attempt (and job) moved through `moves`."""
    with w.ctx.session_factory() as session:
        job_id = add_job(session, w.group_id, w.user_id)
    with w.ctx.session_factory() as session:
        placed = st.Allocation(str(job_id), (st.InstancePlacement("worker", 0, node, (gpu,), 1.0, 1024),))
        assert apply_assignments(session, [st.Assignment(str(job_id), placed)], time.time()) == 1
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == job_id)).one()
        job = session.get(Job, job_id)
        assert job is not None
        for move in moves:
            assert move_attempt(session, attempt, move)
            assert transition(session, job, JobState(move.value), now=time.time())
        session.commit()
    return job_id


def test_a_drain_also_stops_the_jobs_placed_or_starting_on_the_node(tmp_path: Path) -> None:
    """A job placed on the node (not launched yet) and one being launched there would otherwise
    start on the drained node: the first is requeued at once, the second preempted, and the
    reconcile loop stops its attempt like a running one's."""
    w = make_world(tmp_path)
    apply(w, CORDON_ALL.replace("actions: [cordon,", "actions: [drain,"))
    scheduled = placed_job(w, "n1", 0)
    starting = placed_job(w, "n1", 1, AttemptState.STARTING)
    running = placed_job(w, "n1", 2, AttemptState.STARTING, AttemptState.RUNNING)
    sick(w, "n1", time.time())
    with w.ctx.session_factory() as session:
        states = {j: session.get(Job, j).state for j in (scheduled, starting, running)}  # type: ignore[union-attr]
        assert states == {scheduled: "queued", starting: "preempted", running: "preempted"}
        job = session.get(Job, scheduled)
        assert job is not None and "node n1 drained by rule cordon-everything" in (job.reason or "")
        attempt = session.scalars(select(Attempt).where(Attempt.job_id == scheduled)).one()
        assert (attempt.state, attempt.reason) == ("cancelled", "stopped")
        claimed = session.scalars(select(GpuClaim.job_id).order_by(GpuClaim.job_id)).all()
        assert claimed == [starting, running]  # freed by the requeued job only
        (run,) = session.scalars(select(RemediationRun)).all()
        (drain,) = [a["result"] for a in run.actions if a["action"] == "drain"]
        assert drain.endswith("2 jobs preempted with their stop grace, 1 not yet started requeued")
    fake = w.ctx.engine
    assert isinstance(fake, FakeEngine)
    fake.run(f"{starting}.1")
    fake.run(f"{running}.1")
    reconcile_tick(w.ctx, time.time())
    assert sorted(a for a, _ in fake.stopped) == [f"{starting}.1", f"{running}.1"]


def test_a_rule_over_its_rate_limit_acts_no_more_and_asks_a_human(tmp_path: Path) -> None:
    w = make_world(tmp_path, nodes=4)
    limited = CORDON_ALL.replace("    actions:", "    rate_limit: {max: 1, per: 10m}\n    actions:")
    apply(w, limited.replace("version: 1\n", "version: 1\nguard: {max_fraction: 1.0}\n"))
    now = time.time()
    sick(w, "n1", now)
    sick(w, "n2", now + 1)
    with w.ctx.session_factory() as session:
        assert session.get(Node, "n2").admin_state == "none"  # type: ignore[union-attr]
        assert session.scalars(select(RemediationRun.outcome)).all() == ["ran", "rate_limited"]
        assert session.scalars(select(Incident).where(Incident.fingerprint == GUARD)).one()


def test_a_rule_over_its_rate_limit_then_made_dry_run_opens_no_incident(tmp_path: Path) -> None:
    """An operator who sets dry_run on a rule that ran too often: it records what it would do,
    and no guard incident opens (nor anything else) while it is a dry run."""
    w = make_world(tmp_path, nodes=4)
    limited = CORDON_ALL.replace("    actions:", "    rate_limit: {max: 1, per: 10m}\n    actions:")
    limited = limited.replace("version: 1\n", "version: 1\nguard: {max_fraction: 1.0}\n")
    apply(w, limited)
    now = time.time()
    sick(w, "n1", now)
    apply(w, limited.replace("version: 1\n", "version: 1\ndry_run: true\n"))
    sick(w, "n2", now + 1)
    with w.ctx.session_factory() as session:
        assert session.scalars(select(Incident.fingerprint)).all() == ["sick/n1"]
        run = session.scalars(select(RemediationRun).order_by(RemediationRun.id.desc()).limit(1)).one()
        assert run.dry_run and run.outcome == "rate_limited"
        assert run.actions[-1]["result"].startswith(
            "would open or join SEV2 incident guard/cordon-everything"
        )


def test_closing_a_sev2_needs_its_postmortem_and_a_sev4_does_not(world: World) -> None:
    now = time.time()
    with world.ctx.session_factory() as session:
        sev2 = incidents.open_or_update(session, fingerprint="x", title="x", severity="SEV2", source="manual",
                                        labels={}, links={}, now=now)  # fmt: skip
        sev4 = incidents.open_or_update(session, fingerprint="y", title="y", severity="SEV4", source="manual",
                                        labels={}, links={}, now=now)  # fmt: skip
        for incident in (sev2, sev4):
            incidents.acknowledge(session, incident.id, "alice", now + 1)
            incidents.mitigate(session, incident.id, "alice", now + 2)
            incidents.resolve(session, incident.id, "alice", now + 3)
        with pytest.raises(Conflict, match="SEV2: write its postmortem before closing it"):
            incidents.close(session, sev2.id, "alice", now + 4)
        incidents.close(session, sev4.id, "alice", now + 4)
        item = {"what": "burn-in new GPUs", "owner": "u", "due": "2026-12-31"}
        incidents.write_postmortem(session, sev2.id, "alice", now + 5, summary="ECC", impact="1 job",
                                   root_cause="bad HBM", action_items=[item])  # fmt: skip
        assert incidents.close(session, sev2.id, "alice", now + 6).state == "closed"
        with pytest.raises(Conflict, match="cannot become"):
            incidents.mitigate(session, sev2.id, "alice", now + 7)
        session.commit()


def test_a_postmortem_action_items_owner_must_be_a_user(world: World) -> None:
    """An action item's owner was stored as written: "zed", whom the platform does not know, owned
    the follow-up work of a closed SEV2 and nobody would ever do it."""
    now = time.time()
    with world.ctx.session_factory() as session:
        sev2 = incidents.open_or_update(session, fingerprint="x", title="x", severity="SEV2", source="manual",
                                        labels={}, links={}, now=now)  # fmt: skip
        items = [
            {"what": "a", "owner": "u", "due": "2026-12-31"},
            {"what": "b", "owner": "zed", "due": "2026-12-31"},
        ]
        with pytest.raises(Invalid) as caught:
            incidents.write_postmortem(session, sev2.id, "alice", now + 1, summary="s", impact="i",
                                       root_cause="r", action_items=items)  # fmt: skip
        assert str(caught.value) == "action item 2's owner: no user named 'zed' (give a user's name)"
        assert caught.value.loc == ("body", "action_items", "1", "owner")
        assert session.get(Postmortem, sev2.id) is None


def test_closing_a_closed_incident_says_so(world: World) -> None:
    """`corral incident close 1` twice answered "incident 1 is closed; resolve it before closing
    it", sending the second admin to resolve what was already done."""
    now = time.time()
    with world.ctx.session_factory() as session:
        sev4 = incidents.open_or_update(session, fingerprint="z", title="z", severity="SEV4", source="manual",
                                        labels={}, links={}, now=now)  # fmt: skip
        with pytest.raises(Conflict, match="is triggered; resolve it before closing it"):
            incidents.close(session, sev4.id, "alice", now + 1)
        incidents.resolve(session, sev4.id, "alice", now + 2)
        incidents.close(session, sev4.id, "alice", now + 3)
        with pytest.raises(Conflict) as caught:
            incidents.close(session, sev4.id, "bob", now + 4)
        assert str(caught.value) == f"incident {sev4.id} is already closed"


def test_slas_count_down_and_a_breach_is_marked_once(world: World) -> None:
    now = time.time()
    with world.ctx.session_factory() as session:
        incident = incidents.open_or_update(session, fingerprint="z", title="z", severity="SEV1",
                                            source="manual", labels={}, links={}, now=now)  # fmt: skip
        assert incidents.sla_view(incident, now + 60)["ack_remaining_s"] == 240.0
        assert incidents.check_slas(session, now + 301) == [(incident.id, "ack")]
        assert incidents.check_slas(session, now + 302) == []
        incidents.acknowledge(session, incident.id, "alice", now + 303)
        assert incidents.sla_view(incident, now + 304)["ack_remaining_s"] is None
        session.commit()


BAD_SEVERITY = """\
version: 1
rules:
  - name: a
    match: {name: X}
    actions:
      - incident: {severity: SEV9, key: "x/{node}"}
"""


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("version: 1\nrules:\n  - name: a\n    match: {name: X}\n    actions: [boom]\n", 5, "action 'boom'"),
        ("version: 1\nrules:\n  - name: a\n    match: {name: [X\n", 5, "not valid YAML"),
        ("version: 1\nrules:\n  - name: a\n    match: {nam: X}\n    actions: [cordon]\n", 4, "nam"),
        ("version: 1\nguard: {window: soon}\n", 2, "not a duration"),
        # the duplicate's own line, not the line of `rules:` (or of the first rule)
        (
            CORDON_ALL + "  - name: cordon-everything\n    match: {name: Y}\n    actions: [cordon]\n",
            CORDON_ALL.count("\n") + 1,
            "rules.1.name: two rules are named 'cordon-everything'",
        ),
        # refused when applied: accepted, it failed every alert the rule matched (in their transaction)
        (BAD_SEVERITY, 6, "rules.0.actions.0.severity: unknown severity 'SEV9'"),
    ],
)
def test_a_bad_rules_file_is_refused_with_its_line_and_the_old_version_stays(
    world: World, text: str, line: int, reason: str
) -> None:
    assert apply(world, CORDON_ALL) == 1
    with pytest.raises(RulesError) as caught:
        apply(world, text)
    assert caught.value.line == line and reason in caught.value.reason
    with world.ctx.session_factory() as session:
        assert remediation.active_text(session) == (1, CORDON_ALL)


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        (
            "incidents:\n  flapping: {reopens: 0}\n",
            2,
            "incidents.flapping.reopens: Input should be greater than or equal to 1",
        ),
        (
            "incidents:\n  reopen_window: 15m\n  flapping:\n    quiet: 0s\n",
            4,
            "incidents.flapping.quiet: Input should be greater than 0",
        ),
        (
            "incidents: {reopen_window: soon}\n",
            1,
            "incidents.reopen_window: 'soon' is not a duration (e.g. 90, 30s, 10m, 1h)",
        ),
        (
            "incidents:\n  flapping: {reopen: 3}\n",
            2,
            "incidents.flapping.reopen: Extra inputs are not permitted",
        ),
    ],
)
def test_the_incident_settings_are_checked_with_their_line(text: str, line: int, reason: str) -> None:
    with pytest.raises(RulesError) as caught:
        parse_rules(text)
    assert (caught.value.line, caught.value.reason) == (line, reason)


FLAPPY_RULES = remediation.DEFAULT_RULES.replace("reopen_window: 15m", "reopen_window: 2m").replace(
    "{reopens: 3, within: 1h, quiet: 30m}", "{reopens: 2, within: 10m, quiet: 5m}"
)


def test_the_rules_files_incident_settings_govern_reopening_and_flapping(world: World) -> None:
    assert parse_rules(remediation.DEFAULT_RULES).incidents.flap_policy() == incident_flapping.DEFAULT_FLAP
    assert FLAPPY_RULES != remediation.DEFAULT_RULES
    apply(world, FLAPPY_RULES)
    t = time.time()
    ecc(world, True, t)
    for reopen_at in (t + 60, t + 120):  # the 2nd reopen within 10 min: flapping
        ecc(world, False, reopen_at - 30)
        ecc(world, True, reopen_at)
    (incident,) = all_incidents(world)
    assert incident.flapping_since == t + 120 and incident.state == "triggered"
    incident_tick(world.ctx, t + 120 + 299)  # the incidents loop: not quiet for 5 min yet
    assert all_incidents(world)[0].flapping_since == t + 120
    incident_tick(world.ctx, t + 120 + 300)
    assert all_incidents(world)[0].flapping_since is None
    with world.ctx.session_factory() as session:
        ended = [
            e for e in incidents.detail(session, incident.id, t)["timeline"] if e["kind"] == "flapping_ended"
        ]
        assert [e["text"] for e in ended] == [
            "stopped flapping: stayed open (firing) for 5 min; a reopen pages again"
        ]
    ecc(world, False, t + 500)
    ecc(world, True, t + 500 + 121)  # past the 2 min reopen window: a new incident
    assert [i.state for i in all_incidents(world)] == ["resolved", "triggered"]


def test_the_shipped_rules_parse() -> None:
    rules = parse_rules(remediation.DEFAULT_RULES)
    assert [r.name for r in rules.rules][:3] == ["gpu-fault", "node-lost", "node-failing-jobs"]


def test_a_lost_node_requeues_elsewhere_only_when_there_is_an_elsewhere(tmp_path: Path) -> None:
    w = make_world(tmp_path, nodes=2)
    job_id = running_job(w, "n1", 0)
    labels = {"alertname": "CorralNodeLost", "severity": "critical", "node": "n1"}
    with w.ctx.session_factory() as session:
        record_alert(session, labels=labels, status="firing", now=time.time(), channels=[], source="corral")
        assert remediation.take_stops(session) == [(f"{job_id}.1", 0.0)]
        fault = session.scalars(select(AttemptFault)).one()
        assert (fault.node, fault.gpu_index) == ("n1", None)  # the retry avoids the whole node
        incident = session.scalars(select(Incident)).one()
        assert (incident.severity, incident.fingerprint) == ("SEV2", "node/n1")
        session.commit()


def test_a_lost_only_node_is_left_to_the_node_loop(world: World) -> None:
    running_job(world, "n1", 0)
    labels = {"alertname": "CorralNodeLost", "severity": "critical", "node": "n1"}
    with world.ctx.session_factory() as session:
        record_alert(session, labels=labels, status="firing", now=time.time(), channels=[], source="corral")
        assert remediation.take_stops(session) == []
        assert session.scalar(select(func.count()).select_from(AttemptFault)) == 0
        session.commit()


def test_two_transactions_opening_one_fault_at_once_make_one_incident(world: World) -> None:
    """The sampling loop's ECC alert and the watch's event for one GPU, on two servers at once:
    the second waits for the first's commit and joins its incident instead of opening another."""
    now = time.time()

    def open_it(session: Session, at: float) -> None:
        incidents.open_or_update(session, fingerprint="gpu/n1/0", title="ECC", severity="SEV2",
                                 source="rule:gpu-fault", labels={}, links={}, now=at)  # fmt: skip

    second_done = threading.Event()

    def second() -> None:
        with world.ctx.session_factory() as session:
            open_it(session, now + 1)
            session.commit()
        second_done.set()

    with world.ctx.session_factory() as session:
        open_it(session, now)
        other = threading.Thread(target=second)
        other.start()
        assert not second_done.wait(1.0)  # held back by the first, which has not committed
        session.commit()
    other.join(30)
    (incident,) = all_incidents(world)
    assert incident.fire_count == 2


def test_a_grouping_key_longer_than_the_column_still_joins_its_incident(world: World) -> None:
    key = "hot/" + "x" * 300  # e.g. a key template with the alert's {summary} in it
    now = time.time()
    with world.ctx.session_factory() as session:
        for i in range(2):
            incidents.open_or_update(session, fingerprint=key, title="hot", severity="SEV3", source="manual",
                                     labels={}, links={}, now=now + i)  # fmt: skip
        session.commit()
    (incident,) = all_incidents(world)
    assert incident.fire_count == 2


def test_each_notify_owner_action_says_its_own_message(world: World) -> None:
    """A rule may notify twice (e.g. before and after an action): each notice is its own
    action's message; the second said the first's again."""
    from corral.db.models import JobEvent

    apply(
        world,
        """\
version: 1
rules:
  - name: warn-twice
    match: {name: JobGpuIdle}
    actions:
      - {notify_owner: {message: "first: job {job_id} is idle"}}
      - {notify_owner: {message: "second: it will be stopped"}}
""",
    )
    job_id = running_job(world, "n1", 0)
    with world.ctx.session_factory() as session:
        remediation.on_signal(session, remediation.Signal("JobGpuIdle", {"job_id": str(job_id)}), time.time())
        session.commit()
        notices = session.scalars(
            select(JobEvent.message)
            .where(JobEvent.job_id == job_id, JobEvent.kind == "notice")
            .order_by(JobEvent.id)
        ).all()
    assert notices == [
        f"notice from the operators (warn-twice): first: job {job_id} is idle",
        "notice from the operators (warn-twice): second: it will be stopped",
    ]


def test_two_admins_applying_rules_at_once_the_second_is_told_not_a_500(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both read the same last version and write the next: the second one's insert hits the first
    one's row. It is a 409 naming the version (it was written without seeing the other's)."""
    assert apply(world, CORDON_ALL) == 1
    monkeypatch.setattr(remediation, "active_version", lambda session: 0)  # read before the first's commit
    with world.ctx.session_factory() as session:
        with pytest.raises(Conflict, match="rules version 1 was applied by someone else"):
            remediation.apply_rules(session, CORDON_ALL, "admin2", time.time())
        session.commit()  # the session is still usable: nothing of the refused file is kept
    monkeypatch.undo()
    with world.ctx.session_factory() as session:
        assert [v.author for v in remediation.history(session)] == ["admin"]
