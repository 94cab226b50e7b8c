"""The scheduling profile this server runs with, built in one place so that the live loop and
the submit-time "can this job ever fit" check always agree."""

from __future__ import annotations

import dataclasses

from corral.config import Settings
from corral.scheduler import PROFILES, Profile


def active_profile(settings: Settings) -> Profile:
    name = settings.scheduler_profile
    if name not in PROFILES:
        known = ", ".join(sorted(PROFILES))
        raise ValueError(f"CORRAL_SCHEDULER_PROFILE={name!r} is not a scheduler profile; known: {known}")
    allow = settings.cpu_jobs_on_gpu_nodes
    if allow is None:
        allow = settings.engine == "local"
    return dataclasses.replace(PROFILES[name], cpu_jobs_on_gpu_nodes=allow)
