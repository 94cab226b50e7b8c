"""GPU discovery for the local engine: real NVIDIA GPUs through NVML (nvidia-ml-py) when present,
otherwise declared virtual GPUs backed by stand-in device files, so that the device-binding and
devices-cgroup code path of the sandbox runs the same way on a CI machine without a GPU.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from corral.scheduler.types import GPU

log = logging.getLogger(__name__)

NVIDIA_MAJOR = 195  # the NVIDIA driver's fixed character-device major
NVIDIACTL_MINOR = 255
# nvidia-uvm gets a dynamic major from the kernel; stand-ins use one from the dynamic range that
# no driver on a GPU-less machine claims.
VIRTUAL_UVM_MAJOR = 510


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """One character device a job with GPUs needs: where it lies on the host, where the sandbox
    shows it, and its numbers (for the devices cgroup)."""

    host_path: str
    sandbox_path: str
    major: int
    minor: int


@dataclass(frozen=True, slots=True)
class GpuInventory:
    gpus: tuple[GPU, ...]
    dev_dir: Path  # where the device files live: /dev, or <home>/dev for virtual GPUs
    virtual: bool
    uvm_major: int | None = None
    message: str = ""  # why NVML was not used, when it was not


def virtual_gpu_uuid(node: str, index: int) -> str:
    return f"GPU-virt-{node}-{index}"


def discover_gpus(node: str, home: Path, virtual_gpus: int | None, gpu_model: str = "VGPU") -> GpuInventory:
    """Virtual GPUs when `virtual_gpus` is given (even 0), else NVML; no NVML means no GPUs."""
    if virtual_gpus is not None:
        if virtual_gpus < 0:
            raise ValueError(f"virtual_gpus must be >= 0, got {virtual_gpus}")
        return _virtual_inventory(node, home, virtual_gpus, gpu_model)
    try:
        gpus = _nvml_gpus()
    except Exception as exc:  # NVML missing, no driver, no device: a CPU-only node
        return GpuInventory(gpus=(), dev_dir=Path("/dev"), virtual=False, message=f"NVML unavailable: {exc}")
    return GpuInventory(
        gpus=gpus, dev_dir=Path("/dev"), virtual=False, uvm_major=_proc_devices_major("nvidia-uvm")
    )


def _nvml_gpus() -> tuple[GPU, ...]:
    import pynvml

    pynvml.nvmlInit()
    try:
        found: list[GPU] = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
            except pynvml.NVMLError:
                minor = i
            found.append(
                GPU(
                    index=minor,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    model=(name.decode() if isinstance(name, bytes) else str(name)).replace(" ", "-"),
                    memory_mib=int(memory.total) // (1 << 20),
                    topology_group=_numa_node(pynvml, handle),
                )
            )
        return tuple(found)
    finally:
        pynvml.nvmlShutdown()


def _numa_node(pynvml: object, handle: object) -> int | None:
    """GPUs on one NUMA node share a PCIe root: the cheapest topology hint NVML gives."""
    get = getattr(pynvml, "nvmlDeviceGetNumaNodeId", None)
    if get is None:
        return None
    try:
        value = int(get(handle))
    except Exception:
        return None
    return value if value >= 0 else None


def _proc_devices_major(name: str) -> int | None:
    try:
        text = Path("/proc/devices").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] == name and parts[0].isdigit():
            return int(parts[0])
    return None


def _virtual_inventory(node: str, home: Path, count: int, model: str) -> GpuInventory:
    dev_dir = home / "dev"
    make_standin_devices(dev_dir, count)
    gpus = tuple(
        GPU(index=i, uuid=virtual_gpu_uuid(node, i), model=model, memory_mib=16384, topology_group=i // 4)
        for i in range(count)
    )
    return GpuInventory(gpus=gpus, dev_dir=dev_dir, virtual=True, uvm_major=VIRTUAL_UVM_MAJOR)


def make_standin_devices(dev_dir: Path, count: int) -> None:
    """nvidia0..N-1, nvidiactl and nvidia-uvm as real character devices when we may mknod (root),
    plain files otherwise. Opening them gives ENXIO (no driver behind the numbers), but they can be
    bound into a sandbox and allowed or denied by the devices cgroup exactly like real ones."""
    dev_dir.mkdir(parents=True, exist_ok=True)
    wanted = [(f"nvidia{i}", NVIDIA_MAJOR, i) for i in range(count)]
    wanted += [("nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR), ("nvidia-uvm", VIRTUAL_UVM_MAJOR, 0)]
    for name, major, minor in wanted:
        path = dev_dir / name
        if path.exists() or path.is_symlink():
            continue
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        except PermissionError:
            path.touch(mode=0o666)
            log.info("not root: %s is a plain file, not a character device", path)


def device_paths(gpus: Sequence[GPU], inventory: GpuInventory | None = None) -> list[DeviceNode]:
    """The device nodes a job holding `gpus` needs: its /dev/nvidiaN plus the control and UVM
    nodes; nothing when it holds no GPU."""
    if not gpus:
        return []
    dev_dir = inventory.dev_dir if inventory else Path("/dev")
    uvm_major = inventory.uvm_major if inventory else _proc_devices_major("nvidia-uvm")
    nodes = [
        DeviceNode(str(dev_dir / f"nvidia{g.index}"), f"/dev/nvidia{g.index}", NVIDIA_MAJOR, g.index)
        for g in gpus
    ]
    nodes.append(DeviceNode(str(dev_dir / "nvidiactl"), "/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR))
    if uvm_major is not None:
        for name, minor in (("nvidia-uvm", 0), ("nvidia-uvm-tools", 1)):
            if (dev_dir / name).exists():
                nodes.append(DeviceNode(str(dev_dir / name), f"/dev/{name}", uvm_major, minor))
    return [n for n in nodes if os.path.exists(n.host_path)]
