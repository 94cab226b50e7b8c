"""A server restarted on another port re-points its home's CLI config (same token), unless the
admin set the URL to another host by hand."""

from __future__ import annotations

import stat
from pathlib import Path

import yaml

from corral.config import Settings
from corral.sdk import write_cli_config
from corral.server.run import refresh_cli_config_url


def settings_at(home: Path) -> Settings:
    return Settings(home=home)


def test_a_restart_on_another_port_rewrites_the_loopback_url_and_keeps_the_token(tmp_path: Path) -> None:
    write_cli_config("http://127.0.0.1:8769", "tok-1", home=tmp_path)
    refresh_cli_config_url(settings_at(tmp_path), "http://127.0.0.1:8770")
    path = tmp_path / "config.yaml"
    assert yaml.safe_load(path.read_text()) == {"url": "http://127.0.0.1:8770", "token": "tok-1"}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_hand_set_url_of_another_host_is_left_alone(tmp_path: Path) -> None:
    write_cli_config("https://corral.example.org", "tok-2", home=tmp_path)
    refresh_cli_config_url(settings_at(tmp_path), "http://127.0.0.1:8770")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["url"] == "https://corral.example.org"


def test_no_config_no_file(tmp_path: Path) -> None:
    refresh_cli_config_url(settings_at(tmp_path), "http://127.0.0.1:8770")
    assert not (tmp_path / "config.yaml").exists()


def test_a_url_that_is_none_is_left_alone_not_a_crash_at_start_up(tmp_path: Path) -> None:
    """review128 #6: `urlsplit` raises on `http://[::1`; the restart left a traceback."""
    write_cli_config("http://[::1", "tok-3", home=tmp_path)
    refresh_cli_config_url(settings_at(tmp_path), "http://127.0.0.1:8770")
    assert yaml.safe_load((tmp_path / "config.yaml").read_text())["url"] == "http://[::1"
