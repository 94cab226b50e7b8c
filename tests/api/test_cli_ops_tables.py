"""Operator tables at 80 columns, against a real uvicorn server: what a new admin reads first
(who did what when, which rule did what, which channel) is never squeezed out or cut with an
ellipsis, and an empty list says so."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from corral.cli import common
from corral.cli.common import when
from corral.config import Settings
from corral.datasets.models import StorageAccount
from corral.db.audit_models import AuditRecord
from corral.monitor.alerts import record_alert
from corral.monitor.models import AlertNotification
from corral.services import audit, incidents, remediation
from corral.services.remediation import Signal
from tests.api.conftest import World
from tests.api.test_cli import run, server_url

__all__ = ["server_url"]  # the fixture


def column(out: str, heading: str, footer: bool = False) -> str:
    """One column of a borderless table, its folded lines run together (a count line left out)."""
    header, *rows = out.splitlines()[: -1 if footer else None]
    start = header.index(f" {heading} ")
    later = [header.find(f" {h} ", start + 1) for h in header.split()]
    end = min((i for i in later if i > start), default=len(header))
    return "".join("".join(row[start:end].split()) for row in rows)


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_audit_ls_keeps_each_records_id_and_time_whole_at_80_columns(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a long actor and target (a remediation run, an escalation policy) every column was
    squeezed: the ID column went and WHEN read "2026-11-30 0…"."""
    monkeypatch.setattr(common.out, "_width", 80)  # _width: see tests/api/test_cli_tables.py
    now = time.time()
    with world.session_factory() as db:
        audit.record(db, actor="system:remediation", action="remediation.run", target_kind="rule",
                     target_id="gpu-overheating", now=now - 60)  # fmt: skip
        audit.record(db, actor="system:remediation", action="oncall.escalation_policy.create",
                     target_kind="escalation_policy", target_id="sev1-weekend", now=now)  # fmt: skip
        db.commit()
        records = [(r.id, r.at) for r in db.query(AuditRecord).order_by(AuditRecord.id.desc())]
    code, out = run(world, server_url, "admin", "audit", "ls")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    rows = out.splitlines()[1:-1]  # between the header and the count
    starts = [line.split()[:3] for line in rows if line.split()[0].isdigit()]
    assert starts == [[str(number), *when(at).split()] for number, at in records], out
    assert column(out, "TARGET", footer=True) == "escalation_policy:sev1-weekendrule:gpu-overheating", out
    assert column(out, "ACTOR", footer=True) == "system:remediation" * 2, out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_rules_history_and_runs_say_when_there_is_nothing_yet(world: World, server_url: str) -> None:
    """A fresh server's `rules history` and `rules runs` printed a header alone."""
    code, out = run(world, server_url, "admin", "rules", "history")
    assert code == 0 and out.strip() == "no rules applied yet: version 0 (the shipped defaults) is active", (
        out
    )
    code, out = run(world, server_url, "admin", "rules", "runs")
    assert code == 0, out
    assert out.strip() == "no rule has run yet: rules run when an alert or event matches them", out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_rules_runs_gives_the_signal_and_every_action_whole_at_80_columns(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal read "CorralGpuEccErro…" and the actions ran together, cut at the edge."""
    monkeypatch.setattr(common.out, "_width", 80)
    labels = {"node": "node-a17", "gpu": "3", "severity": "critical"}
    with world.session_factory() as db:
        signal = Signal(name="CorralGpuOverheating", labels=labels, source="corral", summary="GPU 3 hot")
        remediation.on_signal(db, signal, time.time())
        db.commit()
    code, out = run(world, server_url, "admin", "rules", "runs")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    assert column(out, "RULE") == "gpu-overheating" and column(out, "SIGNAL") == "CorralGpuOverheating", out
    assert column(out, "ACTIONS").startswith("incident:incident1(SEV3)"), out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_alert_channels_gives_each_channel_name_and_error_whole_at_80_columns(
    world: World, server_url: str, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The boxed table cut the channel's name ("ops-e…") and its headings ("CHANN…", "PENDI…"),
    and the last error at 80 characters."""
    monkeypatch.setattr(common.out, "_width", 80)
    settings.home.mkdir(parents=True, exist_ok=True)
    (settings.home / "monitor.yml").write_text(
        "channels:\n"
        "  - {name: ops-email-primary, type: email, smtp_host: 127.0.0.1, smtp_port: 2525,\n"
        "     from: corral@example.org, to: [ops@example.org]}\n"
    )
    error = "SMTP 127.0.0.1:2525: [Errno 111] Connection refused; the next attempt in 40 s (attempt 4 of 12)"
    with world.session_factory() as db:
        labels = {"alertname": "CorralNodeLost", "severity": "critical", "node": "n1"}
        record_alert(db, labels=labels, status="firing", now=time.time(), channels=["ops-email-primary"],
                     source="corral")  # fmt: skip
        db.execute(sa.update(AlertNotification).values(state="failing", last_error=error, attempts=4))
        db.commit()
    code, out = run(world, server_url, "admin", "alert", "channels")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    header, row, *rest = out.splitlines()
    assert header.split() == [
        "CHANNEL",
        "TYPE",
        "STATE",
        "SENT",
        "PENDING",
        "FAILING",
        "GAVE",
        "UP",
        "LAST",
        "SENT",
    ]
    assert row.split() == ["ops-email-primary", "email", "failing", "0", "0", "1", "0", "-"], out
    assert " ".join(" ".join(rest).split()) == f"ops-email-primary: last error: {error}", out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_oncall_now_says_over_14_days_for_a_shift_with_no_handoff_ahead(
    world: World, server_url: str
) -> None:
    """A one-member layer's UNTIL read "2026-12-14 05:56 UTC": the end of the 14 days looked at,
    not a handoff."""
    layer = {"name": "solo", "rotation": "weekly", "start_date": "2026-01-05", "members": ["alice"]}
    put = world.client.put(
        "/api/v1/oncall/schedules/solo", json={"layers": [layer]}, headers=world.as_("admin")
    )
    assert put.status_code == 201, put.text
    code, out = run(world, server_url, "admin", "oncall", "now")
    assert code == 0, out
    assert out.splitlines()[1].split() == ["solo", "alice", "layer", "solo", "over", "14", "days", "-"], out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_incident_show_says_an_sla_is_overdue_or_met_and_names_the_actor_once(
    world: World, server_url: str
) -> None:
    """It printed "ack in -5m00s", then "ack in met" (and "met" for an acknowledgement that came
    too late), and "acknowledged by admin (admin)"."""
    opened = time.time() - 20 * 60  # a SEV2's time to acknowledge is 15 min
    with world.session_factory() as db:
        made = incidents.open_or_update(db, fingerprint="n7", title="node n7 lost", severity="SEV2",
                                        source="manual", labels={}, links={}, now=opened)  # fmt: skip
        db.commit()
        number = made.id
    code, out = run(world, server_url, "admin", "incident", "show", str(number))
    assert code == 0, out
    (sla,) = [line.strip() for line in out.splitlines() if line.strip().startswith("SLA:")]
    assert sla.startswith("SLA: ack overdue by 5m0") and ", mitigate in 3h" in sla, out
    assert run(world, server_url, "admin", "incident", "ack", str(number))[0] == 0
    code, out = run(world, server_url, "admin", "incident", "show", str(number))
    (sla,) = [line.strip() for line in out.splitlines() if line.strip().startswith("SLA:")]
    # acknowledged 5 min late: missed (it said "ack met", the countdown gone whatever the time)
    assert sla.startswith("SLA: ack missed, mitigate in 3h"), out
    (acked,) = [line for line in out.splitlines() if " acknowledged " in line]
    assert acked.endswith("acknowledged by admin"), out
    listed = run(world, server_url, "admin", "incident", "ls", "--all")[1]
    (row,) = [line.split() for line in listed.splitlines() if line.split()[:1] == [str(number)]]
    assert "missed" in row, listed
    with world.session_factory() as db:
        timely = incidents.open_or_update(
            db, fingerprint="n8", title="node n8 lost", severity="SEV2", source="manual", labels={}, links={},
            now=time.time() - 60,
        )  # fmt: skip
        db.commit()
        number = timely.id
    assert run(world, server_url, "admin", "incident", "ack", str(number))[0] == 0
    code, out = run(world, server_url, "admin", "incident", "show", str(number))
    (sla,) = [line.strip() for line in out.splitlines() if line.strip().startswith("SLA:")]
    assert sla.startswith("SLA: ack met, mitigate in 3h"), out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_alert_ls_with_nothing_to_list_says_so(world: World, server_url: str) -> None:
    """It printed the header row alone and "0 of 0 alert(s)"."""
    code, out = run(world, server_url, "admin", "alert", "ls")
    assert (code, out.strip()) == (0, "no alerts"), out
    code, out = run(
        world, server_url, "admin", "alert", "ls", "--status", "firing", "--name", "CorralNodeLost"
    )
    assert (code, out.strip()) == (0, "no firing alerts named CorralNodeLost"), out


ALERTMANAGER_LABELS = {
    "alertname": "CorralGpuTemperatureHigh", "severity": "warning", "corral_url": "http://127.0.0.1:8080",
    "instance": "127.0.0.1:8080", "job": "corral", "node": "node-a17", "gpu": "3", "job_id": "42",
    "user": "alice", "uuid": "GPU-5c1e2f0a-9d3b-4e7a-8f61-2b9c0d4e7a13", "hostname": "rack4-node-a17",
}  # fmt: skip


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_alert_ls_reads_at_80_columns_with_where_labels_under_the_name(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An Alertmanager alert's nine labels, one a line, ran over ~20 lines of a narrow column and
    SOURCE read "alertman…". Now the row is whole, the labels that say where (node, gpu, job_id)
    follow the name on one line, and --labels gives them all."""
    monkeypatch.setattr(common.out, "_width", 80)
    with world.session_factory() as db:
        record_alert(db, labels=ALERTMANAGER_LABELS, status="firing", now=time.time() - 300, channels=[],
                     source="alertmanager")  # fmt: skip
        db.commit()
    code, out = run(world, server_url, "admin", "alert", "ls")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    header, row, where, count = out.splitlines()
    assert header.split() == ["ID", "STATUS", "SEVERITY", "NAME", "SOURCE", "SINCE", "SEEN"], out
    assert row.split() == ["1", "firing", "warning", "CorralGpuTemperatureHigh", "alertmanager", "5m", "ago",
                           "1"], out  # fmt: skip
    assert where.split() == ["node=node-a17", "gpu=3", "job_id=42"], out
    assert where.index("node=") == header.index("NAME"), out
    assert count == "1 of 1 alert", out
    code, out = run(world, server_url, "admin", "alert", "ls", "--labels")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    shown = " ".join(line.strip() for line in out.splitlines()[2:-1])
    labels = sorted(f"{k}={v}" for k, v in ALERTMANAGER_LABELS.items() if k not in ("alertname", "severity"))
    assert "".join(shown.split()) == "".join(labels), out  # every label, folded, none cut
    assert run(world, server_url, "admin", "alert", "ls", "-l")[1] == out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_alert_ls_names_the_statuses_it_takes(world: World, server_url: str) -> None:
    """`--status bogus` printed the API's regular expression, ^(firing|resolved)$."""
    code, out = run(world, server_url, "admin", "alert", "ls", "--status", "bogus")
    said = " ".join(out.replace("│", " ").split())  # the usage error's box, unwrapped
    assert code == 2 and "'bogus' is not one of 'firing', 'resolved'" in said and "^(" not in out, out
    response = world.client.get("/api/v1/alerts", params={"status": "bogus"}, headers=world.as_("admin"))
    assert response.status_code == 422 and "^(" not in response.text, response.text
    assert "'firing' or 'resolved'" in response.text, response.text


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_incident_ls_gives_the_title_the_room_at_80_columns(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TITLE was some 18 columns wide, so a title ran over 3-4 lines beside "3h59m" countdowns."""
    monkeypatch.setattr(common.out, "_width", 80)
    title = "GPU 3 on node-a17 has 2 uncorrectable ECC errors"
    with world.session_factory() as db:
        made = incidents.open_or_update(db, fingerprint="ecc", title=title, severity="SEV2", source="alert",
                                        labels={}, links={}, now=time.time() - 20 * 60)  # fmt: skip
        db.commit()
        number = made.id
    assert run(world, server_url, "admin", "incident", "ack", str(number))[0] == 0
    code, out = run(world, server_url, "admin", "incident", "ls")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    header, *rows = out.splitlines()
    assert header.split()[:4] == ["ID", "SEV", "STATE", "TITLE"], out
    assert len(rows) <= 2, out  # the title on one line, or two
    assert column(out, "TITLE") == "".join(title.split()), out
    assert rows[0].split()[:3] == [str(number), "SEV2", "acknowledged"] and "admin" in rows[0].split(), out


@pytest.mark.parametrize("db_engine", ["sqlite"], indirect=True)
def test_storage_usage_gives_each_account_one_line_at_80_columns(
    world: World, server_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCANNED, "2026-11-30 06:41:07", wrapped over two lines in every row, "703.0 GiB / 2.0 TiB"
    broke after "2.0" and the group's name read "vision-rese…"."""
    monkeypatch.setattr(common.out, "_width", 80)
    now = time.time()
    with world.session_factory() as db:
        db.add(StorageAccount(scope="group", name="vision-research", max_bytes=2 << 40, max_files=1_000_000,
                              dataset_bytes=3 << 30, dataset_files=1200, scanned_bytes=700 << 30,
                              scanned_files=123_456, scanned_at=now - 600))  # fmt: skip
        db.add(StorageAccount(scope="user", name="alice", max_bytes=None, max_files=None, dataset_bytes=0,
                              dataset_files=0, scanned_bytes=5 << 20, scanned_files=40))  # fmt: skip
        db.commit()
    code, out = run(world, server_url, "admin", "storage", "usage")
    assert code == 0, out
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80, out
    header, *rows = out.splitlines()
    assert header.split() == ["SCOPE", "NAME", "USED", "/", "QUOTA", "DATASETS", "SCANNED", "OVER"], out
    assert [row.split() for row in rows] == [
        ["group", "vision-research", "703.0", "GiB", "/", "2.0", "TiB", "3.0", "GiB", "10m", "ago"],
        ["124656", "/", "1000000", "files"],
        ["user", "alice", "5.0", "MiB", "/", "-", "0", "B", "-"],
        ["40", "/", "-", "files"],
    ], out  # bytes, then files, used / quota; an account not scanned yet: "-"


def test_storage_usage_and_data_ls_with_nothing_yet_say_so(world: World, server_url: str) -> None:
    """On a fresh server both printed a bare header: a researcher could not tell an empty listing
    from a failed one, nor when their home's usage would show."""
    code, out = run(world, server_url, "alice", "storage", "usage")
    assert code == 0 and out.startswith("nothing counted yet: a dataset or model version counts"), out
    assert "SCOPE" not in out
    code, out = run(world, server_url, "alice", "data", "ls")
    assert code == 0 and out == "no datasets you may read yet: `corral data push NAME DIR` makes one\n", out
