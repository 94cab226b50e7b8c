"""Python SDK for Corral's REST API (httpx). The `corral` CLI is built on it, so AutoML tools get
exactly the same calls:

    from corral.sdk import Client
    client = Client.from_config()            # $CORRAL_URL/$CORRAL_TOKEN or $CORRAL_HOME/config.yaml
    job = client.submit({"name": "t", "command": "python train.py", "resources": {"gpus": 1}})
    job = client.wait(job["id"])

Many jobs (an AutoML search's trials) carry labels and are listed, waited for and cancelled by
them: `jobs(labels=...)`, `iter_jobs(labels=...)`, `wait_any(ids)`, `wait_all(labels=...)`,
`cancel_by_labels(...)`, `hold_by_labels(...)`, `release_by_labels(...)`; a job reports metrics
with `report_metrics(step=3, loss=0.4)`, which `metrics(job_id)` (or `metrics_of(labels=...)` for
many) reads back. `notifications(job_id)` says what a job's `notify` sent; `gpu_usage()` each
GPU's latest reading.

Also home of the CLI config file (`$CORRAL_HOME/config.yaml`, mode 0600: url + token) that the
server writes for the bootstrapped admin (config.py).

One module per area of the API, each a mixin over base.BaseClient (the HTTP side); Client is all
of them. Import from here: the modules' layout is not part of the SDK's interface.
"""

from __future__ import annotations

from corral.sdk.accounts import AccountsApi
from corral.sdk.base import KEEP, BaseClient, Keep
from corral.sdk.catalogues import CataloguesApi
from corral.sdk.cluster import ClusterApi
from corral.sdk.config import (
    CONFIG_FILE,
    DEFAULT_URL,
    ClientConfig,
    config_path,
    load_cli_config,
    write_cli_config,
)
from corral.sdk.errors import ApiError, AuthenticationFailed, CorralError, ServerUnreachable, describe_detail
from corral.sdk.job_sets import JobSetsApi, report_metrics
from corral.sdk.jobs import TERMINAL_STATES, JobsApi
from corral.sdk.operations import OperationsApi
from corral.sdk.storage import CodeUpload, StorageApi
from corral.sdk.workspaces import WorkspacesApi

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_URL",
    "KEEP",
    "TERMINAL_STATES",
    "ApiError",
    "AuthenticationFailed",
    "Client",
    "ClientConfig",
    "CodeUpload",
    "CorralError",
    "Keep",
    "ServerUnreachable",
    "config_path",
    "describe_detail",
    "load_cli_config",
    "report_metrics",
    "write_cli_config",
]


class Client(
    JobsApi,
    JobSetsApi,
    ClusterApi,
    AccountsApi,
    StorageApi,
    WorkspacesApi,
    CataloguesApi,
    OperationsApi,
    BaseClient,
):
    """A client of one Corral server with every area of the API (see each mixin)."""
