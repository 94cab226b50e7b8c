"""`corral doctor`: check a host for what a Corral server needs, each failure with its fix.

Status: ok; warn (works, but not as a multi-user installation should); fail (something required
is missing: the server would refuse to start or to run jobs); skip (not configured here).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from corral.config import PUBLIC_URL_ENV, Settings, origin_of, same_site, url_host, workspace_origin_problem
from corral.words import plural

if TYPE_CHECKING:
    from corral.engine.slurm.cli import SlurmCli
    from corral.engine.slurm.users import UserMap
    from corral.storage.identities import GroupGid

CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_CONTROLLERS = ("cpu", "memory", "pids")


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail | skip
    detail: str
    fix: str | None = None

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def run_checks(settings: Settings, cgroup_root: Path = CGROUP_ROOT) -> list[Check]:
    checks: list[Callable[[], Check]] = [
        lambda: check_home(settings),
        lambda: check_database(settings),
        lambda: check_sqlite_file(settings),
        lambda: check_sandbox(settings),
        lambda: check_cgroups(settings, cgroup_root),
        lambda: check_gpus(settings),
        lambda: check_tls(settings),
        lambda: check_workspace_origin(settings),
        lambda: check_monitor_config(settings),
        lambda: check_http("prometheus", settings.prometheus_url, "CORRAL_PROMETHEUS_URL"),
        # Debian's package (docs/deploy.md step 1) names its unit prometheus-alertmanager
        lambda: check_http(
            "alertmanager",
            settings.alertmanager_url,
            "CORRAL_ALERTMANAGER_URL",
            unit="prometheus-alertmanager",
        ),
        lambda: check_slurm(settings),
        lambda: check_slurm_users(settings),
        lambda: check_slurm_groups(settings),
        lambda: check_storage(settings),
        lambda: check_id_ranges(settings),
    ]
    results = []
    for check in checks:
        try:
            results.append(check())
        except Exception as exc:  # one broken probe must not hide the others' answers
            results.append(Check("doctor", "fail", f"a check crashed: {type(exc).__name__}: {exc}"))
    return results


def check_storage(settings: Settings) -> Check:
    """The storage root (corral.storage.layout): its dirs and modes, the id ranges, and on Slurm
    that job accounts can pass through to it (the server checks the nodes see it at start-up)."""
    from corral.storage.layout import layout_problems
    from corral.storage.plan import id_ranges

    root = settings.storage_path
    try:
        id_ranges(settings)
    except ValueError as exc:
        return Check(
            "storage", "fail", str(exc), "set CORRAL_UID_RANGE / CORRAL_GID_RANGE to LOW-HIGH ranges"
        )
    if not root.exists():
        return Check(
            "storage", "warn", f"{root} not created yet", "the server creates it at start-up (corral up)"
        )
    problems = layout_problems(root, settings.engine)
    if settings.engine == "slurm":
        blocked = next((p for p in [root, *root.parents] if not p.stat().st_mode & 0o001), None)
        if blocked is not None:
            problems.append(f"{blocked} is not passable (o+x) for the job accounts")
    if problems:
        return Check("storage", "fail", "; ".join(problems), "see docs/storage.md, 'Layout and permissions'")
    return Check("storage", "ok", f"{root}: layout and modes as documented")


def check_id_ranges(settings: Settings) -> Check:
    """CORRAL_UID_RANGE / CORRAL_GID_RANGE are Corral's to give out: a host account or group that
    already holds an id in them would get what Corral gives that id (a user's home, a group's
    dir). Corral's own Unix groups (on Slurm, made for its groups: corral_unix_names) are no
    overlap; on Slurm the uid range owns nothing (the mapped accounts own users' files)."""
    import grp
    import pwd

    from corral.storage.plan import id_ranges

    try:
        uids, gids = id_ranges(settings)
    except ValueError:  # the storage check says what is wrong with them
        return Check("id ranges", "skip", "the ranges cannot be read (see storage)")
    held = []
    if settings.engine != "slurm":
        users = [f"{p.pw_name} ({p.pw_uid})" for p in pwd.getpwall() if uids.low <= p.pw_uid <= uids.high]
        if users:
            held.append(f"CORRAL_UID_RANGE {settings.uid_range} holds host accounts {_some(users)}")
    own = _corral_unix_groups(settings)
    groups = [
        f"{g.gr_name} ({g.gr_gid})"
        for g in grp.getgrall()
        if gids.low <= g.gr_gid <= gids.high and g.gr_name not in own.get(g.gr_gid, ())
    ]
    if groups:
        held.append(f"CORRAL_GID_RANGE {settings.gid_range} holds host groups {_some(groups)}")
    if not held:
        ranges = f"{settings.uid_range}, {settings.gid_range}"
        return Check("id ranges", "ok", f"no host account or group holds an id Corral gives ({ranges})")
    return Check(
        "id ranges",
        "warn",
        "; ".join(held) + ": a Corral user or group given one of those ids shares its files with them",
        "set the ranges to ids that no account or group of this host or the nodes has "
        "(docs/storage.md, Identities)",
    )


def _corral_unix_groups(settings: Settings) -> dict[int, tuple[str, ...]]:
    """{gid: the names a Unix group made for its Corral group may have}, from Corral's database
    when there is one to read (none: no Corral group has a gid)."""
    from corral.db.session import is_sqlite
    from corral.engine.slurm.users import corral_unix_names
    from corral.ops.backup import sqlite_path

    if is_sqlite(settings.db_url) and not sqlite_path(settings.db_url).exists():  # connecting makes it
        return {}
    try:
        groups = _groups_with_gids(settings)
    except Exception:  # the database check says what is wrong with it
        return {}
    return {g.gid: corral_unix_names(g.name, g.gid) for g in groups}


def _some(names: list[str], shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def check_home(settings: Settings) -> Check:
    home = settings.home
    if not home.exists():
        return Check("home", "fail", f"{home} does not exist", f"install -d -m 700 {home}")
    if not os.access(home, os.W_OK | os.X_OK):
        return Check(
            "home", "fail", f"{home} is not writable by uid {os.geteuid()}", f"chown $(id -u) {home}"
        )
    mode = stat.S_IMODE(home.stat().st_mode)
    if mode & 0o077:
        return Check(
            "home",
            "warn",
            f"{home} has mode {mode:04o}: other accounts can read the server's files",
            f"chmod 700 {home}",
        )
    return Check("home", "ok", f"{home} (mode {mode:04o})")


def _alembic_heads() -> set[str]:
    from alembic.script import ScriptDirectory

    from corral.db.session import alembic_config

    return set(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def check_database(settings: Settings) -> Check:
    import sqlalchemy as sa

    from corral.db.session import is_sqlite, make_engine
    from corral.ops.backup import sqlite_path

    url = settings.db_url
    shown = sa.engine.make_url(url).render_as_string(hide_password=True)
    if is_sqlite(url) and not sqlite_path(url).exists():  # connecting would create it
        return Check("database", "fail", f"{sqlite_path(url)} does not exist", "corral admin migrate")
    engine = make_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            has_version = sa.inspect(conn).has_table("alembic_version")
            current = (
                {r[0] for r in conn.execute(sa.text("SELECT version_num FROM alembic_version"))}
                if has_version
                else set()
            )
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return Check(
            "database", "fail", f"{shown} unreachable: {first_line}", "check CORRAL_DATABASE_URL(_FILE)"
        )
    finally:
        engine.dispose()
    heads = _alembic_heads()
    if current != heads:
        have = ", ".join(sorted(current)) or "empty"
        return Check(
            "database",
            "fail",
            f"{shown} at revision {have}, code expects {', '.join(sorted(heads))}",
            "corral admin migrate",
        )
    return Check("database", "ok", f"{shown} reachable, schema at {', '.join(sorted(heads))}")


def check_sqlite_file(settings: Settings) -> Check:
    from corral.db.session import is_sqlite
    from corral.ops.backup import sqlite_path

    if not is_sqlite(settings.db_url):
        return Check("database file", "skip", "PostgreSQL: file modes are the database server's")
    path = sqlite_path(settings.db_url)
    if not path.exists():
        return Check("database file", "skip", f"{path} not created yet")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Check("database file", "warn", f"{path} has mode {mode:04o}", f"chmod 600 {path}*")
    return Check("database file", "ok", f"{path} (mode {mode:04o}); use PostgreSQL for several users")


def check_sandbox(settings: Settings) -> Check:
    from corral.engine.isolation.sandbox import probe

    if settings.engine != "local":
        return Check("sandbox", "skip", "Slurm engine: jobs are sandboxed on the Slurm nodes")
    status = probe()
    if status.sandbox and status.warnings:
        return Check(
            "sandbox",
            "warn",
            f"bubblewrap {status.bwrap} usable, setpriv {status.setpriv}; " + "; ".join(status.warnings),
            "install bubblewrap 0.10 or later, or your distribution's security update that adds --bind-fd"
            if not status.bind_fd
            else "install a bubblewrap with --json-status-fd (0.8 and later have it) that writes an "
            "exit code only for a command it exec'd",
        )
    if status.sandbox:
        return Check(
            "sandbox",
            "ok",
            f"bubblewrap {status.bwrap} usable (mounts bound by fd), setpriv {status.setpriv}",
        )
    problems = [p for p in status.problems if "cgroup" not in p]
    fixes = []
    if status.bwrap is None:
        fixes.append("apt-get install bubblewrap")
    if status.setpriv is None:
        fixes.append("apt-get install util-linux")
    if not status.root:
        fixes.append("run the server as root (deploy/systemd/corral.service)")
    required = settings.isolation and not settings.allow_unisolated
    return Check(
        "sandbox",
        "fail" if required else "warn",
        "; ".join(problems) or status.summary(),
        "; ".join(fixes) or "allow user namespaces (sysctl kernel.unprivileged_userns_clone=1)",
    )


def check_cgroups(settings: Settings, root: Path) -> Check:
    if settings.engine == "slurm":
        return check_slurm_confinement()
    required = settings.isolation and not settings.allow_unisolated
    controllers_file = root / "cgroup.controllers"
    if controllers_file.exists():
        have = set(controllers_file.read_text().split())
        missing = [c for c in CGROUP_CONTROLLERS if c not in have]
        if missing:
            return Check(
                "cgroups",
                "fail" if required else "warn",
                f"cgroup v2 at {root} lacks controllers {', '.join(missing)}",
                f"echo '+{' +'.join(missing)}' > {root}/cgroup.subtree_control (or Delegate=yes in the unit)",
            )
        return Check(
            "cgroups", "ok", f"cgroup v2, controllers {' '.join(sorted(have & set(CGROUP_CONTROLLERS)))}"
        )
    v1 = [c for c in CGROUP_CONTROLLERS if (root / c).is_dir()]
    if len(v1) == len(CGROUP_CONTROLLERS):
        devices = ", devices" if (root / "devices").is_dir() else " (no devices controller)"
        return Check("cgroups", "ok", f"cgroup v1: {', '.join(v1)}{devices}")
    return Check(
        "cgroups",
        "fail" if required else "warn",
        f"no cgroup v2 hierarchy and cgroup v1 has only {', '.join(v1) or 'nothing'} at {root}",
        "boot with systemd.unified_cgroup_hierarchy=1 (or mount cgroup2 at /sys/fs/cgroup)",
    )


def check_gpus(settings: Settings) -> Check:
    from corral.engine.gpus import discover_gpus

    if settings.engine != "local":
        return Check("gpus", "skip", "Slurm engine: GPUs come from Slurm's gres")
    if settings.virtual_gpus is not None:
        return Check("gpus", "ok", f"{settings.virtual_gpus} virtual GPUs declared (CORRAL_VIRTUAL_GPUS)")
    inventory = discover_gpus(settings.node_name, settings.home, None)
    if inventory.gpus:
        models = sorted({g.model for g in inventory.gpus})
        return Check("gpus", "ok", f"{plural(len(inventory.gpus), 'GPU')} via NVML ({', '.join(models)})")
    return Check(
        "gpus",
        "warn",
        inventory.message or "NVML found no GPUs: this node runs CPU jobs only",
        "install the NVIDIA driver (nvidia-smi must work), or set CORRAL_VIRTUAL_GPUS=N to try Corral",
    )


LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
PROC_NET_TCP = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def check_tls(
    settings: Settings, env: Mapping[str, str] | None = None, proc_net: Sequence[Path] = PROC_NET_TCP
) -> Check:
    if settings.ssl_certfile is None or settings.ssl_keyfile is None:
        host, port, source = server_address(settings, os.environ if env is None else env, proc_net)
        exposed = host not in LOOPBACK_HOSTS
        return Check(
            "tls",
            "warn" if exposed else "ok",
            f"plain HTTP on {url_host(host)}:{port} ({source})"
            + (": tokens cross the network in clear" if exposed else " (loopback; TLS at the proxy)"),
            "set CORRAL_SSL_CERTFILE/CORRAL_SSL_KEYFILE or bind 127.0.0.1 behind nginx" if exposed else None,
        )
    unreadable = [str(p) for p in (settings.ssl_certfile, settings.ssl_keyfile) if not os.access(p, os.R_OK)]
    if unreadable:
        return Check("tls", "fail", f"cannot read {', '.join(unreadable)}", "check the paths and modes")
    return Check("tls", "ok", f"uvicorn serves TLS with {settings.ssl_certfile}")


def check_workspace_origin(settings: Settings, env: Mapping[str, str] | None = None) -> Check:
    """Where workspaces' JupyterLab is served (corral.workspaces.origin): on an origin of its own,
    as it should be, and reachable where browsers are sent."""
    env = os.environ if env is None else env
    port = settings.workspace_listen_port
    problem = workspace_origin_problem(settings, env.get(PUBLIC_URL_ENV))
    if problem is not None:  # the server refuses to start with it
        return Check("workspace-origin", "fail", problem, "see docs/workspaces.md, 'The workspace origin'")
    if port == 0:
        return Check(
            "workspace-origin",
            "warn",
            "JupyterLab is served on the portal's origin (CORRAL_WORKSPACE_PORT=0): script in a "
            "workspace can act as its owner on the API",
            "set CORRAL_WORKSPACE_PORT to a free port (docs/workspaces.md, 'The workspace origin')",
        )
    if settings.workspace_origin is None and settings.forwarded_allow_ips:
        return Check(
            "workspace-origin",
            "warn",
            f"behind a reverse proxy, workspaces are sent to the portal's host name on port {port}, "
            "which browsers reach only if that port is open to them",
            "set CORRAL_WORKSPACE_ORIGIN to the proxy's address for the workspace listener "
            "(deploy/nginx/corral.conf)",
        )
    where = settings.workspace_origin or f"the portal's host name, port {port}"
    public = origin_of(env.get(PUBLIC_URL_ENV))
    if settings.workspace_origin is None or (
        public is not None and same_site(public, settings.workspace_origin)
    ):
        return Check(
            "workspace-origin",
            "warn",
            f"workspaces on their own origin ({where}), but the same site as the portal: a workspace "
            "page's requests carry the portal's cookie, and its script can set cookies for the portal",
            "set CORRAL_WORKSPACE_ORIGIN to a host name on another registrable domain "
            "(docs/security.md, 'Workspaces on their own origin')",
        )
    return Check("workspace-origin", "ok", f"workspaces on their own origin: {where}")


def server_address(
    settings: Settings, env: Mapping[str, str], proc_net: Sequence[Path]
) -> tuple[str, int, str]:
    """Where the server listens (host, port) and how doctor knows. CORRAL_HOST/CORRAL_PORT are what
    `corral up` reads; without them the port is the one the CLI is configured for (CORRAL_URL, or
    the home's config.yaml, which `corral up` writes and rewrites when it starts on another port,
    `--port` included), else 8080. Settings alone said 8080 of a server started with --port 9500.
    A socket listening on that port now gives its real address (`--host 0.0.0.0` too: the CLI's URL
    names 127.0.0.1 for it)."""
    from urllib.parse import urlsplit

    from corral.sdk import CorralError, config_path, load_cli_config

    host, port, source = settings.host, settings.port, "the default address"
    config = config_path(settings.home)
    if "CORRAL_HOST" in env or "CORRAL_PORT" in env:
        source = "CORRAL_HOST/CORRAL_PORT"
    elif env.get("CORRAL_URL") or config.exists():
        try:
            parts = urlsplit(load_cli_config(settings.home, env).url)
            url_port = parts.port
        except (CorralError, ValueError):  # a config.yaml that is not YAML, or a URL that is none
            parts, url_port = urlsplit(""), None  # (`http://[::1`, a port 99999): the settings'
        if parts.scheme == "http" and parts.hostname:  # (https: a proxy's address, not the server's)
            named = "CORRAL_URL" if env.get("CORRAL_URL") else str(config)
            host, port, source = parts.hostname, url_port or 80, f"the CLI's server, {named}"
    listening = listening_hosts(port, proc_net)
    if listening:
        wide = [h for h in listening if h not in LOOPBACK_HOSTS]
        return (wide or listening)[0], port, f"{source}; a socket listens there now"
    return host, port, source


def listening_hosts(port: int, proc_net: Sequence[Path] = PROC_NET_TCP) -> list[str]:
    """The addresses a socket of this host listens on at `port`, from /proc/net/tcp{,6} (Linux;
    none elsewhere): 0.0.0.0 or :: for every interface."""
    found: list[str] = []
    for table in proc_net:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "0A":  # 0A: LISTEN
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) != port:
                continue
            raw = bytes.fromhex(address)  # each 32-bit word in host (little-endian) order
            packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append(str(ipaddress.ip_address(packed)))
    return found


def check_monitor_config(settings: Settings) -> Check:
    """The monitor config (CORRAL_MONITOR_CONFIG_FILE, else <home>/monitor.yml) through the loader
    `corral up` starts with, so a file the server would refuse fails here with its file, line and
    field; a named file that is missing, which the server would run without, is a warning."""
    from corral.config import SecretFileError
    from corral.monitor.config import MonitorConfigError, MonitorSettings, config_path, load_monitor_config

    try:
        monitor = MonitorSettings()
    except SecretFileError as exc:  # a CORRAL_MONITOR_*_FILE the server cannot read either
        return Check("monitor config", "fail", str(exc), "fix the path or the file's mode")
    path = config_path(settings, monitor)
    if not path.exists():
        if monitor.config_file is not None:
            return Check(
                "monitor config",
                "warn",
                f"CORRAL_MONITOR_CONFIG_FILE={path} does not exist: the server runs with no channels",
                "create it (docs/metrics.md, 'Notification channels') or unset the variable",
            )
        return Check(
            "monitor config", "skip", f"no {path}: no notification channels (CORRAL_MONITOR_CONFIG_FILE)"
        )
    try:
        config = load_monitor_config(path)
    except MonitorConfigError as exc:
        return Check(
            "monitor config",
            "fail",
            str(exc),
            f"correct that line of {path} (docs/metrics.md, 'Notification channels'); "
            "corral up refuses to start until it loads",
        )
    names = ", ".join(c.name for c in config.channels) or "none"
    return Check("monitor config", "ok", f"{path}: loads; channels: {names}")


def check_http(name: str, url: str | None, variable: str, unit: str | None = None) -> Check:
    """`<url>/-/ready` of Prometheus or Alertmanager; a fix names the systemd `unit` (default: name)."""
    import httpx

    unit = unit or name

    if not url:
        return Check(name, "skip", f"not configured ({variable})")
    probe = url.rstrip("/") + "/-/ready"
    try:
        r = httpx.get(probe, timeout=5.0)
    except httpx.HTTPError as exc:
        return Check(name, "fail", f"{probe} unreachable: {exc}", f"systemctl start {unit}; check {variable}")
    if r.status_code != 200:
        return Check(name, "fail", f"{probe} answered {r.status_code}", f"journalctl -u {unit}")
    return Check(name, "ok", f"{probe} ready")


def slurm_cli() -> SlurmCli:
    """The Slurm client tools as the engine runs them (CORRAL_SLURM_CONF, not this shell's
    SLURM_CONF); a timeout that is no number gives the default here (the server refuses it)."""
    from corral.engine.slurm.engine import cli_from_env

    return cli_from_env(strict=False)


def _conf_hint() -> str:
    conf = os.environ.get("CORRAL_SLURM_CONF")
    return (
        f"check CORRAL_SLURM_CONF ({conf})" if conf else "set CORRAL_SLURM_CONF to the cluster's slurm.conf"
    )


def check_slurm(settings: Settings) -> Check:
    from corral.engine.base import EngineUnavailable

    if settings.engine != "slurm":
        return Check("slurm", "skip", "local engine")
    missing = [t for t in ("sbatch", "squeue", "sinfo", "scancel", "scontrol") if shutil.which(t) is None]
    if missing:
        return Check("slurm", "fail", f"{', '.join(missing)} not on PATH", "apt-get install slurm-client")
    fix = f"systemctl status slurmctld; {_conf_hint()}"
    try:
        r = slurm_cli().run("sinfo", "--noheader", "-o", "%P")
    except EngineUnavailable as exc:
        return Check("slurm", "fail", str(exc), fix)
    if r.returncode != 0 or not r.stdout.strip():
        return Check(
            "slurm", "fail", f"slurmctld not answering: {r.message or 'sinfo lists no partition'}", fix
        )
    partitions = r.stdout.split()
    wanted = os.environ.get("CORRAL_SLURM_PARTITION")
    if wanted and wanted not in {p.rstrip("*") for p in partitions}:
        return Check(
            "slurm",
            "fail",
            f"CORRAL_SLURM_PARTITION={wanted}: Slurm has no such partition (it has {' '.join(partitions)})",
            "set CORRAL_SLURM_PARTITION to one of them, or unset it for the default partition",
        )
    return Check("slurm", "ok", f"partitions: {' '.join(partitions)}")


def check_slurm_users(settings: Settings) -> Check:
    """CORRAL_SLURM_USER_MAP: unset, every job is refused at launch (engine/slurm/users.py); a
    file the engine cannot read or parse stops the server at start-up."""
    from corral.engine.slurm.users import USER_MAP_SETTING, UnmappedUser, UserMap

    if settings.engine != "slurm":
        return Check("slurm users", "skip", "local engine")
    fix = f"{USER_MAP_SETTING}=same (Corral user = Unix account) or a YAML file of corral_user: unix_account"
    try:
        users = UserMap.from_env()
    except (UnmappedUser, ValueError) as exc:
        return Check("slurm users", "fail", str(exc), fix)
    if users.source is None:
        return Check("slurm users", "fail", f"{USER_MAP_SETTING} is unset: every job is refused", fix)
    return Check("slurm users", "ok", f"jobs run as mapped Unix accounts ({users.describe()})")


def check_slurm_groups(settings: Settings) -> Check:
    """Slurm gives a job its account's own Unix groups, not the gids Corral gave its groups' dirs
    (docs/storage.md, "Identities"): each Corral group with a gid needs a Unix group of that gid
    that lists its members' mapped accounts. Checked in this host's group database (the engine's
    view at launch); the nodes need the same."""
    from corral.engine.slurm.users import UserMap, corral_unix_names, foreign_gid, gid_name, unix_group_fix

    if settings.engine != "slurm":
        return Check("slurm groups", "skip", "local engine: it gives jobs their groups' gids itself")
    from corral.db.session import is_sqlite
    from corral.ops.backup import sqlite_path

    if is_sqlite(settings.db_url) and not sqlite_path(settings.db_url).exists():  # connecting makes it
        return Check("slurm groups", "skip", "no database yet: no Corral group has a gid")
    try:
        groups = _groups_with_gids(settings)
    except Exception as exc:  # the database check says what is wrong with it
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return Check("slurm groups", "skip", f"cannot read Corral's groups: {first_line}")
    if not groups:
        return Check("slurm groups", "ok", "no Corral group has a gid yet (given at its first job)")
    try:
        users: UserMap | None = UserMap.from_env()
    except ValueError:  # a bad map: the "slurm users" check says so
        users = None
    mapped = users if users is not None and users.source is not None else None
    gaps, fixes, foreign, unchecked = [], [], [], set()
    for group in groups:
        unix_name = gid_name(group.gid)
        if unix_name is not None and unix_name not in corral_unix_names(group.name, group.gid):
            foreign.append(
                f"group {group.name} (gid {group.gid}): {foreign_gid(group.name, group.gid, unix_name)}"
            )
            continue
        lacking, skipped = _accounts_lacking(mapped, group) if mapped else ([], set(group.members))
        unchecked |= skipped
        if lacking or unix_name is None:
            missing, fix = unix_group_fix(group.name, group.gid, lacking)
            gaps.append(f"group {group.name} (gid {group.gid}): {missing}")
            fixes.append(fix or "")
    if foreign:  # no command: adding accounts to the host's own group would give them its rights
        return Check(
            "slurm groups",
            "fail",
            "; ".join(foreign + gaps),
            "give Corral a CORRAL_GID_RANGE that no Unix group of the host or the nodes uses, and "
            "move the groups above off those gids (docs/storage.md, Identities)",
        )
    if mapped is None:  # nothing to say of the members: "slurm users" fails beside this
        why = "is unset" if users is not None else "cannot be read"
        not_checked = f"members' accounts not checked: CORRAL_SLURM_USER_MAP {why} (see slurm users)"
    else:
        not_checked = f"not checked, no Unix account (refused at launch): {', '.join(sorted(unchecked))}"
    if not gaps:
        if mapped is None:
            return Check(
                "slurm groups",
                "skip",
                f"{plural(len(groups), 'group')}: each gid is a Unix group; {not_checked}",
            )
        detail = f"{plural(len(groups), 'group')}: each gid is a Unix group of its members' accounts"
        return Check("slurm groups", "ok", detail + (f"; {not_checked}" if unchecked else ""))
    return Check(
        "slurm groups",
        "warn",
        "; ".join(gaps)
        + ": their jobs get 'Permission denied' in /group/<name>"
        + (f"; {not_checked}" if unchecked else ""),
        "; ".join(fixes) + " (as root, here and on every node; or the same in LDAP)",
    )


def _accounts_lacking(users: UserMap, group: GroupGid) -> tuple[list[str], set[str]]:
    """The Unix accounts of `group`'s members that are not in its gid, and the members that have
    no Unix account to check (unmapped, or gone from this host)."""
    from corral.engine.slurm.users import UnmappedUser, lacks_gid

    lacking, unchecked = [], set()
    for member in group.members:
        try:
            account = users.account(member)
        except UnmappedUser:  # its jobs are refused at launch ("slurm users" says why)
            unchecked.add(member)
            continue
        if lacks_gid(account, group.gid):
            lacking.append(account.name)
    return lacking, unchecked


def _groups_with_gids(settings: Settings) -> list[GroupGid]:
    import sqlalchemy as sa
    from sqlalchemy.orm import Session

    from corral.db.session import make_engine
    from corral.storage.identities import groups_with_gids

    engine = make_engine(settings.db_url, poolclass=sa.pool.NullPool)
    try:
        with Session(engine) as session:
            return groups_with_gids(session)
    finally:
        engine.dispose()


# What the local engine's cgroups enforce and Slurm enforces only when told to (slurm.conf's
# TaskPlugin, cgroup.conf): the setting, the value needed, and what goes unenforced without it.
SLURM_CONFINEMENT = (
    ("ConstrainRAMSpace", "yes", "a job over its memory runs on (the local engine OOM-kills it)"),
    ("ConstrainDevices", "yes", "a job can open every GPU of its node, not only its own"),
)


def check_slurm_confinement() -> Check:
    """Whether Slurm confines jobs as the local engine does: task/cgroup with RAM and devices
    constrained (`scontrol show config` prints cgroup.conf's settings too)."""
    from corral.engine.base import EngineUnavailable

    try:
        r = slurm_cli().run("scontrol", "show", "config")
    except EngineUnavailable as exc:
        return Check("cgroups", "warn", f"cannot read Slurm's configuration: {exc}", _conf_hint())
    if r.returncode != 0:
        return Check("cgroups", "warn", f"`scontrol show config` failed: {r.message}", _conf_hint())
    config = {}
    for line in r.stdout.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
    task_plugin = config.get("TaskPlugin", "")
    if "task/cgroup" not in task_plugin:
        return Check(
            "cgroups",
            "warn",
            f"Slurm confines no job (TaskPlugin={task_plugin or 'unset'}): "
            "neither memory nor GPUs are enforced",
            "TaskPlugin=task/cgroup in slurm.conf, "
            "ConstrainRAMSpace=yes and ConstrainDevices=yes in cgroup.conf",
        )
    unset = [
        (key, want, what) for key, want, what in SLURM_CONFINEMENT if config.get(key, "").lower() != want
    ]
    if unset:
        return Check(
            "cgroups",
            "warn",
            "; ".join(f"{key}={config.get(key) or 'unset'}: {what}" for key, _, what in unset),
            " and ".join(f"{key}={want}" for key, want, _ in unset) + " in cgroup.conf",
        )
    return Check("cgroups", "ok", "Slurm's task/cgroup constrains jobs' memory and devices")
