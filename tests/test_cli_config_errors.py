"""A bad server URL, token or CLI config file is one line naming it and exit code 1, never a
traceback (no server needed: each fails before a request is sent)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from corral.cli import jobs as cli_jobs
from corral.cli.main import app
from corral.sdk import Client


@pytest.mark.parametrize(
    ("env", "config", "expected"),
    [
        ({"CORRAL_URL": "http://[::1", "CORRAL_TOKEN": "t"}, None, "bad Corral server URL 'http://[::1'"),
        ({"CORRAL_URL": "http://h:x", "CORRAL_TOKEN": "t"}, None, "Invalid port: 'x'"),
        ({"CORRAL_TOKEN": "caf\u00e9"}, None, "the API token (CORRAL_TOKEN or"),
        ({"CORRAL_TOKEN": "abc\ndef"}, None, "the API token (CORRAL_TOKEN or"),
        ({}, "url: http://127.0.0.1:1\ntoken: [unclosed\n", "config.yaml is not valid YAML"),
    ],
)
def test_a_bad_url_token_or_config_is_one_line_naming_it(
    tmp_path: Path, env: dict[str, str], config: str | None, expected: str
) -> None:
    if config is not None:
        (tmp_path / "config.yaml").write_text(config)
    full_env = {"CORRAL_HOME": str(tmp_path), "CORRAL_URL": "", "CORRAL_TOKEN": "", **env}
    result = CliRunner().invoke(app, ["ls"], env=full_env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1
    assert "error:" in result.output and expected in " ".join(result.output.split())


@pytest.mark.parametrize(("status", "kind"), [(200, "text/html"), (404, "text/html"), (200, "text/plain")])
def test_a_server_that_is_not_the_api_is_named(
    monkeypatch: pytest.MonkeyPatch, status: int, kind: str
) -> None:
    # CORRAL_URL=http://host:8080/jobs (the portal's address): the portal answered its HTML shell
    # with 200 and `corral ls` died in a KeyError; a proxy's HTML error page was printed whole.
    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(
            status, text="<!doctype html><html>portal</html>", headers={"content-type": kind}
        )

    transport = httpx.MockTransport(answer)
    monkeypatch.setattr(
        cli_jobs, "client", lambda: Client("http://corral.test/jobs", "t", transport=transport)
    )
    result = CliRunner().invoke(app, ["ls"])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    text = " ".join(result.output.split())
    assert (
        result.exit_code == 1 and "not the Corral API's JSON: is CORRAL_URL (http://corral.test/jobs)" in text
    )
    assert "<html>" not in text


@pytest.mark.parametrize(
    "args", [["group", "quota", "vision", "--cpus-max", "nan"], ["group", "create", "g", "--weight", "inf"]]
)
def test_a_number_json_cannot_carry_is_one_line(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> None:
    from corral.cli import groups as cli_groups

    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.path)
        return httpx.Response(200, json={})

    transport = httpx.MockTransport(answer)
    monkeypatch.setattr(cli_groups, "client", lambda: Client("http://corral.test", "t", transport=transport))
    result = CliRunner().invoke(app, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1 and "nan or infinity, which JSON cannot carry" in " ".join(
        result.output.split()
    )
    assert sent == []


def test_an_error_is_printed_as_written_on_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # The server's message quotes what the user wrote ("[/oops]" is Rich's closing-tag syntax,
    # which raised MarkupError: a traceback) and a path longer than the terminal (which Rich
    # wrapped mid-word, so it could not be copied whole).
    long_path = "/tmp/" + "x" * 150 + "/config.yaml"
    message = f"template 'a[/oops]b' cannot read {long_path}"

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(422, json={"detail": message})

    transport = httpx.MockTransport(answer)
    monkeypatch.setattr(cli_jobs, "client", lambda: Client("http://corral.test", "t", transport=transport))
    result = CliRunner().invoke(app, ["ls"], env={"COLUMNS": "60"})
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert result.exit_code == 1
    assert result.output.splitlines() == [f"error: {message}"]
