"""`--files` of `corral group quota` and `corral storage quota`: a value that is not a whole
number of files is refused naming the option and what to write, before any request (the
server is not even asked: the URL below answers nothing). It said "invalid literal for int()
with base 10: 'abc'", and a negative count came back from the API as "max_files: ..."."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from corral.cli.main import app as cli
from tests.support import free_port


@pytest.mark.parametrize("command", [["group", "quota", "vision"], ["storage", "quota", "group", "vision"]])
@pytest.mark.parametrize("value", ["abc", "1.5", "-3", ""])
def test_a_bad_file_count_is_refused_by_its_option(command: list[str], value: str) -> None:
    env = {"CORRAL_URL": f"http://127.0.0.1:{free_port()}", "CORRAL_TOKEN": "unused"}
    result = CliRunner().invoke(cli, [*command, "--files", value], env=env)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.replace("│", " ").split())
    assert (
        f"--files '{value}' is not a number of files: write a whole number such as 1000000, or none" in text
    )
