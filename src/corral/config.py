"""Server and CLI settings, read from CORRAL_* environment variables (pydantic-settings).

The platform issue owns this module; other parts add fields with defaults.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit

import idna
from pydantic import Field, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

# The portal's address as people reach it (`https://corral.example.org`): where alerts' runbook
# links, pages and the workspace listener send people, and whether the session cookie is https-only.
# Not a Settings field: the server sets its own local address there when it is not given, for the
# monitoring parts, which read it from the environment. Every reader takes the name from here.
PUBLIC_URL_ENV = "CORRAL_PUBLIC_URL"


def portal_url() -> str:
    """The portal's address for links sent out of the server (pages, job mails): CORRAL_PUBLIC_URL,
    else the default local address."""
    return os.environ.get(PUBLIC_URL_ENV, "http://127.0.0.1:8080").rstrip("/")


def default_home() -> Path:
    return Path(os.environ.get("CORRAL_HOME", str(Path.home() / ".corral"))).expanduser()


def url_host(host: str) -> str:
    """`host` as a URL or a host:port writes it: an IPv6 literal in brackets (`http://[::1]:8080`;
    `http://::1:8080` is no URL a client can parse, nor a port anyone can read off it)."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def parse_networks(
    text: str | None, setting: str = "CORRAL_WEBHOOK_ALLOW_NETWORKS"
) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """A `setting` of comma-separated networks (CIDRs) or single addresses."""
    networks = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise ValueError(
                f"{setting}: {part!r} is not a network: give CIDRs such as "
                "10.20.0.0/16 or addresses such as 192.168.1.5, separated by commas"
            ) from None
    return tuple(networks)


def parse_origin(text: str, setting: str) -> str:
    """`scheme://host[:port]` as browsers write an `Origin` (lower case, no path, no default
    port), from a `setting` such as `https://ws.example.org` or `http://ws.local:8081/`."""
    not_an_origin = (
        f"{setting}: {text!r} is not an origin: give a scheme and host, e.g. https://ws.example.org"
    )
    try:  # urlsplit's own ValueError (a malformed `[...]` host) would not name the setting
        parts = urlsplit(text)
    except ValueError:
        raise ValueError(not_an_origin) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(not_an_origin)
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username or parts.password:
        raise ValueError(f"{setting}: {text!r} has more than a scheme, host and port: drop the rest")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"{setting}: {text!r} has a port that is not a number from 0 to 65535") from None
    default = {"http": 80, "https": 443}[parts.scheme]
    host = parts.hostname
    if not host.isascii():  # browsers send an Origin's name in its IDNA form (review128 #5)
        try:
            host = idna.encode(host, uts46=True, transitional=False).decode("ascii")
        except UnicodeError:
            raise ValueError(f"{setting}: {text!r} has a host name that is no valid IDNA name") from None
    where = url_host(host) + (f":{port}" if port is not None and port != default else "")
    return f"{parts.scheme}://{where}"


def workspace_origin_problem(settings: Settings, public_url: str | None) -> str | None:
    """Why the workspace origin as configured cannot be served (a start-up error; `corral doctor`
    fails on it too), or None. `public_url`: CORRAL_PUBLIC_URL as the admin set it (the server
    sets a default for the alerts later, its local address: a loopback one, often)."""
    if (public_url or "").strip() and origin_of(public_url) is None:
        # (else it counted as set, but every check fell back to the bind address: review126 #3)
        return (
            f"{PUBLIC_URL_ENV}={(public_url or '').strip()} is not a URL: give the portal's address as "
            "people reach it, https://host[:port] (or http:// for a plain-http test cluster)"
        )
    if settings.workspace_origin is None:
        if settings.forwarded_allow_ips and settings.workspace_port is None:
            # An upgrade behind a reverse proxy (review118 #1): the default listener, the portal's
            # host name on port + 1, is one the proxy does not serve, so Open JupyterLab would
            # send every browser to an address nothing answers.
            return (
                "CORRAL_FORWARDED_ALLOW_IPS says a reverse proxy stands in front of this server, but "
                "CORRAL_WORKSPACE_ORIGIN is not set: workspaces would be sent to the portal's host name "
                f"on port {settings.workspace_listen_port}, which the proxy does not serve; set "
                "CORRAL_WORKSPACE_ORIGIN to the proxy's address for the workspace listener (and "
                f"{PUBLIC_URL_ENV}; the shipped deploy/nginx/corral.conf and corral.env do), or "
                "CORRAL_WORKSPACE_PORT explicitly (0: JupyterLab on the portal's origin, a known risk)"
            )
        return _same_host_over_https(settings, public_url)
    if not (public_url or "").strip():
        return (
            f"CORRAL_WORKSPACE_ORIGIN={settings.workspace_origin} is set but {PUBLIC_URL_ENV} is not: "
            f"the workspace listener sends browsers back to the portal there; set {PUBLIC_URL_ENV} "
            "to the portal's address as people reach it"
        )
    if origin_of(public_url) == settings.workspace_origin:
        return (
            f"CORRAL_WORKSPACE_ORIGIN={settings.workspace_origin} is the portal's own origin "
            f"({PUBLIC_URL_ENV}): JupyterLab would be back on it; give workspaces a host name of "
            "their own, best on another registrable domain"
        )
    return _same_host_over_https(settings, public_url)


def _origins(settings: Settings, public_url: str | None) -> tuple[str, str]:
    """The portal's origin (CORRAL_PUBLIC_URL's, else the listen address's) and the workspace
    origin (CORRAL_WORKSPACE_ORIGIN, else what the listener derives: the portal's host name on the
    workspace port, in the portal's scheme), for the start-up checks. With Corral's own TLS
    (CORRAL_SSL_CERTFILE) the portal is https whatever CORRAL_PUBLIC_URL's scheme says: browsers
    reach it so, its session cookie is `__Host-` and the listener derives https (review126 #1)."""
    portal = origin_of(public_url) or f"{settings.scheme}://{url_host(settings.host)}:{settings.port}"
    if settings.ssl_certfile is not None:
        portal = "https" + portal[portal.index("://") :]
    if settings.workspace_origin is not None:
        return portal, settings.workspace_origin
    parts = urlsplit(portal)
    return portal, f"{parts.scheme}://{url_host(parts.hostname or '')}:{settings.workspace_listen_port}"


def _host(origin: str) -> str:
    return canonical_host(urlsplit(origin).hostname or "")


# A host a browser reads as an IPv4 address (WHATWG URL: its last label a number): 127.1,
# 2130706433, 0x7f.0.0.1, 0177.0.0.1 (socket.inet_aton reads these forms as browsers do).
_IPV4_NUMBERS = re.compile(r"(?:(?:0x[0-9a-f]*|[0-9]+)\.){0,3}(?:0x[0-9a-f]+|[0-9]+)")


def canonical_host(host: str) -> str:
    """`host` as one spelling of the host a browser goes to, for comparing two (review126 #4): an
    IPv4 or IPv6 address in its shortest form (`[0:0:0:0:0:0:0:1]` is `::1`, `127.1` is
    `127.0.0.1`), a name lower case in its IDNA (punycode) form as UTS #46 maps it for browsers
    (non-transitional: `faß.de` is `xn--fa-hia.de`, not `fass.de`), `%2E` a dot, no final dot."""
    host = unquote(host).strip("[]").rstrip(".").lower()
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    if _IPV4_NUMBERS.fullmatch(host):
        try:
            return socket.inet_ntoa(socket.inet_aton(host))
        except OSError:
            pass
    try:  # UTS #46, non-transitional, as browsers map names (Python's codec is IDNA 2003: faß.de
        # would be fass.de, another host to a browser, and not xn--fa-hia.de, the same one)
        return idna.encode(host, uts46=True, transitional=False).decode("ascii")
    except UnicodeError:  # (idna.IDNAError: a label over 63 characters, an `_`: compared as written)
        return host


def _same_host_over_https(settings: Settings, public_url: str | None) -> str | None:
    """The refusal of a workspace origin on the portal's host name (another port) over https:
    browsers keep cookies apart by host, not by port, so script served there (a workspace's
    JupyterLab) could set the portal's cookies, `__Host-corral_session` included (a secure page of
    that host may set it), and log the owner's browser into an account of its choosing."""
    if settings.workspace_listen_port == 0:
        return None
    portal, workspace = _origins(settings, public_url)
    schemes = {urlsplit(portal).scheme, urlsplit(workspace).scheme}
    if _host(portal) != _host(workspace) or "https" not in schemes:
        return None
    configured = settings.workspace_origin is not None
    named = "CORRAL_WORKSPACE_ORIGIN=" if configured else "without CORRAL_WORKSPACE_ORIGIN: "
    return (
        f"the workspace origin ({named}{workspace}) is on the portal's host name ({portal}) over https: "
        "browsers do not keep cookies apart by port, so script in a workspace could set the portal's "
        "session cookie (__Host-corral_session included); give workspaces a host name of their own "
        "behind the reverse proxy, e.g. CORRAL_WORKSPACE_ORIGIN=https://ws.example.org, best on "
        "another registrable domain (docs/security.md, 'Workspaces on their own origin')"
    )


def workspace_origin_warning(settings: Settings, public_url: str | None) -> str | None:
    """What the server logs at start-up of a workspace origin it serves but should not be relied
    on: one on the portal's host name over plain http on a host that is not loopback (there script
    in a workspace can set the portal's `corral_session` cookie, as anyone on the network path can
    over plain http anyway: refusing it would break plain-http test clusters without closing
    that), or None. Loopback (the demo, tests) is one machine's browser: no warning."""
    if settings.workspace_listen_port == 0 or workspace_origin_problem(settings, public_url) is not None:
        return None
    portal, workspace = _origins(settings, public_url)
    if _host(portal) != _host(workspace) or loopback_host(_host(portal)):
        return None
    return (
        f"workspaces are served at {workspace}, the portal's host name ({portal}) over plain http: "
        "script in a workspace can set cookies the portal reads (log the owner's browser into "
        "another account); serve the portal over https and give workspaces a host name of their "
        "own (CORRAL_WORKSPACE_ORIGIN, docs/security.md, 'Workspaces on their own origin')"
    )


def loopback_host(host: str) -> bool:
    """Whether a host name or address is this machine's loopback (`localhost`, `127.0.0.1`, `::1`)."""
    host = host.strip("[]").rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin_of(url: str | None) -> str | None:
    """The origin of a URL (`https://corral.example.org/x` -> `https://corral.example.org`), as
    parse_origin writes it; None for text that has none (`https://[::1` included: urlsplit refuses
    a malformed bracketed host with ValueError, which must not become a 500 or a traceback)."""
    try:
        parts = urlsplit((url or "").strip())
        return parse_origin(f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}", "a URL")
    except ValueError:
        return None


def same_site(first_origin: str, second_origin: str) -> bool:
    """Whether two origins are one site to a browser, near enough: the same host name, or the same
    last two labels of it (`ws.example.org`, `corral.example.org`; a public-suffix list would
    tell `example.co.uk` apart too: this errs towards saying so). Ports and schemes do not count."""
    first, second = urlsplit(first_origin).hostname or "", urlsplit(second_origin).hostname or ""
    if first == second:
        return True
    labels = [host.split(".") for host in (first, second)]
    if any(len(parts) < 2 or parts[-1].isdigit() for parts in labels):  # an IP address, a bare name
        return False
    return labels[0][-2:] == labels[1][-2:]


class SecretFileError(ValueError):
    """A CORRAL_*_FILE variable that cannot be used; the message names the variable and file."""


class EnvFileSecrets(PydanticBaseSettingsSource):
    """`CORRAL_<FIELD>_FILE=/path`: the setting's value is the file's content (trailing newline
    dropped), so secrets such as the database URL with its password come from a root-only file
    or a systemd credential instead of the environment, which `ps e` and /proc show. Giving both
    CORRAL_<FIELD> and CORRAL_<FIELD>_FILE is refused: one of them would be silently ignored."""

    def __init__(self, settings_cls: type[BaseSettings], environ: dict[str, str] | None = None) -> None:
        super().__init__(settings_cls)
        self.environ = dict(os.environ) if environ is None else environ
        self.prefix = str(settings_cls.model_config.get("env_prefix", ""))

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # everything happens in __call__

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in self.settings_cls.model_fields:
            var = f"{self.prefix}{name}".upper()
            path = self.environ.get(f"{var}_FILE")
            if not path:
                continue
            if var in self.environ:
                raise SecretFileError(f"both {var} and {var}_FILE are set: keep one")
            try:
                values[name] = Path(path).read_text().removesuffix("\n")
            except OSError as exc:
                raise SecretFileError(f"{var}_FILE={path}: cannot read it ({exc.strerror})") from exc
        return values


class FileVariablesSettings(BaseSettings):
    """Settings that also read `<PREFIX><FIELD>_FILE` (EnvFileSecrets): `Settings`, and the
    monitoring loops' CORRAL_MONITOR_* (whose webhook token is a secret)."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        file_variables = EnvFileSecrets(settings_cls)
        return (init_settings, env_settings, file_variables, dotenv_settings, file_secret_settings)


class Settings(FileVariablesSettings):
    model_config = SettingsConfigDict(env_prefix="CORRAL_", extra="ignore")

    home: Path = Field(default_factory=default_home)
    database_url: str | None = None  # default: sqlite under home
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)  # `--port 99999` was bind()'s OverflowError
    # The SSH gateway into job and workspace sandboxes (corral.gateway; docs/workspaces.md): its
    # TCP port on `host`, 0 = off. It runs inside the server process, on its own thread.
    ssh_gateway_port: int = Field(default=2222, ge=0, le=65535)
    ssh_gateway_host: str | None = None  # its bind address; None: the API's `host`
    # Behind a reverse proxy: the proxies whose X-Forwarded-For/-Proto are believed (uvicorn's
    # forwarded_allow_ips: comma-separated addresses or networks, "*" any). None or empty: no
    # proxy headers at all, the TCP peer is the source (audit, per-address lockout and rate
    # limit): otherwise any local process could claim any address (docs/security.md).
    forwarded_allow_ips: str | None = None
    engine: Literal["local", "slurm"] = "local"
    node_name: str = Field(default_factory=socket.gethostname)
    virtual_gpus: int | None = None  # None: discover with NVML, else declare N virtual GPUs
    gpu_model: str = "VGPU"  # model name of declared virtual GPUs
    allow_unisolated: bool = False  # run jobs without bubblewrap/cgroups when those are missing
    # Requests the API admits at once; keep it below the DB connections (pool of 50).
    api_max_concurrency: int = Field(default=32, ge=1)
    # Worker threads that run the API's blocking work (sync endpoints, DB queries). None: two per
    # CPU, at least 4. More threads than cores only take turns on the GIL, which stretches every
    # request in a burst (bench/api_load.py: p99 about 2x worse with 40 on 2 cores).
    api_worker_threads: int | None = Field(default=None, ge=1)
    isolation: bool = True  # False: run jobs as plain supervised processes (benchmarks, trusted laptops)
    job_pids_max: int = 1024  # pids-cgroup limit per task instance (fork-bomb guard)
    # Local engine: each job in its own network namespace (its instances share it), which cannot
    # reach the host's loopback; `host` shares the node's network. Outbound: `internet` through
    # slirp4netns (host loopback still blocked). See docs/security.md, "Network".
    job_network: Literal["isolated", "host"] = "isolated"
    job_outbound: Literal["none", "internet"] = "none"
    scheduler_profile: str = "default"  # a name in corral.scheduler.PROFILES
    # May CPU-only jobs use GPU nodes? None = yes for the local engine (one machine: otherwise a
    # GPU workstation could never run CPU work), no for Slurm (keep GPU nodes for GPU work).
    cpu_jobs_on_gpu_nodes: bool | None = None
    # /readyz answers 503 when a background loop has had no good pass for this long (or three of
    # its intervals, when longer): stuck in a tick, or failing every tick (e.g. database locked).
    ready_loop_stall_s: float = Field(default=30.0, gt=0)
    # Finished jobs (and their logs) are deleted this many days after they ended; None: kept.
    job_retention_days: float | None = Field(default=None, gt=0)
    job_retention_check_s: float = Field(default=300.0, gt=0)  # how often retention looks
    # Admin audit log records are deleted this many days after they were written; None: kept.
    audit_retention_days: float | None = Field(default=365.0, gt=0)
    # Requeues a job gets for work the platform lost (attempt, supervisor, node or engine lost),
    # separate from its own `retries:`; one budget per job (services/lifecycle.py).
    lost_requeue_budget: int = Field(default=3, ge=0)
    # The most SIGTERM-to-kill time a preempted job gets, whatever its spec's `stop_grace` asks:
    # a job cannot hold the GPUs it is preempted from for longer than this.
    max_stop_grace_s: float = Field(default=300.0, ge=0)

    # --- datasets and storage quotas (corral.datasets; docs/datasets.md) ------------------------
    # Server-side directories datasets may be imported from (admins), ':'-separated; "" = none.
    dataset_import_roots: str = ""
    dataset_upload_timeout_s: float = Field(default=24 * 3600.0, gt=0)  # idle uploads are removed
    # Upload chunk size; the chunk route's body limit (corral.api.limits) follows it.
    dataset_chunk_bytes: int = Field(default=8 * 1024 * 1024, ge=4096, le=256 * 1024 * 1024)
    storage_scan_interval_s: float = Field(default=600.0, gt=0)  # home/group directory usage scan

    # --- environments catalogue (corral.environments; docs/catalogues.md) ------------------------
    # The package index build jobs resolve and download from (e.g. https://pypi.org/simple), and
    # a server dir of wheels bound read-only into them; neither set: environments cannot be built.
    env_index_url: str = ""
    env_find_links: Path | None = None
    env_build_timeout_s: float = Field(default=1800.0, gt=0)  # a build job's max_runtime
    # The interpreter environments are built for (recorded with each version; it must be at the
    # same path on every node, readable by job accounts). "": the server's base interpreter on
    # the local engine, /usr/bin/python3 on Slurm (corral.environments.interpreter).
    env_python: str = ""

    # --- API limits (corral.api.limits; docs/security.md "API and login") ---------------------
    api_max_body_bytes: int = Field(default=1024 * 1024, ge=1024)  # larger bodies: 413
    api_max_json_depth: int = Field(default=32, ge=2)  # deeper JSON bodies: 400
    api_max_json_elements: int = Field(default=20_000, ge=10)  # JSON values in one body; more: 400
    api_body_timeout_s: float = Field(default=30.0, gt=0)  # a body not all sent by then: 408
    api_keep_alive_s: int = Field(default=5, ge=1)  # idle keep-alive connections are closed
    # Token buckets per token (or per source address when unauthenticated): requests per minute
    # and the burst allowed at once. 0 per minute switches a rule off.
    rate_submit_per_min: float = Field(default=1200.0, ge=0)  # POST /api/v1/jobs
    rate_submit_burst: int = Field(default=200, ge=1)
    rate_login_per_min: float = Field(default=30.0, ge=0)  # POST /api/v1/auth/login, per address
    rate_login_burst: int = Field(default=10, ge=1)
    rate_logs_per_min: float = Field(default=600.0, ge=0)  # GET .../logs
    rate_logs_burst: int = Field(default=60, ge=1)
    rate_big_list_per_min: float = Field(default=120.0, ge=0)  # GET lists with limit > 100
    rate_big_list_burst: int = Field(default=30, ge=1)
    # --- login protection and credential lifetimes (corral.services.login_guard) --------------
    login_lockout_after: int = Field(default=5, ge=1)  # consecutive failures before a lockout
    login_lockout_base_s: float = Field(default=30.0, gt=0)  # first lockout; doubles per failure
    login_lockout_max_s: float = Field(default=900.0, gt=0)  # longest lockout
    login_failure_window_s: float = Field(default=3600.0, gt=0)  # failures older than this are forgotten
    session_lifetime_s: float = Field(default=12 * 3600.0, gt=0)  # portal sessions
    token_default_lifetime_days: float | None = Field(default=90.0, gt=0)  # None: never expire
    token_max_lifetime_days: float | None = Field(default=365.0, gt=0)  # None: no maximum
    # --- people's webhook contacts (corral.services.webhook_guard) ------------------------------
    # Networks (comma-separated CIDRs) a webhook contact may reach although they are loopback,
    # link-local or private: none by default, so a user's webhook cannot aim at the cluster.
    webhook_allow_networks: str = ""
    # --- /metrics (corral.api.metrics_auth) ------------------------------------------------------
    metrics_token: str | None = None  # bearer token Prometheus must send
    metrics_token_file: Path | None = None  # or read it from this file (first line)
    # --- secrets for jobs (corral.services.secrets) -------------------------------------------
    # base64 of 32 random bytes (AES-256-GCM); or CORRAL_SECRETS_KEY_FILE. Unset: generated once
    # into <home>/secrets.key (0600). Servers sharing a database must share the key.
    secrets_key: str | None = Field(default=None, repr=False)
    # TLS served by uvicorn itself (both or neither); behind a TLS reverse proxy leave them unset.
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    # Checked by `corral doctor` when set (their /-/ready endpoints).
    prometheus_url: str | None = None
    alertmanager_url: str | None = None
    # --- storage (corral.storage; docs/storage.md) -----------------------------------------------
    storage_root: Path | None = None  # homes, group dirs, datasets, code, outputs; default <home>/storage
    # Stable ids of the local engine (recorded in the database, never reused): a uid per user and a
    # gid per group. Apart from each other and from the per-attempt uids (200000-259999).
    uid_range: str = "300000-399999"
    gid_range: str = "400000-499999"
    code_max_bytes: int = Field(default=256 * 1024 * 1024, ge=1)  # one `--code` snapshot, all files
    code_max_files: int = Field(default=5_000, ge=1)  # the manifest (~130 B a file) must fit one request
    # Interactive workspaces (docs/workspaces.md): the idle timeout without a group policy and its
    # maximum, the GPU utilisation under which a workspace counts as idle, warning-to-stop grace.
    workspace_idle_timeout_s: float = Field(default=7200.0, gt=0)
    workspace_max_idle_timeout_s: float = Field(default=7 * 86400.0, gt=0)
    workspace_idle_below_percent: float = Field(default=10.0, ge=0, le=100)
    workspace_idle_grace_s: float = Field(default=600.0, gt=0)
    # Slurm engine: the Python a workspace runs JupyterLab with (a venv with Corral and its pinned
    # jupyterlab, at the same path on every node, readable by the job accounts). None: the
    # server's own venv, which must then be readable by them (corral.environments.mounts).
    workspace_venv: Path | None = None
    # Workspaces on their own origin (docs/security.md, "Workspaces on their own origin"): the
    # port of a second listener of this server on `host` that serves only the workspace proxy;
    # the portal's `/ws/<id>/` hands a browser over to it. None: `port` + 1 (the demo's 8081);
    # 0: no second listener, JupyterLab on the portal's own origin (a known risk, documented).
    workspace_port: int | None = Field(default=None, ge=0, le=65535)
    # The workspace listener's address as browsers reach it, when a reverse proxy (or a wildcard
    # host) stands in front of it, e.g. `https://ws.example.org`. None: the portal's scheme and
    # host name with `workspace_port`.
    workspace_origin: str | None = None

    @field_validator("audit_retention_days", mode="before")
    @classmethod
    def _keep_forever(cls, value: Any) -> Any:
        """CORRAL_AUDIT_RETENTION_DAYS="" (or "none", "never") keeps every audit record."""
        if isinstance(value, str) and value.strip().lower() in ("", "none", "never"):
            return None
        return value

    @field_validator("webhook_allow_networks")
    @classmethod
    def _networks(cls, value: str) -> str:
        """Refused at start, naming the entry, rather than at the first contact or page."""
        parse_networks(value)
        return value

    @field_validator("forwarded_allow_ips")
    @classmethod
    def _proxies(cls, value: str | None) -> str | None:
        """Refused at start, naming the entry: uvicorn ignores one it cannot parse, so a typo
        would trust no proxy (every caller seen as the proxy) without a word (review105)."""
        if value is not None and value.strip() != "*":
            parse_networks(value, "CORRAL_FORWARDED_ALLOW_IPS")
        return value

    @field_validator("workspace_origin")
    @classmethod
    def _origin(cls, value: str | None) -> str | None:
        """A scheme and a host (and port), nothing else: it is compared with browsers' `Origin`."""
        if value is None or not value.strip():
            return None
        return parse_origin(value.strip(), "CORRAL_WORKSPACE_ORIGIN")

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("CORRAL_SSL_CERTFILE and CORRAL_SSL_KEYFILE go together: set both or neither")
        return self

    @model_validator(mode="after")
    def _workspace_listener(self) -> Settings:
        if self.workspace_origin is not None and self.workspace_listen_port == 0:
            raise ValueError(
                "CORRAL_WORKSPACE_ORIGIN needs the workspace listener it stands in front of: "
                "set CORRAL_WORKSPACE_PORT to a port (not 0), or unset CORRAL_WORKSPACE_ORIGIN"
            )
        if self.workspace_port is None and self.port == 65535:
            raise ValueError(
                "CORRAL_PORT=65535 leaves no next port for the workspace listener (its default, the "
                "portal's port + 1): set CORRAL_WORKSPACE_PORT to a free port (or 0 to serve "
                "workspaces on the portal's origin)"
            )
        if self.workspace_listen_port != 0 and self.workspace_listen_port == self.port:
            raise ValueError(
                f"CORRAL_WORKSPACE_PORT={self.workspace_listen_port} is the portal's own port "
                "(CORRAL_PORT): workspaces need another port (or 0 to serve them on the portal's origin)"
            )
        return self

    @property
    def workspace_listen_port(self) -> int:
        """The workspace listener's port; 0: none (JupyterLab on the portal's origin). Unset, it is
        the portal's port + 1, and none when the portal's port is 0 (an ephemeral one: tests); the
        portal on 65535 needs CORRAL_WORKSPACE_PORT (refused, not JupyterLab on its origin)."""
        if self.workspace_port is not None:
            return self.workspace_port
        return self.port + 1 if 0 < self.port < 65535 else 0

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"

    @property
    def worker_threads(self) -> int:
        return self.api_worker_threads or max(4, 2 * (os.cpu_count() or 1))

    @property
    def storage_path(self) -> Path:
        return self.storage_root or self.home / "storage"

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'corral.db'}"


def settings_error(exc: ValueError) -> str:
    """A refused `Settings()` in one line: pydantic's ValidationError text runs over several lines
    and repeats every input given (a --database-url's password too); its errors, each naming the
    variable (`CORRAL_PORT: ...`), say what is wrong."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)  # SecretFileError and the like: one line already
    parts = []
    for err in errors():
        message = str(err["msg"]).removeprefix("Value error, ")
        field = "_".join(str(p) for p in err["loc"]).upper()
        parts.append(f"CORRAL_{field}: {message}" if field else message)
    return "; ".join(parts)
