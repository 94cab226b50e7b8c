"""Virtual GPU discovery and device-node selection."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from corral.engine.gpus import NVIDIA_MAJOR, NVIDIACTL_MINOR, device_paths, discover_gpus


def test_virtual_gpus_have_stable_uuids_and_standin_devices(tmp_path: Path) -> None:
    inv = discover_gpus("node-a", tmp_path, virtual_gpus=4, gpu_model="A100")
    assert inv.virtual and [g.uuid for g in inv.gpus] == [f"GPU-virt-node-a-{i}" for i in range(4)]
    assert {g.model for g in inv.gpus} == {"A100"}
    again = discover_gpus("node-a", tmp_path, virtual_gpus=4, gpu_model="A100")
    assert again.gpus == inv.gpus
    names = sorted(os.listdir(tmp_path / "dev"))
    assert names == ["nvidia-uvm", "nvidia0", "nvidia1", "nvidia2", "nvidia3", "nvidiactl"]
    st = os.stat(tmp_path / "dev" / "nvidia2")
    if os.geteuid() == 0:  # mknod needs root; CI runs as root
        assert stat.S_ISCHR(st.st_mode)
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (NVIDIA_MAJOR, 2)


def test_device_paths_hold_only_the_allocated_gpus(tmp_path: Path) -> None:
    inv = discover_gpus("n", tmp_path, virtual_gpus=4)
    nodes = device_paths((inv.gpus[1], inv.gpus[3]), inv)
    assert [n.sandbox_path for n in nodes] == [
        "/dev/nvidia1",
        "/dev/nvidia3",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
    ]
    assert (nodes[2].major, nodes[2].minor) == (NVIDIA_MAJOR, NVIDIACTL_MINOR)
    assert all(n.host_path.startswith(str(tmp_path / "dev")) for n in nodes)
    assert device_paths((), inv) == []


def test_no_nvml_means_no_gpus(tmp_path: Path) -> None:
    inv = discover_gpus("n", tmp_path, virtual_gpus=None)
    if inv.message:  # this machine has no NVIDIA driver
        assert inv.gpus == () and "NVML" in inv.message


def test_negative_virtual_gpus_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="virtual_gpus must be >= 0"):
        discover_gpus("n", tmp_path, virtual_gpus=-1)
