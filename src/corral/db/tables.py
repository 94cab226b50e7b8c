"""Every module that declares tables on `corral.db.base.Base`, by name, in one list: Alembic's
environment (autogenerate must see every table) and the tests that inspect every mapped model
import them from here. A new area adds its module here, not to each of those places."""

from __future__ import annotations

import importlib

TABLE_MODULES = (
    "corral.db.models",
    "corral.db.diag_models",
    "corral.db.storage_models",
    "corral.db.audit_models",
    "corral.db.secrets_models",  # job secrets (corral.services.secrets)
    "corral.db.incident_models",  # incidents, remediation rules
    "corral.datasets.models",
    "corral.db.environment_models",
    "corral.db.catalog_models",  # templates and the model registry
    "corral.db.oncall_models",  # on-call and paging (corral.services.paging)
    "corral.db.workspace_models",  # interactive workspaces
    "corral.db.notify_models",  # job notifications' outbox and deliveries (services/job_notify.py)
)
OPTIONAL_TABLE_MODULES = ("corral.monitor.models",)  # monitoring may be left out of an install


def import_all() -> None:
    for name in TABLE_MODULES:
        importlib.import_module(name)
    for name in OPTIONAL_TABLE_MODULES:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError:
            pass
