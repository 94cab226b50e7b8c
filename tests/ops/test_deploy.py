"""Deployment pieces with real processes: TLS served by the server itself (a self-signed
certificate made with openssl), a fresh home created 0700 with its SQLite file 0600, secrets read
from CORRAL_*_FILE, and `corral doctor` against a real Prometheus."""

from __future__ import annotations

import json
import os
import signal
import ssl
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from corral.config import SecretFileError, Settings
from tests.monitor.test_e2e_alerting import daemon
from tests.server_fixture import wait_for
from tests.support import free_port, require_binary


def self_signed_cert(where: Path) -> tuple[Path, Path]:
    cert, key = where / "cert.pem", where / "key.pem"
    subprocess.run(
        [require_binary("openssl"), "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=corral-test", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def clean_env(home: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update({"CORRAL_HOME": str(home), "CORRAL_VIRTUAL_GPUS": "1", "CORRAL_NODE_NAME": "local"})
    env["CORRAL_WORKSPACE_PORT"] = "0"  # not the port after a free one, which may be taken: tests pass one
    env.update({f"CORRAL_{k.upper()}": v for k, v in settings.items()})
    return env


def test_tls_server_and_private_home(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    home = tmp_path / "fresh" / "home"  # neither exists: the server creates them
    port, lab_port = free_port(), free_port()
    log = tmp_path / "server.log"
    # Over https the workspace origin needs a host name other than the portal's (cookies are not
    # kept apart by port): `localhost` for the workspace listener, 127.0.0.1 for the portal.
    env = clean_env(
        home,
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        workspace_port=str(lab_port),
        workspace_origin=f"https://localhost:{lab_port}",
        public_url=f"https://127.0.0.1:{port}",
    )
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "corral.server", "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        # The server writes the bootstrap admin token to the CLI config (never to its log).
        wait_for(lambda: "Admin token written to" in log.read_text(), 60, what="the admin token")
        token = str(yaml.safe_load((home / "config.yaml").read_text())["token"])
        assert token not in log.read_text()
        url = f"https://127.0.0.1:{port}"
        trust = ssl.create_default_context(cafile=str(cert))

        def answers() -> httpx.Response | None:
            assert proc.poll() is None, log.read_text()[-3000:]
            try:
                return httpx.get(
                    f"{url}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}, verify=trust
                )
            except httpx.ConnectError:
                return None

        r = wait_for(answers, 60, what="the HTTPS API")
        assert r.status_code == 200, r.text
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is refused by a client
            httpx.get(f"{url}/api/v1/nodes", timeout=5)
        with pytest.raises(httpx.HTTPError):  # and plain HTTP gets no API
            httpx.get(f"http://127.0.0.1:{port}/api/v1/nodes", timeout=5)
        # The workspace listener is served with the same certificate, and serves no API.
        lab = httpx.get(f"https://127.0.0.1:{lab_port}/api/v1/nodes", verify=trust, timeout=5)
        assert lab.status_code == 404 and lab.text.startswith("this address serves workspaces only"), lab.text
        assert f"Corral is up at {url}" in log.read_text()
        assert f"Workspaces: JupyterLab on their own origin, https://localhost:{lab_port};" in log.read_text()
        config = (home / "config.yaml").read_text()
        assert f"url: {url}" in config

        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        for name in ("corral.db", "corral.db-wal", "config.yaml"):
            assert stat.S_IMODE((home / name).stat().st_mode) == 0o600, name
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_settings_read_secrets_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for var in [v for v in os.environ if v.startswith("CORRAL_")]:
        monkeypatch.delenv(var)
    secret = tmp_path / "db_url"
    secret.write_text("postgresql://corral:s3cret@db/corral\n")
    monkeypatch.setenv("CORRAL_DATABASE_URL_FILE", str(secret))
    assert Settings().database_url == "postgresql://corral:s3cret@db/corral"

    monkeypatch.setenv("CORRAL_DATABASE_URL", "sqlite:///x.db")
    with pytest.raises(SecretFileError, match="both CORRAL_DATABASE_URL and CORRAL_DATABASE_URL_FILE"):
        Settings()
    monkeypatch.delenv("CORRAL_DATABASE_URL")
    monkeypatch.setenv("CORRAL_DATABASE_URL_FILE", str(tmp_path / "missing"))
    with pytest.raises(SecretFileError, match=r"CORRAL_DATABASE_URL_FILE=.*missing: cannot read it"):
        Settings()
    monkeypatch.setenv("CORRAL_PORT_FILE", str(secret))  # read, then validated like the variable
    monkeypatch.delenv("CORRAL_DATABASE_URL_FILE")
    with pytest.raises(ValueError, match="port"):
        Settings()


def test_the_webhook_token_reads_from_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CORRAL_MONITOR_WEBHOOK_TOKEN_FILE, like every CORRAL_<NAME>_FILE (docs/deploy.md step 4),
    was silently ignored: the webhook then refused Alertmanager's every post."""
    from corral.monitor.config import MonitorSettings, webhook_token

    for var in [v for v in os.environ if v.startswith("CORRAL_")]:
        monkeypatch.delenv(var)
    secret = tmp_path / "webhook"
    secret.write_text("am-s3cret\n")
    monkeypatch.setenv("CORRAL_MONITOR_WEBHOOK_TOKEN_FILE", str(secret))
    assert webhook_token(Settings(home=tmp_path), MonitorSettings()) == "am-s3cret"
    monkeypatch.setenv("CORRAL_MONITOR_WEBHOOK_TOKEN", "other")
    with pytest.raises(SecretFileError, match="both CORRAL_MONITOR_WEBHOOK_TOKEN and"):
        MonitorSettings()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("foo", "database URL 'foo' is not a URL: use sqlite:////PATH or postgresql://"),
        # its scheme forgotten: not parsed, and echoed as given but for its password
        ("corral:pw@db/corral", "database URL 'corral:***@db/corral' is not a URL: use sqlite:"),
        (
            "mysql://corral:pw@db/corral",
            "database URL mysql://corral:***@db/corral: Corral runs on SQLite or PostgreSQL",
        ),
        (
            "postgresql://corral:pw@127.0.0.1:{port}/corral",
            "database postgresql://corral:***@127.0.0.1:{port}/corral: cannot connect: ",
        ),
    ],
)
def test_a_database_url_that_cannot_be_used_is_one_line(
    url: str, says: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral admin migrate` (the unit's ExecStartPre) and `corral up` printed SQLAlchemy's
    traceback for a URL that is not one, another database's, or a PostgreSQL that does not answer."""
    from typer.testing import CliRunner

    from corral.cli.main import app
    from corral.server.run import _prepare_home_and_database

    port = free_port()  # nothing listens there
    url, says = url.format(port=port), says.format(port=port)
    result = CliRunner().invoke(app, ["admin", "migrate", "--database-url", url])
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 1, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {says}") and ":pw@" not in line, line
    settings = Settings(home=tmp_path / "home", database_url=url)
    with pytest.raises(SystemExit) as stopped:
        _prepare_home_and_database(settings)
    assert stopped.value.code == 1


def test_a_bad_monitor_config_refuses_start_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`corral up` with a monitor.yml it cannot use ended in a MonitorConfigError traceback; the
    refusal is one line naming the file, line and field (docs/metrics.md), exit 1."""
    from corral.server.run import _prepare_home_and_database

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    (home / "monitor.yml").write_text("retry:\n  max_attempts: 0\n")
    with pytest.raises(SystemExit) as stopped:
        _prepare_home_and_database(Settings(home=home, database_url=f"sqlite:///{home}/c.db"))
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {home}/monitor.yml:2: retry.max_attempts: ") and err.count("\n") == 1, err


def test_an_unreadable_monitor_secret_file_refuses_start_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """CORRAL_MONITOR_WEBHOOK_TOKEN_FILE naming a missing file refuses start-up like any
    CORRAL_<NAME>_FILE: one line naming the variable and file, not a SecretFileError traceback."""
    from corral.server.run import _prepare_home_and_database

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    monkeypatch.setenv("CORRAL_MONITOR_WEBHOOK_TOKEN_FILE", str(tmp_path / "missing"))
    with pytest.raises(SystemExit) as stopped:
        _prepare_home_and_database(Settings(home=home, database_url=f"sqlite:///{home}/c.db"))
    assert stopped.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: CORRAL_MONITOR_WEBHOOK_TOKEN_FILE=") and "cannot read it" in err, err


def test_a_certificate_that_cannot_be_loaded_refuses_start_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`corral up --ssl-certfile C --ssl-keyfile K` with a missing file printed the banner ("Corral
    is up at https://..."), wrote the first admin token and started the loops, then uvicorn's load
    ended it in a FileNotFoundError traceback. The pair is loaded first: one line, exit 1."""
    from corral.server.run import _tls_or_exit

    home = tmp_path / "home"
    missing = Settings(home=home, ssl_certfile=tmp_path / "cert.pem", ssl_keyfile=tmp_path / "key.pem")
    with pytest.raises(SystemExit) as stopped:
        _tls_or_exit(missing)
    assert stopped.value.code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert (
        line.startswith(f"error: CORRAL_SSL_CERTFILE={tmp_path}/cert.pem, CORRAL_SSL_KEYFILE=")
        and "No such file" in line
    )
    cert, key = self_signed_cert(tmp_path)
    _tls_or_exit(Settings(home=home, ssl_certfile=cert, ssl_keyfile=key))  # a good pair passes


def test_corral_up_refuses_bad_settings_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`corral up --ssl-certfile C` alone printed pydantic's three lines, with every input repeated
    (a --database-url's password too); `--port 99999` ended in bind()'s OverflowError traceback."""
    from typer.testing import CliRunner

    from corral.cli.main import app

    for var in [v for v in os.environ if v.startswith("CORRAL_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "home"))
    for args, says in (
        (
            ["--ssl-certfile", "c.pem", "--database-url", "postgresql://u:pw@db/c"],
            "error: CORRAL_SSL_CERTFILE and ",
        ),
        (["--port", "99999"], "error: CORRAL_PORT: Input should be less than or equal to 65535"),
    ):
        res = CliRunner().invoke(app, ["up", *args])
        assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
        assert res.exit_code == 2, res.output
        (line,) = res.output.strip().splitlines()
        assert line.startswith(says) and ":pw@" not in line, line


def test_doctor_names_the_alertmanager_unit_debian_installs(tmp_path: Path) -> None:
    """An Alertmanager that did not answer got the fix `systemctl start alertmanager`, a unit
    Debian's prometheus-alertmanager (docs/deploy.md step 1) does not have."""
    from corral.ops.doctor import run_checks

    settings = Settings(
        home=tmp_path,
        database_url=f"sqlite:///{tmp_path}/c.db",
        alertmanager_url=f"http://127.0.0.1:{free_port()}",
    )
    checks = {c.name: c for c in run_checks(settings)}
    assert (
        checks["alertmanager"].fix == "systemctl start prometheus-alertmanager; check CORRAL_ALERTMANAGER_URL"
    )


def test_doctor_warns_when_an_id_range_holds_the_hosts_own_accounts_or_groups(tmp_path: Path) -> None:
    """CORRAL_UID_RANGE / CORRAL_GID_RANGE only had to be >= 1000: a range over the host's own
    ids (here 65534, nobody's and nogroup's on every Debian-like host) would give a Corral user
    or group an id a host account or group has, and with it that one's files."""
    import grp
    import pwd

    from corral.ops.doctor import check_id_ranges

    nobody, nogroup = pwd.getpwuid(65534).pw_name, grp.getgrgid(65534).gr_name
    home, db = tmp_path / "home", f"sqlite:///{tmp_path}/c.db"
    over = Settings(home=home, database_url=db, uid_range="65500-65599", gid_range="65400-65499")
    found = check_id_ranges(over)
    assert (found.status, found.detail) == (
        "warn",
        f"CORRAL_UID_RANGE 65500-65599 holds host accounts {nobody} (65534): a Corral user or group "
        "given one of those ids shares its files with them",
    ), found
    over = Settings(home=home, database_url=db, uid_range="65400-65499", gid_range="65500-65599")
    assert check_id_ranges(over).detail.startswith(
        f"CORRAL_GID_RANGE 65500-65599 holds host groups {nogroup} (65534)"
    )
    # on Slurm the mapped accounts own users' files: the uid range owns nothing there
    slurm = Settings(
        home=home, database_url=db, engine="slurm", uid_range="65500-65599", gid_range="65400-65499"
    )
    assert check_id_ranges(slurm).status == "ok"
    clear = Settings(home=home, database_url=db, uid_range="4210000-4219999", gid_range="4220000-4229999")
    assert (check_id_ranges(clear).status, check_id_ranges(clear).detail) == (
        "ok",
        "no host account or group holds an id Corral gives (4210000-4219999, 4220000-4229999)",
    )
    assert not (tmp_path / "c.db").exists()  # checking created nothing


def doctor(env: dict[str, str]) -> tuple[int, dict[str, dict[str, Any]]]:
    r = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "doctor", "-o", "json"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return r.returncode, {c["name"]: c for c in json.loads(r.stdout)}


def test_doctor_names_each_missing_piece_and_its_fix(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    closed = free_port()
    env = clean_env(home, prometheus_url=f"http://127.0.0.1:{closed}")
    code, checks = doctor(env)
    assert code == 1
    assert checks["home"]["status"] == "warn" and checks["home"]["fix"] == f"chmod 700 {home}"
    assert checks["database"]["status"] == "fail" and checks["database"]["fix"] == "corral admin migrate"
    assert checks["prometheus"]["status"] == "fail" and "unreachable" in checks["prometheus"]["detail"]
    assert checks["alertmanager"]["status"] == "skip"
    assert checks["gpus"]["status"] == "ok"  # 1 virtual GPU declared
    assert not (home / "corral.db").exists()  # checking created nothing
    bad = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "doctor"],
        env={**env, "CORRAL_DATABASE_URL_FILE": str(tmp_path / "nope")},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (
        bad.returncode == 2 and "CORRAL_DATABASE_URL_FILE=" in bad.stderr and "cannot read it" in bad.stderr
    )

    migrated = subprocess.run(
        [sys.executable, "-m", "corral.cli.main", "admin", "migrate"],
        env=env,
        capture_output=True,
        timeout=120,
    )
    assert migrated.returncode == 0, migrated.stderr
    assert stat.S_IMODE((home / "corral.db").stat().st_mode) == 0o600
    os.chmod(home, 0o700)
    prometheus, port = require_binary("prometheus"), free_port()
    (tmp_path / "prom.yml").write_text("global: {}\n")
    argv = [prometheus, f"--config.file={tmp_path / 'prom.yml'}", f"--web.listen-address=127.0.0.1:{port}",
            f"--storage.tsdb.path={tmp_path / 'prom-data'}"]  # fmt: skip
    with daemon(argv, tmp_path / "prom.log", f"http://127.0.0.1:{port}/-/ready"):
        code, checks = doctor(clean_env(home, prometheus_url=f"http://127.0.0.1:{port}"))
    failing = {k: v for k, v in checks.items() if v["status"] == "fail"}
    assert code == 0, failing
    assert checks["home"]["status"] == "ok" and checks["database"]["status"] == "ok"
    assert checks["prometheus"]["status"] == "ok"
    assert checks["sandbox"]["status"] == "ok"  # CI machines run jobs sandboxed


def test_doctor_loads_the_monitor_config_as_the_server_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral doctor` said nothing of monitor.yml: a file `corral up` refuses (a bad field) passed
    doctor, and the server then would not start. Now it is loaded with the server's loader."""
    from corral.ops.doctor import check_monitor_config

    for var in [v for v in os.environ if v.startswith("CORRAL_MONITOR_")]:
        monkeypatch.delenv(var)
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    settings = Settings(home=home, database_url=f"sqlite:///{home}/c.db")
    check = check_monitor_config(settings)
    assert check.status == "skip" and check.detail.startswith(f"no {home}/monitor.yml"), check
    channel = "channels:\n  - name: ops\n    type: email\n    smtp_host: mail\n    from: corral@example.org\n"
    (home / "monitor.yml").write_text(channel + "    to: [ops@example.org]\nretry:\n  max_attempts: 0\n")
    env = clean_env(home)
    code, checks = doctor(env)
    assert code == 1
    bad = checks["monitor config"]
    assert bad["status"] == "fail" and bad["detail"].startswith(f"{home}/monitor.yml:8: retry.max_attempts: ")
    assert (
        bad["fix"].startswith(f"correct that line of {home}/monitor.yml")
        and "corral up refuses" in bad["fix"]
    )
    (home / "monitor.yml").write_text(channel + "    to: [ops@example.org]\n")
    assert (
        check_monitor_config(settings).status == "ok"
        and "channels: ops" in check_monitor_config(settings).detail
    )
    elsewhere = tmp_path / "etc" / "monitor.yml"
    monkeypatch.setenv("CORRAL_MONITOR_CONFIG_FILE", str(elsewhere))
    missing = check_monitor_config(settings)  # the server's file, not the home's, and it is not there
    assert (
        missing.status == "warn"
        and f"CORRAL_MONITOR_CONFIG_FILE={elsewhere} does not exist" in missing.detail
    )
    elsewhere.parent.mkdir()
    elsewhere.write_text("channels: [{name: x, type: pager}]\n")
    wrong = check_monitor_config(settings)
    assert wrong.status == "fail" and wrong.detail.startswith(f"{elsewhere}:1: channels.0.type: "), wrong


REPO = Path(__file__).resolve().parents[2]


def test_shipped_unit_and_settings_match_the_code(tmp_path: Path) -> None:
    """The unit runs commands the CLI has, and corral.env sets only settings that exist."""
    from typer.main import get_command

    from corral.cli.main import app

    unit = (REPO / "deploy/systemd/corral.service").read_text()
    commands = get_command(app).commands  # type: ignore[attr-defined]
    for line in unit.splitlines():
        if line.startswith(("ExecStart=", "ExecStartPre=")):
            argv = line.split("=", 1)[1].split()
            assert argv[0].endswith("/corral"), line
            assert argv[1] in commands, f"{line}: no `corral {argv[1]}` command"
            if argv[1] == "admin":
                assert argv[2] in commands["admin"].commands, line
    assert "KillMode=process" in unit  # jobs outlive a server restart (re-adopted)
    fields = {f"CORRAL_{name.upper()}" for name in Settings.model_fields}
    env_lines = (REPO / "deploy/systemd/corral.env").read_text().splitlines()
    names = {
        ln.lstrip("# ").split("=", 1)[0]
        for ln in env_lines
        if "=" in ln and ln.lstrip("# ").startswith("CORRAL_")
    }
    # Read outside Settings: by the server's logging set-up, and (the portal's address) by the
    # alerts' links and the workspace listener (corral.monitor.runbooks, corral.workspaces.origin).
    unknown = names - fields - {"CORRAL_LOG_LEVEL", "CORRAL_PUBLIC_URL"}
    assert not unknown, f"corral.env sets unknown settings: {unknown}"
    analyze = require_binary("systemd-analyze")
    result = subprocess.run([analyze, "verify", str(REPO / "deploy/systemd/corral.service")],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    problems = [ln for ln in result.stderr.splitlines() if "is not executable" not in ln and ln.strip()]
    assert problems == [], problems  # only /opt/corral is absent on a test machine
