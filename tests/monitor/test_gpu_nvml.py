"""The NVML provider (corral.monitor.gpu.NvmlGpuProvider) on a fake pynvml: no GPU needed."""

from __future__ import annotations

import sys
import time
import types
from dataclasses import dataclass, field

import pytest
from sqlalchemy import select, update

from corral.db.models import Gpu
from corral.monitor.config import HealthRules
from corral.monitor.gpu import LOST_AFTER_FAILED_READS, GpuRef, GpuSampler, NvmlGpuProvider
from corral.monitor.health import sample_and_check_gpus
from corral.monitor.models import Alert, GpuReading
from tests.monitor.conftest import Mon


class NVMLError(Exception):
    pass


@dataclass
class FakeNvml:
    """Just what NvmlGpuProvider calls: one GPU whose ECC counts and Xid events the test sets, and
    which stops answering while `lost`."""

    uncorrected: int = 0
    corrected: int = 0
    xids: list[int] = field(default_factory=list)
    lost: bool = False

    def module(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        values = {
            "NVMLError": NVMLError, "NVML_TEMPERATURE_GPU": 0, "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
            "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1, "NVML_VOLATILE_ECC": 0, "NVML_AGGREGATE_ECC": 1,
            "nvmlEventTypeXidCriticalError": 8, "nvmlInit": lambda: None, "nvmlShutdown": lambda: None,
            "nvmlEventSetCreate": lambda: "events", "nvmlDeviceGetCount": lambda: 1,
            "nvmlDeviceGetHandleByIndex": lambda i: "gpu0", "nvmlDeviceRegisterEvents": lambda *a: None,
            "nvmlEventSetWait_v2": self._wait, "nvmlDeviceGetUUID": lambda handle: b"GPU-real-0",
            "nvmlDeviceGetHandleByUUID": self._handle, "nvmlDeviceGetPowerUsage": lambda h: 100_000,
            "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=50),
            "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(used=1 << 30, total=80 << 30),
            "nvmlDeviceGetTemperature": lambda h, sensor: 40, "nvmlDeviceGetTotalEccErrors": self._ecc,
        }  # fmt: skip
        for name, value in values.items():
            setattr(m, name, value)
        return m

    def _wait(self, events: str, timeout_ms: int) -> types.SimpleNamespace:
        if not self.xids:
            raise NVMLError("timeout")
        return types.SimpleNamespace(device="gpu0", eventData=self.xids.pop(0))

    def _handle(self, uuid: str) -> str:
        if self.lost:
            raise NVMLError("GPU is lost")
        return "gpu0"

    def _ecc(self, handle: str, error_type: int, counter: int) -> int:
        return self.uncorrected if error_type == 1 else self.corrected


def test_a_gpu_that_stops_answering_keeps_its_ecc_and_xid_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU that does not answer NVML was sampled with every counter at zero: the stored ECC
    and Xid counts went backwards (corral_gpu_xid_events_total is a counter), and when the GPU
    answered again its old errors read as new ones (CorralGpuXid, the diagnosis watch's
    GpuFault). Now it is present=0 with its counts as last known."""
    fake = FakeNvml(uncorrected=2, corrected=5, xids=[79])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    provider = NvmlGpuProvider()
    ref = GpuRef("n1", 0, "GPU-real-0", 81920)
    (before,) = provider.sample([ref])
    assert before.present and before.xid_events_total == 1 and before.ecc_volatile_uncorrected == 2
    fake.lost = True
    for _ in range(LOST_AFTER_FAILED_READS):
        (lost,) = provider.sample([ref])
    assert not lost.present
    counts = ("ecc_volatile_uncorrected", "ecc_volatile_corrected", "ecc_aggregate_uncorrected",
              "ecc_aggregate_corrected", "xid_events_total", "last_xid")  # fmt: skip
    assert {c: getattr(lost, c) for c in counts} == {c: getattr(before, c) for c in counts}
    assert lost.utilization_percent == 0.0 and lost.temperature_c == 0.0  # no readings
    fake.lost = False
    (back,) = provider.sample([ref])
    assert back.present and back.xid_events_total == 1 and back.ecc_volatile_uncorrected == 2


def test_a_gpu_is_lost_only_after_several_failed_reads_in_a_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """One transient NVML error marked the GPU lost at once (CorralGpuLost, the diagnosis
    watch's GpuFault, the remediation rules stopping its job). Now it reads as lost only after
    LOST_AFTER_FAILED_READS failed reads in a row, and one good read starts the count again."""
    assert LOST_AFTER_FAILED_READS == 3
    fake = FakeNvml(uncorrected=1)
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    provider = NvmlGpuProvider()
    ref = GpuRef("n1", 0, "GPU-real-0", 81920)
    (good,) = provider.sample([ref])
    present = []
    for lost in (True, True, False, True, True, True, False):
        fake.lost = lost
        (sample,) = provider.sample([ref])
        present.append(sample.present)
    assert present == [True, True, True, True, True, False, True]
    fake.lost, fake.xids = True, [48]  # while held: its last readings, with the Xids that came
    (held,) = provider.sample([ref])
    assert held.present and held.utilization_percent == good.utilization_percent == 50.0
    assert (held.xid_events_total, held.last_xid, held.ecc_volatile_uncorrected) == (1, 48, 1)


def test_an_xid_before_the_first_sample_after_a_restart_is_not_missed(
    mon: Mon, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The NVML provider counted Xids from 0 in each process, while the health check and the
    diagnosis watch compare with the stored count: after a restart, an Xid reported before (or
    after) the first sample read as fewer events than before (2 stored, 1 counted) and raised
    nothing until the new count passed the old one. Now the count goes on from the stored one."""
    fake = FakeNvml(xids=[79, 79])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())
    with mon.factory() as db:
        gpu = db.scalars(select(Gpu).order_by(Gpu.node_name, Gpu.index)).first()
        assert gpu is not None
        node, index = gpu.node_name, gpu.index
        db.execute(update(Gpu).where(Gpu.node_name == node, Gpu.index == index).values(uuid="GPU-real-0"))
        db.commit()
    rules = HealthRules(xid_alert_hold=60.0)

    def tick(sampler: GpuSampler, at: float) -> tuple[int, list[str]]:
        with mon.factory() as db:
            sample_and_check_gpus(db, sampler, at, [], rules)
            reading = db.get(GpuReading, (node, index))
            assert reading is not None
            xid = select(Alert.status).where(Alert.name == "CorralGpuXid", Alert.source == "corral")
            return reading.xid_events_total, list(db.scalars(xid))

    now = time.time()
    before = GpuSampler(mon.home, node)
    assert tick(before, now) == (2, ["firing"])
    assert tick(before, now + 120) == (2, ["resolved"])  # held for 60 s
    fake.xids = [48]  # the server restarts; the Xid comes before its first sample
    assert tick(GpuSampler(mon.home, node), now + 130) == (3, ["firing"])
