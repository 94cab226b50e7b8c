"""The audit log on a real server process: an admin's cordon is recorded with the request's
address and token, and the server's leased retention loop deletes it once it is older than
CORRAL_AUDIT_RETENTION_DAYS, leaving an `audit.purge` record of the deletion."""

from __future__ import annotations

from pathlib import Path

from tests.server_fixture import start_server, wait_for


def test_server_records_an_admin_action_and_retention_purges_it(tmp_path: Path) -> None:
    env = {"CORRAL_AUDIT_RETENTION_DAYS": str(4 / 86400), "CORRAL_JOB_RETENTION_CHECK_S": "0.5"}  # 4 s
    with start_server(tmp_path / "home", extra_env=env) as srv, srv.client() as c:
        node = c.get("/api/v1/nodes").json()[0]["name"]
        assert c.post(f"/api/v1/nodes/{node}/cordon").status_code == 200
        page = c.get("/api/v1/audit", params={"action": "node"}).json()
        assert page["total"] == 1, page
        record = page["items"][0]
        assert (record["action"], record["target_id"], record["actor"]) == ("node.cordon", node, "admin")
        assert record["source"] == "127.0.0.1" and record["credential"].startswith("token:")
        assert record["before"]["admin_state"] == "none" and record["after"]["admin_state"] == "cordoned"
        wait_for(
            lambda: c.get("/api/v1/audit", params={"action": "node"}).json()["total"] == 0,
            20,
            what="the retention loop to purge the cordon's record",
        )
        purges = c.get("/api/v1/audit", params={"action": "audit.purge"}).json()["items"]
        assert purges and purges[-1]["actor"] == "system:retention" and purges[-1]["after"]["deleted"] >= 1
        assert "retention: deleted 1 audit record written" in srv.log_text()
