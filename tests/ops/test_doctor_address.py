"""`corral doctor`'s tls check names the address the server listens on, and how it knows: it
read the settings alone and said "plain HTTP on 127.0.0.1:8080" of a server started with
`corral up --port 9500` (whose port is in the CLI config `corral up` writes, not in settings)."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from corral.config import Settings
from corral.ops.doctor import check_tls, listening_hosts
from corral.sdk import write_cli_config


@contextmanager
def listening(host: str) -> Iterator[int]:
    """A real socket listening on `host` at a free port, as a server's would."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(1)
        yield sock.getsockname()[1]
    finally:
        sock.close()


def settings_for(home: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    home.mkdir(mode=0o700, exist_ok=True)
    for name in ("CORRAL_HOST", "CORRAL_PORT", "CORRAL_URL", "CORRAL_SSL_CERTFILE", "CORRAL_SSL_KEYFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CORRAL_HOME", str(home))
    monkeypatch.setenv("CORRAL_DATABASE_URL", f"sqlite:///{home}/corral.db")
    return Settings()


def test_doctor_checks_the_port_the_cli_config_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(tmp_path / "home", monkeypatch)
    with listening("127.0.0.1") as port:
        assert port != settings.port and listening_hosts(port) == ["127.0.0.1"]
        write_cli_config(
            f"http://127.0.0.1:{port}", "crl_x", home=settings.home
        )  # as `corral up --port` does
        check = check_tls(settings, env={"CORRAL_HOME": str(settings.home)})
        config = settings.home / "config.yaml"
        assert check.status == "ok", check
        assert check.detail == (
            f"plain HTTP on 127.0.0.1:{port} (the CLI's server, {config}; a socket listens there now)"
            " (loopback; TLS at the proxy)"
        ), check.detail
        result = CliRunner().invoke(cli, ["doctor", "-o", "json"])
        (tls,) = [c for c in json.loads(result.output) if c["name"] == "tls"]
        assert tls["detail"] == check.detail, result.output


def test_doctor_warns_of_a_server_listening_on_every_interface(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral up --host 0.0.0.0 --port N` writes http://127.0.0.1:N into the CLI config: the
    socket says it is exposed."""
    settings = settings_for(tmp_path / "home", monkeypatch)
    with listening("0.0.0.0") as port:
        write_cli_config(f"http://127.0.0.1:{port}", "crl_x", home=settings.home)
        check = check_tls(settings, env={})
    assert check.status == "warn" and check.fix is not None, check
    assert check.detail.startswith(f"plain HTTP on 0.0.0.0:{port} (the CLI's server, "), check.detail
    assert check.detail.endswith(": tokens cross the network in clear"), check.detail


def test_doctor_says_which_setting_gave_the_address(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = settings_for(tmp_path / "home", monkeypatch)
    none = [tmp_path / "no-proc-net-tcp"]  # nothing listens: the address as configured
    check = check_tls(settings, env={}, proc_net=none)
    assert check.detail.startswith("plain HTTP on 127.0.0.1:8080 (the default address)"), check.detail
    check = check_tls(settings, env={"CORRAL_URL": "http://10.0.0.5:9500"}, proc_net=none)
    assert check.status == "warn", check
    assert check.detail.startswith("plain HTTP on 10.0.0.5:9500 (the CLI's server, CORRAL_URL)"), check.detail
    monkeypatch.setenv("CORRAL_PORT", "9501")
    check = check_tls(
        Settings(), env={"CORRAL_PORT": "9501", "CORRAL_URL": "http://127.0.0.1:9500"}, proc_net=none
    )
    assert check.detail.startswith("plain HTTP on 127.0.0.1:9501 (CORRAL_HOST/CORRAL_PORT)"), check.detail


@pytest.mark.parametrize("url", ["http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:port"])
def test_a_cli_url_that_is_no_url_gives_the_settings_address_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    settings = settings_for(tmp_path / "home", monkeypatch)
    check = check_tls(settings, env={"CORRAL_URL": url}, proc_net=[tmp_path / "no-proc-net-tcp"])
    assert check.detail.startswith("plain HTTP on 127.0.0.1:8080 (the default address)"), check.detail
