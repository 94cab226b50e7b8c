"""GPU readings: NVML (nvidia-ml-py) for real GPUs, a virtual provider for declared virtual GPUs.

Both produce `GpuSample`s that the sampling loop stores in `gpu_readings`; health checks and
/metrics never care which provider a reading came from. The virtual provider's readings come from
a fault file under CORRAL_HOME (`chaos/gpu_faults.json`) that tests and `corral chaos gpu ...`
write, so a separate CLI process can inject faults into a running server: raise the temperature,
inject ECC errors or an Xid, make a GPU disappear, set its utilization. Gradual faults are stored as
a rate and a start time and evaluated at each sample (`fault_reading`): a temperature climbing at
a rate, correctable ECC errors creeping up at a rate, a GPU that flaps (drops out for `flap_down_s`
every `flap_period_s`). bench/anomaly_eval.py drives the same model in memory (`merge_fault`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

VIRTUAL_UUID_PREFIX = "GPU-virt-"  # corral.engine.gpus.virtual_gpu_uuid
IDLE_TEMPERATURE_C = 35.0
IDLE_POWER_W = 45.0
FAULT_FIELDS = {
    "temperature_c": float,
    "utilization_percent": float,
    "memory_used_mib": float,
    "power_w": float,
    "lost": bool,
    # gradual faults (see fault_reading): rates per second, from the moment they were set
    "temperature_ramp_c_per_s": float,
    "ecc_corrected_per_s": float,
    "flap_period_s": float,
    "flap_down_s": float,
}
# When a rate field is set, merge_fault stamps this companion field with the current time.
RATE_STARTS = {
    "temperature_ramp_c_per_s": "temperature_ramp_since",
    "ecc_corrected_per_s": "ecc_corrected_since",
    "flap_period_s": "flap_since",
}
NON_NEGATIVE = {*RATE_STARTS, "flap_down_s"}
# A real GPU reads as lost (present=False) only after this many consecutive NVML reads failed
# (10 s at the default 5 s sampling interval): one transient NVML error must not take a GPU out
# (CorralGpuLost, the diagnosis watch's GpuFault, remediation). One good read resets the count.
LOST_AFTER_FAILED_READS = 3


@dataclass(frozen=True, slots=True)
class GpuRef:
    """A GPU the database knows: where it is and what it is."""

    node: str
    index: int
    uuid: str
    memory_mib: int
    # Its stored reading's Xid count and last Xid (same uuid): a restarted server's NVML provider
    # counts on from there (its event set only knows the events since it started).
    xid_events_total: int = 0
    last_xid: int | None = None


@dataclass(frozen=True, slots=True)
class GpuSample:
    node: str
    index: int
    uuid: str
    present: bool
    utilization_percent: float = 0.0
    memory_used_mib: float = 0.0
    memory_total_mib: float = 0.0
    temperature_c: float = 0.0
    power_w: float = 0.0
    ecc_volatile_corrected: int = 0
    ecc_volatile_uncorrected: int = 0
    ecc_aggregate_corrected: int = 0
    ecc_aggregate_uncorrected: int = 0
    xid_events_total: int = 0
    last_xid: int | None = None


class GpuProvider(Protocol):
    def sample(self, gpus: Sequence[GpuRef]) -> list[GpuSample]: ...


def is_virtual(ref: GpuRef) -> bool:
    return ref.uuid.startswith(VIRTUAL_UUID_PREFIX)


def sampled_by_server(node: str, uuid: str, local_node: str) -> bool:
    """Whether the GpuSampler of a server on `local_node` samples this GPU: a virtual one (its
    fault file) or one of that node (NVML; when NVML fails to start it is still this sampler's,
    unsampled for a fault, not for want of a sampler). A GPU of another node (Slurm's) is not."""
    return uuid.startswith(VIRTUAL_UUID_PREFIX) or node == local_node


# ---------------------------------------------------------------- fault file (chaos)


def faults_path(home: Path) -> Path:
    return home / "chaos" / "gpu_faults.json"


def gpu_key(node: str, index: int) -> str:
    return f"{node}/{index}"


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def read_faults(home: Path) -> dict[str, dict[str, Any]]:
    path = faults_path(home)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable GPU fault file %s: %s", path, exc)
        return {}
    return data if isinstance(data, dict) else {}


def update_fault(home: Path, node: str, index: int, **changes: Any) -> dict[str, Any]:
    """Merge `changes` into the fault entry of one GPU, atomically (lock + rename); see
    `merge_fault` for what the keys do."""
    path = faults_path(home)
    with _locked(path):
        faults = read_faults(home)
        entry = merge_fault(faults.get(gpu_key(node, index), {}), time.time(), **changes)
        faults[gpu_key(node, index)] = entry
        tmp = path.with_suffix(f".tmp.{os.getpid()}")
        tmp.write_text(json.dumps(faults, indent=1, sort_keys=True))
        tmp.replace(path)
        return entry


def merge_fault(current: dict[str, Any], now: float, **changes: Any) -> dict[str, Any]:
    """A new fault entry: `current` with `changes` applied (pure; `current` is not modified).
    Special keys: `ecc_uncorrected` / `ecc_corrected` add errors (volatile and aggregate), `xid`
    appends an event, `clear=True` resets everything a GPU reset clears (aggregate ECC and Xid
    history stay; correctable errors a creep already produced are kept as counts). Setting a rate
    (`temperature_ramp_c_per_s`, `ecc_corrected_per_s`, `flap_period_s`) starts it at `now`; 0 or
    None stops it. A bad value raises ValueError naming the field; nothing is applied then."""
    entry = dict(current)
    if changes.pop("clear", False):
        _settle_ecc_creep(entry, now)
        kept = ("ecc_aggregate_corrected", "ecc_aggregate_uncorrected", "xids")
        entry = {k: v for k, v in entry.items() if k in kept}
    for kind in ("corrected", "uncorrected"):
        added = int(changes.pop(f"ecc_{kind}", 0))
        if added < 0:
            raise ValueError(f"ECC error count must be >= 0, got {added}")
        if added:
            entry[f"ecc_volatile_{kind}"] = int(entry.get(f"ecc_volatile_{kind}", 0)) + added
            entry[f"ecc_aggregate_{kind}"] = int(entry.get(f"ecc_aggregate_{kind}", 0)) + added
    xid = changes.pop("xid", None)
    if xid is not None:
        entry["xids"] = [*entry.get("xids", []), {"xid": int(xid), "at": now}]
    for name, value in changes.items():
        if name not in FAULT_FIELDS:
            raise ValueError(f"unknown GPU fault {name!r}; known: {', '.join(sorted(FAULT_FIELDS))}")
        if value is not None and name in NON_NEGATIVE and float(value) < 0:
            raise ValueError(f"GPU fault {name} must be >= 0, got {value}")
        if name == "ecc_corrected_per_s":
            _settle_ecc_creep(entry, now)  # errors the old rate produced stay counted
        if value is None or (name in RATE_STARTS and not float(value)):
            entry.pop(name, None)
            entry.pop(RATE_STARTS.get(name, ""), None)
            continue
        entry[name] = FAULT_FIELDS[name](value)
        if name in RATE_STARTS:
            entry[RATE_STARTS[name]] = now
    return entry


def _settle_ecc_creep(entry: dict[str, Any], now: float) -> None:
    """Turn the errors an ECC creep has produced so far into plain counts and restart it at `now`."""
    rate = float(entry.get("ecc_corrected_per_s", 0.0))
    if not rate:
        return
    crept = _crept_errors(entry, now)
    for counter in ("volatile", "aggregate"):
        entry[f"ecc_{counter}_corrected"] = int(entry.get(f"ecc_{counter}_corrected", 0)) + crept
    entry["ecc_corrected_since"] = now


def _crept_errors(fault: dict[str, Any], now: float) -> int:
    rate = float(fault.get("ecc_corrected_per_s", 0.0))
    since = float(fault.get("ecc_corrected_since", now))
    return int(rate * max(0.0, now - since))


def _flapped_out(fault: dict[str, Any], now: float) -> bool:
    """A flapping GPU is out for the last `flap_down_s` of every `flap_period_s`."""
    period = float(fault.get("flap_period_s", 0.0))
    if period <= 0:
        return False
    phase = (now - float(fault.get("flap_since", now))) % period
    return phase >= period - min(period, float(fault.get("flap_down_s", 10.0)))


def fault_reading(ref: GpuRef, fault: dict[str, Any], now: float) -> GpuSample:
    """What a virtual GPU reports at `now` given its fault entry (idle defaults otherwise)."""
    util = float(fault.get("utilization_percent", 0.0))
    xids = fault.get("xids") or []
    temperature = float(fault.get("temperature_c", IDLE_TEMPERATURE_C + util * 0.4))
    ramp = float(fault.get("temperature_ramp_c_per_s", 0.0))
    if ramp:
        temperature += ramp * max(0.0, now - float(fault.get("temperature_ramp_since", now)))
    crept = _crept_errors(fault, now)
    return GpuSample(
        node=ref.node,
        index=ref.index,
        uuid=ref.uuid,
        present=not fault.get("lost", False) and not _flapped_out(fault, now),
        utilization_percent=util,
        memory_used_mib=float(fault.get("memory_used_mib", ref.memory_mib * util / 200.0)),
        memory_total_mib=float(ref.memory_mib),
        temperature_c=temperature,
        power_w=float(fault.get("power_w", IDLE_POWER_W + util * 2.5)),
        ecc_volatile_corrected=int(fault.get("ecc_volatile_corrected", 0)) + crept,
        ecc_volatile_uncorrected=int(fault.get("ecc_volatile_uncorrected", 0)),
        ecc_aggregate_corrected=int(fault.get("ecc_aggregate_corrected", 0)) + crept,
        ecc_aggregate_uncorrected=int(fault.get("ecc_aggregate_uncorrected", 0)),
        xid_events_total=len(xids),
        last_xid=int(xids[-1]["xid"]) if xids else None,
    )


class VirtualGpuProvider:
    """Readings for virtual GPUs: idle defaults, overridden by the fault file."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def sample(self, gpus: Sequence[GpuRef], now: float | None = None) -> list[GpuSample]:
        faults = read_faults(self.home)
        at = time.time() if now is None else now
        return [fault_reading(ref, faults.get(gpu_key(ref.node, ref.index), {}), at) for ref in gpus]


class NvmlGpuProvider:
    """Readings of this machine's GPUs through NVML. Xid events are collected with an NVML event
    set polled without waiting on every sample; counts are kept for the life of the process. A
    GPU reads as lost after LOST_AFTER_FAILED_READS failed reads in a row, not at the first."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._xids: dict[str, list[int]] = {}
        self._xids_before: dict[str, tuple[int, int | None]] = {}  # uuid -> count, last at first sight
        self._last: dict[str, GpuSample] = {}  # uuid -> its last answered sample
        self._failed_reads: dict[str, int] = {}  # uuid -> NVML reads failed in a row
        self._events: Any = None
        try:
            self._events = pynvml.nvmlEventSetCreate()
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlDeviceRegisterEvents(
                        handle, pynvml.nvmlEventTypeXidCriticalError, self._events
                    )
        except pynvml.NVMLError as exc:
            log.info("NVML Xid events unavailable: %s", exc)
            self._events = None

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._nvml.nvmlShutdown()

    def _drain_xids(self) -> None:
        if self._events is None:
            return
        nvml = self._nvml
        while True:
            try:
                event = nvml.nvmlEventSetWait_v2(self._events, 0)
            except nvml.NVMLError:
                return  # timeout: no more events
            uuid = nvml.nvmlDeviceGetUUID(event.device)
            self._xids.setdefault(uuid.decode() if isinstance(uuid, bytes) else str(uuid), []).append(
                int(event.eventData)
            )

    def sample(self, gpus: Sequence[GpuRef]) -> list[GpuSample]:
        for ref in gpus:
            # The count stored before this process started: the Xid counter goes on from it, so
            # that an Xid reported before (or at) this process's first sample reads as new to the
            # health checks and the diagnosis watch, which compare with the stored count.
            self._xids_before.setdefault(ref.uuid, (ref.xid_events_total, ref.last_xid))
        self._drain_xids()
        return [self._one(ref) for ref in gpus]

    def _xid_counts(self, uuid: str) -> tuple[int, int | None]:
        """(Xid events in all, the last one's code): the stored ones, then this process's."""
        before, last = self._xids_before.get(uuid, (0, None))
        xids = self._xids.get(uuid, [])
        return before + len(xids), xids[-1] if xids else last

    def _one(self, ref: GpuRef) -> GpuSample:
        nvml = self._nvml
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(ref.uuid)
            util = nvml.nvmlDeviceGetUtilizationRates(handle)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            temperature = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            power_mw = self._optional(nvml.nvmlDeviceGetPowerUsage, handle)
        except nvml.NVMLError as exc:  # GPU lost, fell off the bus, driver gone, or a transient error
            failed = self._failed_reads[ref.uuid] = self._failed_reads.get(ref.uuid, 0) + 1
            if failed < LOST_AFTER_FAILED_READS:
                log.info("GPU %s on %s did not answer NVML (%d of %d reads before it counts as lost): %s",
                         ref.index, ref.node, failed, LOST_AFTER_FAILED_READS, exc)  # fmt: skip
                return self._held(ref)
            log.warning("GPU %s on %s does not answer NVML: %s", ref.index, ref.node, exc)
            return self._unanswered(ref)
        self._failed_reads.pop(ref.uuid, None)
        ecc = {
            (counter, kind): self._ecc(handle, counter, kind)
            for counter in ("volatile", "aggregate")
            for kind in ("corrected", "uncorrected")
        }
        xid_events_total, last_xid = self._xid_counts(ref.uuid)
        sample = self._last[ref.uuid] = GpuSample(
            node=ref.node,
            index=ref.index,
            uuid=ref.uuid,
            present=True,
            utilization_percent=float(util.gpu),
            memory_used_mib=memory.used / (1 << 20),
            memory_total_mib=memory.total / (1 << 20),
            temperature_c=float(temperature),
            power_w=(power_mw or 0) / 1000.0,
            ecc_volatile_corrected=ecc[("volatile", "corrected")],
            ecc_volatile_uncorrected=ecc[("volatile", "uncorrected")],
            ecc_aggregate_corrected=ecc[("aggregate", "corrected")],
            ecc_aggregate_uncorrected=ecc[("aggregate", "uncorrected")],
            xid_events_total=xid_events_total,
            last_xid=last_xid,
        )
        return sample

    def _held(self, ref: GpuRef) -> GpuSample:
        """A GPU whose read failed fewer than LOST_AFTER_FAILED_READS times in a row: still
        present, with its last answered readings (none before its first) and its Xids so far."""
        unanswered = self._unanswered(ref)
        last = self._last.get(ref.uuid)
        if last is None:
            return replace(unanswered, present=True)
        return replace(last, xid_events_total=unanswered.xid_events_total, last_xid=unanswered.last_xid)

    def _unanswered(self, ref: GpuRef) -> GpuSample:
        """A GPU that does not answer: no readings, but its ECC and Xid counts as last known.
        Zeros would make the counters go backwards, and the GPU's return read as that many new
        uncorrectable ECC errors and Xids (alerts, a GpuFault from the diagnosis watch)."""
        xid_events_total, last_xid = self._xid_counts(ref.uuid)
        last = self._last.get(ref.uuid)
        return GpuSample(
            node=ref.node,
            index=ref.index,
            uuid=ref.uuid,
            present=False,
            ecc_volatile_corrected=last.ecc_volatile_corrected if last else 0,
            ecc_volatile_uncorrected=last.ecc_volatile_uncorrected if last else 0,
            ecc_aggregate_corrected=last.ecc_aggregate_corrected if last else 0,
            ecc_aggregate_uncorrected=last.ecc_aggregate_uncorrected if last else 0,
            xid_events_total=xid_events_total,
            last_xid=last_xid,
        )

    def _optional(self, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _ecc(self, handle: Any, counter: str, kind: str) -> int:
        nvml = self._nvml
        error_type = (
            nvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
            if kind == "corrected"
            else nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        )
        counter_type = nvml.NVML_VOLATILE_ECC if counter == "volatile" else nvml.NVML_AGGREGATE_ECC
        value = self._optional(nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, counter_type)
        return int(value or 0)  # no ECC support (consumer GPUs): report zero errors


class GpuSampler:
    """Picks the provider per GPU: virtual GPUs (by UUID) read the fault file; GPUs of this node
    read NVML when it initialises; GPUs of other nodes (Slurm) are not sampled from here."""

    def __init__(self, home: Path, local_node: str) -> None:
        self.local_node = local_node
        self.virtual = VirtualGpuProvider(home)
        self._nvml: NvmlGpuProvider | None = None
        self._nvml_failed = False

    def sample(self, gpus: Sequence[GpuRef]) -> list[GpuSample]:
        virtual = [g for g in gpus if is_virtual(g)]
        here = self.local_node
        local_real = [g for g in gpus if not is_virtual(g) and sampled_by_server(g.node, g.uuid, here)]
        samples = self.virtual.sample(virtual)
        if local_real:
            nvml = self._nvml_provider()
            if nvml is not None:
                samples += nvml.sample(local_real)
        return samples

    def _nvml_provider(self) -> NvmlGpuProvider | None:
        if self._nvml is None and not self._nvml_failed:
            try:
                self._nvml = NvmlGpuProvider()
            except Exception as exc:
                log.warning("NVML unavailable; real GPUs of %s are not sampled: %s", self.local_node, exc)
                self._nvml_failed = True
        return self._nvml
