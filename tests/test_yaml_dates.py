"""A YAML date that does not exist (`2026-13-02`, `2026-02-30`, hour 25) is an error naming its
line wherever Corral reads YAML. PyYAML raises a bare ValueError for it, not a YAMLError, so every
reader that caught YAMLError let it through: `corral submit` of a spec with `env: {A: 2026-13-02}`
and `corral rules apply` of such a file answered 500 Internal Server Error, and `corral oncall
schedule set` with `start_date: 2026-13-02` printed a traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from corral.cli.oncall import read_yaml
from corral.diagnosis.exitspec import parse_exit_spec
from corral.monitor.config import load_monitor_config
from corral.sdk import CorralError
from corral.services.remediation_rules import parse_rules
from corral.spec import load_spec_text
from corral.yaml_lines import safe_load

BAD_DATES = ["2026-13-02", "2026-02-30", "2026-11-02 25:00:00"]


@pytest.mark.parametrize("bad", BAD_DATES)
def test_safe_load_names_the_line_of_a_date_that_does_not_exist(bad: str) -> None:
    with pytest.raises(yaml.YAMLError) as caught:
        safe_load(f"a: 1\nb: {bad}\n")
    assert caught.value.problem_mark is not None and caught.value.problem_mark.line == 1  # type: ignore[attr-defined]
    assert f"'{bad}' is not a valid date or time" in str(caught.value)
    assert safe_load("d: 2026-11-02") == yaml.safe_load("d: 2026-11-02")  # real dates as before


def _spec(text: str, _tmp: Path) -> Any:
    return load_spec_text(text)


def _rules(text: str, _tmp: Path) -> Any:
    return parse_rules(text)


def _exit_spec(text: str, _tmp: Path) -> Any:
    return parse_exit_spec(text, "exit_spec.yaml")


def _monitor(text: str, tmp: Path) -> Any:
    (tmp / "monitor.yml").write_text(text)
    return load_monitor_config(tmp / "monitor.yml")


def _schedule(text: str, tmp: Path) -> Any:
    (tmp / "s.yaml").write_text(text)
    return read_yaml(tmp / "s.yaml")


@pytest.mark.parametrize(
    ("reader", "text", "expected"),
    [
        (_spec, "name: t\nenv: {A: 2026-13-02}\n", "the spec is not valid YAML at line 2"),
        (_rules, "version: 1\nrules: []\nx: 2026-13-02\n", "line 3: not valid YAML"),
        (_exit_spec, "version: 1\nrules: []\nx: 2026-13-02\n", "exit_spec.yaml:3: not valid YAML"),
        (_monitor, "retry: {}\nx: 2026-13-02\n", "monitor.yml:2: not valid YAML"),
        (_schedule, "time_zone: UTC\nlayers:\n  - {start_date: 2026-13-02}\n", "s.yaml: not YAML"),
    ],
)
def test_each_reader_refuses_it_with_its_own_error(
    reader: Callable[[str, Path], Any], text: str, expected: str, tmp_path: Path
) -> None:
    with pytest.raises((ValueError, CorralError)) as caught:
        reader(text, tmp_path)
    assert expected in str(caught.value) and "2026-13-02" in str(caught.value), caught.value
    assert not isinstance(caught.value, ValueError) or type(caught.value) is not ValueError
