"""Job spec v1 parsing: sizes, durations, shorthand, limits (no database needed)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.spec import ValidationError, parse_duration_s, parse_memory_mib, parse_spec


@pytest.mark.parametrize(
    ("text", "mib"),
    [
        ("64GiB", 65536),
        ("512MiB", 512),
        ("2G", 2048),
        ("1.5GiB", 1536),
        ("1TiB", 1 << 20),
        (2048, 2048),
        ("1048576KiB", 1024),
    ],
)
def test_memory_sizes(text: str | int, mib: int) -> None:
    assert parse_memory_mib(text) == mib


@pytest.mark.parametrize("bad", ["lots", "12XB", "-1GiB", "", True, "0.5KiB"])
def test_bad_memory_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_memory_mib(bad)


@given(st.integers(min_value=1, max_value=60_000), st.sampled_from(["MiB", "GiB", "Mi", "G"]))
def test_memory_units_scale(n: int, unit: str) -> None:
    factor = 1024 if unit.startswith("G") else 1
    assert parse_memory_mib(f"{n}{unit}") == n * factor


@pytest.mark.parametrize(
    ("text", "seconds"), [("6h", 21600), ("90s", 90), ("30m", 1800), ("1d", 86400), ("1h30m", 5400), (45, 45)]
)
def test_durations(text: str | int, seconds: float) -> None:
    assert parse_duration_s(text) == seconds


@given(st.floats(min_value=0.001, max_value=3650 * 86400.0), st.booleans())
def test_a_stored_duration_reads_back_as_itself(seconds: float, as_sum: bool) -> None:
    """Whatever duration a spec gives, its stored form parses back to it (found by fuzzing:
    1,000,000 s given as a sum of units was stored as "1e+06s", which the parser refused, and
    every listing of that job was a 500)."""
    given_as = f"{seconds / 2}s {seconds / 2}s" if as_sum else seconds
    stored = parse_spec({"name": "t", "command": "true", "max_runtime": given_as}).max_runtime
    assert stored is not None and "e" not in stored
    assert parse_duration_s(stored) == pytest.approx(seconds, rel=1e-9, abs=1e-6)


def test_single_task_shorthand_and_stored_forms() -> None:
    spec = parse_spec(
        "name: t\ncommand: python x.py\ninstances: 2\nresources: {gpus: 1, memory: 1GiB}\n"
        "max_runtime: 1h30m\nstop_grace: 20s\n"
    )
    assert list(spec.tasks) == ["main"]
    assert spec.tasks["main"].instances == 2 and spec.total_gpus == 2
    assert spec.max_runtime == "5400s"  # compound durations are stored as one number and unit
    assert spec.max_runtime_s == 5400
    (task,) = spec.task_specs()
    assert task.resources.memory_mib == 1024 and task.resources.gpus == 1


def test_gpu_model_alternatives() -> None:
    spec = parse_spec(
        {"name": "t", "command": "x", "resources": {"gpus": 1, "gpu_model": "V100M16 | V100M32"}}
    )
    (task,) = spec.task_specs()
    assert task.resources.gpu_models == frozenset({"V100M16", "V100M32"})
    with pytest.raises(ValidationError):
        parse_spec({"name": "t", "command": "x", "resources": {"gpu_model": "A100|"}})


def test_mounts_name_exactly_one_source() -> None:
    # The old form is read as the new one (corral.storage serves `source`).
    assert (
        parse_spec({"name": "t", "command": "x", "mounts": [{"dataset": "cifar10"}]}).mounts[0].source
        == "data/cifar10"
    )
    with pytest.raises(ValidationError, match=r"source: \.\.\., target"):
        parse_spec({"name": "t", "command": "x", "mounts": [{"dataset": "a", "group_storage": "b"}]})
