"""`serve(settings, demo)`: the one Corral server process.

Order of start: migrate the database, bootstrap the admin (token printed once, CLI config
written), build the execution engine, then start the control loops on threads and uvicorn in the
main thread. SIGTERM/SIGINT stop uvicorn gracefully (it finishes in-flight requests); then the
loops stop, their leases are released and the engine is closed. Running jobs are not touched:
the engine's supervisors outlive the server and are re-adopted on the next start.

Environment knobs besides the CORRAL_* settings: CORRAL_LOG_LEVEL (INFO),
CORRAL_NODE_HEARTBEAT_TIMEOUT_S (6: a silent node is down after this), and
CORRAL_PROFILE_SAMPLES=<file> (sample where the server's threads spend their time; see sampler.py).
At shutdown each loop logs its ticks, wall and CPU seconds.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import secrets
import signal
import socket
import sys
import threading
from typing import TYPE_CHECKING

import uvicorn
from sqlalchemy import Engine as DatabaseEngine
from sqlalchemy.orm import Session, sessionmaker

from corral.config import (
    PUBLIC_URL_ENV,
    Settings,
    loopback_host,
    url_host,
    workspace_origin_problem,
    workspace_origin_warning,
)
from corral.server import profiling
from corral.server.context import ServerContext
from corral.server.dispatch import shutdown_launches
from corral.server.reconcile import adopt_once
from corral.server.runner import LoopRunner, collect_loops
from corral.server.sampler import StackSampler
from corral.services.auth import on_credentials_changed
from corral.services.open_sessions import OpenSessions
from corral.services.session_use import SessionUse

if TYPE_CHECKING:
    from corral.gateway.ssh import Gateway

log = logging.getLogger("corral.server")


def owner_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def write_cli_config(settings: Settings, url: str, token: str) -> str:
    """Write the CLI config (mode 0600) with the platform's writer; returns where it went."""
    from corral.sdk import write_cli_config as write

    return str(write(url, token, home=settings.home))


def bootstrap(settings: Settings, session_factory: sessionmaker[Session], url: str) -> None:
    from corral.services.auth import ADMIN_USER, bootstrap_admin_with_password

    with session_factory() as session:
        created = bootstrap_admin_with_password(session, settings)
    if created is None:
        refresh_cli_config_url(settings, url)
        return
    token, password = created
    try:
        where = write_cli_config(settings, url, token)
    except Exception as exc:  # nowhere else to keep it: shown once, to configure the CLI by hand
        print(f"Admin token (shown once): {token}", flush=True)
        print(f"CLI config not written: {exc}", flush=True)
    else:
        # Not printed: the server's output ends up in logs and journals that others may read.
        print(f"Admin token written to {where} (readable by this user only; the CLI uses it)", flush=True)
    # Printed once, for the first portal login; the admin changes it at once with `corral user passwd`.
    print(f"Admin password (shown once; portal user {ADMIN_USER!r}): {password}", flush=True)
    print("  change it with `corral user passwd`", flush=True)


def refresh_cli_config_url(settings: Settings, url: str) -> None:
    """Point the home's CLI config at this server when it names another port on this machine.

    The token in it is still valid (same database), but a server restarted on another port (a
    second `./run demo --port N` on the same home) would otherwise leave `corral ls` calling the
    old one. A URL an admin set by hand to another host (a public name, TLS proxy) is left alone."""
    from urllib.parse import urlsplit

    from corral.sdk import config_path, load_cli_config, write_cli_config

    if not config_path(settings.home).exists():
        return
    current = load_cli_config(settings.home, env={})
    if current.token is None or current.url == url:
        return
    try:
        host = urlsplit(current.url).hostname
    except ValueError:  # a url that is none (`http://[::1`): left alone, not a crash at start-up
        return
    if host is None or not loopback_host(host):
        return
    write_cli_config(url, current.token, home=settings.home)
    log.info("CLI config %s now points at %s (was %s)", config_path(settings.home), url, current.url)


class PortInUse(RuntimeError):
    """The server's listen address cannot be bound; raised before anything is written."""


def bind_listen_socket(host: str, port: int, setting: str = "--port / CORRAL_PORT") -> socket.socket:
    """Bind the API's socket first, before the database or the demo data are touched, so that a
    port already in use fails at once with a clear message and leaves nothing behind. uvicorn then
    serves on this very socket (no window in which another process could take the port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does (TIME_WAIT restarts)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        why = "the address is already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        raise PortInUse(
            f"cannot listen on {url_host(host)}:{port}: {why}. Is another Corral server (or another program) "
            f"using it? Stop it or pick another port with {setting}. Nothing was written."
        ) from exc
    sock.listen(2048)
    # Not inheritable (Python's default): job supervisors started by this server must not hold
    # the port, or a restarted server could not listen on it while those jobs run.
    return sock


def local_url(settings: Settings) -> str:
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    return f"{settings.scheme}://{url_host(host)}:{settings.port}"


def _note_signal(signum: int, _frame: object) -> None:
    log.info("received signal %d; shutting down", signum)


# Young objects collected per allocation burst: Python's default (700) ran ~40 collections a second
# at 60 submitted jobs/s, and they stop every thread while they run.
GC_GEN0_THRESHOLD = 20_000


def tune_gc() -> None:
    """Collect less often, and never rescan what start-up built (modules, the app, the engine).
    Measured: at 60 jobs/s the server's GC time fell from ~7% of its CPU, with pauses up to
    160 ms, to ~2% with pauses up to ~50 ms; bench/api_load.py's p99 fell from 54-77 ms to
    17-43 ms. For server processes only (a test process that builds many apps would keep the
    frozen ones forever)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def prepare_storage(settings: Settings) -> None:
    """The storage root's layout (corral.storage.layout), and id ranges that make sense, before
    any job runs: a bad CORRAL_UID_RANGE refuses start-up instead of the first launch."""
    from corral.storage.layout import ensure_layout
    from corral.storage.plan import id_ranges

    id_ranges(settings)
    ensure_layout(settings.storage_path, settings.engine)


def _workspace_origin_or_exit(settings: Settings) -> None:
    """CORRAL_WORKSPACE_ORIGIN needs the portal's address as people reach it (CORRAL_PUBLIC_URL,
    read before the server sets its local address there as a default), and over https a host name
    other than the portal's: refused in one line, before anything is written. The same host name
    over plain http off loopback is served, with a warning in the log (corral.config)."""
    public_url = os.environ.get(PUBLIC_URL_ENV)
    problem = workspace_origin_problem(settings, public_url)
    if problem is not None:
        print(f"error: {problem}. Nothing was written.", file=sys.stderr, flush=True)
        raise SystemExit(1)
    warning = workspace_origin_warning(settings, public_url)
    if warning is not None:
        log.warning("%s", warning)


def _metrics_token_or_exit(settings: Settings) -> None:
    """A CORRAL_METRICS_TOKEN of blanks only, or a CORRAL_METRICS_TOKEN_FILE that cannot be read
    or is empty, refuses start-up in one line before anything is written (the app's MetricsGuard
    reads it again; found only there, it was a traceback after the home, database and secrets key
    were written, review127 #2)."""
    from corral.api.metrics_auth import metrics_token

    try:
        metrics_token(settings)
    except ValueError as exc:
        print(f"error: {exc}. Nothing was written.", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _tls_or_exit(settings: Settings) -> None:
    """Load the certificate and key uvicorn will serve now: a missing or bad file refuses start-up in
    one line, before anything is written (uvicorn's own load came after the banner, the first
    admin token and the loops' start, as a traceback)."""
    if settings.ssl_certfile is None or settings.ssl_keyfile is None:
        return
    import ssl

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(settings.ssl_certfile, settings.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        files = f"CORRAL_SSL_CERTFILE={settings.ssl_certfile}, CORRAL_SSL_KEYFILE={settings.ssl_keyfile}"
        print(f"error: {files}: cannot load them: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def _secrets_key_or_exit(settings: Settings) -> None:
    """The job secrets' key (corral.services.secrets): generated into the home at first start
    when none is configured; a bad one refuses start-up, naming the setting or file."""
    from corral.services.secrets import SecretKeyError, box_for

    try:
        box_for(settings)
    except SecretKeyError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1)


def serve(settings: Settings, demo: bool = False) -> None:
    """Run the API and the control loops until SIGTERM/SIGINT."""
    _configure_logging()
    profiling.start()  # CORRAL_PROFILE_OUT: cProfile of every thread (off by default)
    if demo:
        from corral.server.demo import demo_settings

        settings = demo_settings(settings)
    _workspace_origin_or_exit(settings)
    _metrics_token_or_exit(settings)
    _tls_or_exit(settings)
    listen_socket = _listen_or_exit(settings)
    sockets = [listen_socket, *_workspace_listener_or_exit(settings, listen_socket)]
    db_engine, session_factory = _prepare_home_and_database(settings)
    url = local_url(settings)
    os.environ.setdefault(PUBLIC_URL_ENV, url)  # alerts' runbook links (corral.monitor.runbooks)
    bootstrap(settings, session_factory, url)
    from corral.engine.factory import make_engine as make_execution_engine
    from corral.services import incident_paging

    incident_paging.install()  # an opened incident pages its on-call (docs/operations.md)
    prepare_storage(settings)
    engine = make_execution_engine(settings)
    storage_check = getattr(engine, "log_storage_check", None)  # Slurm: do the nodes see the root?
    if storage_check is not None:
        threading.Thread(target=storage_check, name="storage-check", daemon=True).start()
    ctx = ServerContext(
        settings=settings, session_factory=session_factory, engine=engine, owner_id=owner_id()
    )
    from corral.gateway.ssh import start_gateway

    session_use = SessionUse()  # sessions into jobs, the gateway's and exec's: idle reclamation
    # Exec, SSH and proxy sessions by credential: ended when it loses access (a revoke, ...).
    ctx.memory.open_sessions = OpenSessions()
    stop_waking = on_credentials_changed(lambda: ctx.wake("open-sessions"))
    gateway = start_gateway(settings, session_factory, engine, session_use, ctx.memory.open_sessions)
    runner = LoopRunner(ctx, collect_loops(engine))
    from corral.scheduler.compiled_build import describe as describe_scheduler_build

    log.info("scheduler: %s", describe_scheduler_build())  # the loops have imported it by now
    server = _api_server(settings, ctx, db_engine, gateway, session_use, runner)
    # uvicorn re-raises SIGTERM/SIGINT with the previous handler once it has shut down; with the
    # default handler that would kill the process before the loops stop and the leases are released.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _note_signal)
    try:  # before any loop runs: reattach to attempts launched before a restart
        adopt_once(ctx)
    except Exception:  # the reconcile loop tries again on its first tick
        log.exception("could not re-adopt running attempts yet")
    sampler = StackSampler.from_env()
    if sampler is not None:
        sampler.start()
    tune_gc()
    runner.start()
    try:
        if demo:
            from corral.server.demo import seed_demo

            seed_demo(ctx, url)
        print(f"Corral is up at {url}  (API docs: {url}/docs, portal: {url}/)", flush=True)
        print(workspace_line(settings), flush=True)
        server.run(sockets=sockets)
    finally:
        stop_waking()
        if gateway is not None:
            gateway.stop()
        runner.stop()
        shutdown_launches(ctx)
        engine.close()
        db_engine.dispose()
        if sampler is not None:
            sampler.stop()
        profiling.write()
        print("Corral stopped.", flush=True)


def _configure_logging() -> None:
    logging.basicConfig(
        level=os.environ.get("CORRAL_LOG_LEVEL", "INFO"),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.WARNING)  # its per-plugin INFO lines drown the banner


def _listen_or_exit(settings: Settings) -> socket.socket:
    try:
        return bind_listen_socket(settings.host, settings.port)
    except PortInUse as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1)


def _workspace_listener_or_exit(settings: Settings, portal: socket.socket) -> list[socket.socket]:
    """The workspace listener's socket (corral.workspaces.origin), bound before anything is
    written, as the portal's; none when CORRAL_WORKSPACE_PORT=0."""
    port = settings.workspace_listen_port
    if port == 0:
        return []
    try:
        return [bind_listen_socket(settings.host, port, setting="CORRAL_WORKSPACE_PORT")]
    except PortInUse as exc:
        portal.close()
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1)


def workspace_line(settings: Settings) -> str:
    """The banner's line on where workspaces are served."""
    port = settings.workspace_listen_port
    if port == 0:
        return (
            "Workspaces: on the portal's own origin (CORRAL_WORKSPACE_PORT=0): a workspace's "
            "JupyterLab can act as its owner on the API (docs/security.md)"
        )
    where = settings.workspace_origin or f"{local_url(settings).rsplit(':', 1)[0]}:{port}"
    return f"Workspaces: JupyterLab on their own origin, {where}; the portal hands browsers over"


def _prepare_home_and_database(settings: Settings) -> tuple[DatabaseEngine, sessionmaker[Session]]:
    """The home and its files secured, the configuration checked, the database migrated: a bad
    monitor.yml or secrets key refuses start-up (naming file and line) before any loop or job runs."""
    from corral.config import SecretFileError
    from corral.db.session import (
        DatabaseUnavailable,
        check_database,
        init_db,
        make_engine,
        make_session_factory,
    )
    from corral.monitor.config import MonitorConfigError, config_path, load_monitor_config
    from corral.ops.files import secure_home, secure_sqlite_file

    secure_home(settings.home)  # 0700: it holds the admin token and (SQLite) the database
    try:
        check_database(settings.db_url)
        secure_sqlite_file(settings.db_url)
        load_monitor_config(config_path(settings))
    except (DatabaseUnavailable, MonitorConfigError, SecretFileError) as exc:  # one line naming what
        print(f"error: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    _secrets_key_or_exit(settings)
    init_db(settings.db_url)
    db_engine = make_engine(settings.db_url)
    return db_engine, make_session_factory(db_engine)


def _api_server(
    settings: Settings,
    ctx: ServerContext,
    db_engine: DatabaseEngine,
    gateway: Gateway | None,
    session_use: SessionUse,
    runner: LoopRunner,
) -> uvicorn.Server:
    """The API app and the uvicorn server that will serve it on the bound socket."""
    from corral.api.app import create_app

    # The API's services tell the loops what they committed (a submit wakes the scheduler).
    app = create_app(settings, engine=ctx.engine, db_engine=db_engine, notifier=ctx)
    app.state.server_context = ctx
    app.state.ssh_gateway = gateway  # None when off
    app.state.session_use = ctx.memory.session_use = session_use
    app.state.open_sessions = ctx.memory.open_sessions
    session_use.on_close = lambda: ctx.wake("session-use")  # a close is persisted at once
    app.state.loop_health = lambda: runner.health(settings.ready_loop_stall_s)  # for /readyz
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_graceful_shutdown=5,
        timeout_keep_alive=settings.api_keep_alive_s,  # idle connections are closed (slow clients)
        ssl_certfile=str(settings.ssl_certfile) if settings.ssl_certfile else None,
        ssl_keyfile=str(settings.ssl_keyfile) if settings.ssl_keyfile else None,
        # Proxy headers only from the proxies an admin named (CORRAL_FORWARDED_ALLOW_IPS): with
        # uvicorn's default (on, trusting 127.0.0.1) any local process set its own source address.
        proxy_headers=bool(settings.forwarded_allow_ips),
        forwarded_allow_ips=settings.forwarded_allow_ips or None,
    )
    return uvicorn.Server(config)
