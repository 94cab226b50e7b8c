"""cgroupfs against fake cgroup trees (v2 and v1 layouts in a temp dir): the limits land in the
right files, OOM is read from the kernel's own counters. The real v1 tree is exercised by
tests/isolation; a v2 machine runs the same code through the engine."""

from __future__ import annotations

from pathlib import Path

import pytest

from corral.engine.isolation import cgroupfs


def fake_v2(root: Path) -> Path:
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory hugetlb pids rdma misc\n")
    (root / "cgroup.subtree_control").write_text("")
    return root


def fake_v1(root: Path) -> Path:
    for controller in ("memory", "cpu", "pids", "devices"):
        (root / controller).mkdir(parents=True)
        (root / controller / "cgroup.procs").write_text("")
    (root / "devices" / "devices.allow").write_text("")
    return root


def test_detects_v2(tmp_path: Path) -> None:
    assert cgroupfs.detect_version(fake_v2(tmp_path / "cg")) == 2


def test_v2_without_needed_controllers_is_unusable(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    (root / "cgroup.controllers").write_text("cpu io\n")
    assert cgroupfs.detect_version(root) is None


def test_detects_v1_and_nothing(tmp_path: Path) -> None:
    assert cgroupfs.detect_version(fake_v1(tmp_path / "v1")) == 1
    assert cgroupfs.v1_has_devices(tmp_path / "v1")
    (tmp_path / "empty").mkdir()
    assert cgroupfs.detect_version(tmp_path / "empty") is None


def test_v2_limits_and_controller_delegation(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    cg = cgroupfs.create_instance_cgroup(root, 2, "corral", "42.1/0", memory_mib=512, cpus=1.5, pids_max=100)
    leaf = root / "corral" / "42.1" / "0"
    assert cg["dirs"] == [str(leaf)] and cg["kill_file"] == str(leaf / "cgroup.kill")
    assert (leaf / "memory.max").read_text() == str(512 << 20)
    assert (leaf / "memory.swap.max").read_text() == "0"
    assert (leaf / "cpu.max").read_text() == "150000 100000"
    assert (leaf / "pids.max").read_text() == "100"
    for level in (root, root / "corral", root / "corral" / "42.1"):
        assert (level / "cgroup.subtree_control").read_text() == "+memory +cpu +pids"


def test_v2_oom_from_memory_events(tmp_path: Path) -> None:
    root = fake_v2(tmp_path / "cg")
    cg = cgroupfs.create_instance_cgroup(root, 2, "corral", "1.1/0", 64, None, None)
    leaf = Path(cg["memory_dir"])
    (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 12\noom 1\noom_kill 0\n")
    assert cgroupfs.oom_kills(cg) == 0  # hitting the limit is not an OOM kill
    (leaf / "memory.events").write_text("low 0\nhigh 0\nmax 40\noom 3\noom_kill 2\noom_group_kill 0\n")
    assert cgroupfs.oom_kills(cg) == 2


def test_v1_limits_devices_and_oom(tmp_path: Path) -> None:
    root = fake_v1(tmp_path / "v1")
    cg = cgroupfs.create_instance_cgroup(root, 1, "corral", "7.2/1", 256, 0.5, 64, [(195, 3), (195, 255)])
    mem = root / "memory" / "corral" / "7.2" / "1"
    assert (mem / "memory.limit_in_bytes").read_text() == str(256 << 20)
    # Fractional CPUs: a 1 s period, so the quota allows the sandbox to start without throttling.
    assert (root / "cpu" / "corral" / "7.2" / "1" / "cpu.cfs_quota_us").read_text() == "500000"
    assert (root / "cpu" / "corral" / "7.2" / "1" / "cpu.cfs_period_us").read_text() == "1000000"
    assert (root / "pids" / "corral" / "7.2" / "1" / "pids.max").read_text() == "64"
    # A fake tree keeps only the last write per file; the real kernel accumulates the rules.
    assert (root / "devices" / "corral" / "7.2" / "1" / "devices.allow").read_text() == "c 195:255 rw"
    assert (root / "devices" / "corral" / "7.2" / "1" / "devices.deny").read_text() == "a"
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n")
    assert cgroupfs.oom_kills(cg) == 1
    (mem / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\n")  # kernel < 4.13
    (mem / "memory.failcnt").write_text("5\n")
    assert cgroupfs.oom_kills(cg) == 5


def test_v1_leaves_the_default_cpu_period_unwritten(tmp_path: Path) -> None:
    """A whole-CPU limit keeps the kernel's 100 ms period: writing it again was one more file
    opened and written per instance start."""
    root = fake_v1(tmp_path / "v1")
    cgroupfs.create_instance_cgroup(root, 1, "corral", "9.1/0", None, 2.0, None)
    cpu = root / "cpu" / "corral" / "9.1" / "0"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "200000"
    assert not (cpu / "cpu.cfs_period_us").exists()


def test_v1_without_devices_rules_skips_the_devices_controller(tmp_path: Path) -> None:
    root = fake_v1(tmp_path / "v1")
    cg = cgroupfs.create_instance_cgroup(root, 1, "corral", "8.1/0", None, None, None)
    assert not any("/devices/" in d for d in cg["dirs"])
    assert not (root / "memory" / "corral" / "8.1" / "0" / "memory.limit_in_bytes").exists()


def test_join_writes_the_pid_everywhere(tmp_path: Path) -> None:
    root = fake_v1(tmp_path / "v1")
    cg = cgroupfs.create_instance_cgroup(root, 1, "corral", "9.1/0", 64, 1, 10, [])
    cgroupfs.join(cg, 4242)
    for d in cg["dirs"]:
        assert (Path(d) / "cgroup.procs").read_text() == "4242"


def test_bad_version_is_named() -> None:
    with pytest.raises(ValueError, match="unsupported cgroup version 3"):
        cgroupfs.create_instance_cgroup("/nonexistent", 3, "corral", "x", None, None, None)
