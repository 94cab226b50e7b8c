"""Diagnosis tunables (CORRAL_DIAG_* environment variables); shorter values are for tests."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

HangAction = Literal["notify", "kill", "requeue"]


class DiagnosisSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CORRAL_DIAG_", extra="ignore")

    exit_spec_file: Path | None = None  # admin rules over the shipped exit-spec
    log_tail_kib: int = Field(default=64, ge=1, le=16384)  # how much of a log the exit-spec reads
    interval_s: float = Field(default=10.0, gt=0)  # the watch loop: GPU faults, hangs, bad nodes
    # Hang: all ranks alive, their GPUs under `hang_gpu_util_percent` and no rank's log growing
    # for `hang_after_s`.
    hang_after_s: float = Field(default=1800.0, gt=0)
    hang_gpu_util_percent: float = Field(default=5.0, ge=0, le=100)
    on_hang: HangAction = "notify"  # the server's policy; a group's, then the spec's `on_hang:` win
    group_on_hang: dict[str, HangAction] = Field(default_factory=dict)  # JSON: {"group": "kill"}
    # A rank whose log grew less than this fraction of its peers' median is a straggler.
    straggler_ratio: float = Field(default=0.25, gt=0, lt=1)
    # A node that fails jobs of `node_flag_users` distinct users within `node_flag_window_s`.
    node_flag_users: int = Field(default=3, ge=1)
    node_flag_window_s: float = Field(default=3600.0, gt=0)
