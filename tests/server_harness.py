"""Start a real Corral server as a subprocess and stop it again (tests and bench/ scripts; test
code, not shipped in the `corral` package).

    srv = start_server(extra_env={"CORRAL_FOO": "1"})   # free loopback port, temp CORRAL_HOME
    srv.url, srv.token, srv.home, srv.pid, srv.client()
    srv.kill(); srv.start()                              # SIGKILL, start again (same home/port)
    srv.stop()                                           # SIGTERM, then SIGKILL; job processes too

The server runs `python -m corral.server` with the local engine, N virtual GPUs (default 4, model
"VGPU") and SQLite under the home, or the database URL given. Its stdout/stderr go to
`<home>/server.log` (`srv.log_text()`). The admin token is read from the CLI config the server
writes on first start (it prints where, not the token). Job supervisors are detached from the
server on purpose (they outlive it), so `stop()` also ends the job processes started under this
home.

A server on SQLite started on a home without a database gets a copy of one the harness migrated
once per process (`tests.support.copy_migrated_sqlite`; the server's own `init_db` then finds it
at head): the migrations cost seconds per start. `corral up` (via_cli) and `--demo` starts migrate
a fresh home themselves, as a first start does.

Jobs run sandboxed (bubblewrap, cgroups). Only outside CI (`tests.support.in_ci()`) may a server
fall back to running them unsandboxed on a machine without isolation (CORRAL_ALLOW_UNISOLATED);
in CI a machine without isolation fails at start-up, naming what is missing, instead of letting
the suites pass without the sandbox they claim to test.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from tests.support import copy_migrated_sqlite, free_port, in_ci

TOKEN_LINE = re.compile(r"Admin token \(shown once\): (\S+)")
TOKEN_FILE_LINE = re.compile(r"Admin token written to (\S+)")
READY_TIMEOUT_S = 60.0
# How the local engine reports a node that refuses jobs for want of isolation (engine/local/engine.py)
NO_ISOLATION = "job isolation unavailable"


@dataclass
class CorralServer:
    home: Path
    port: int
    env: dict[str, str]
    args: list[str] = field(default_factory=list)
    via_cli: bool = False  # start with `corral up` (the CLI) instead of `python -m corral.server`
    token: str = ""
    proc: subprocess.Popen[bytes] | None = None
    _own_home: bool = False

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "server not started"
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.home / "server.log"

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def client(self, token: str | None = None, timeout: float = 10.0) -> httpx.Client:
        """An httpx client on the server's URL with `Authorization: Bearer <token>` (admin default)."""
        return httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token or self.token}"}, timeout=timeout
        )

    # -- life cycle -----------------------------------------------------------------------------

    def start(self, timeout_s: float = READY_TIMEOUT_S) -> CorralServer:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                *(["corral.cli.main", "up"] if self.via_cli else ["corral.server"]),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *self.args,
            ],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"corral server exited with {self.proc.returncode}:\n{self.log_text()[-4000:]}"
                )
            if not self.token:
                self.token = admin_token(self.log_text())
            if self.token and self._nodes_ready():
                return
            time.sleep(0.1)
        raise TimeoutError(f"corral server not ready after {timeout_s} s:\n{self.log_text()[-4000:]}")

    def _nodes_ready(self) -> bool:
        """Ready = the API answers and the node loop has registered at least one node. A node
        that refuses jobs for want of isolation never becomes usable: fail at once, saying why."""
        try:
            with self.client(timeout=2.0) as c:
                r = c.get("/api/v1/nodes")
        except httpx.HTTPError:
            return False
        if r.status_code != 200:
            return False
        refusing = [f"{n['name']}: {n['message']}" for n in r.json() if NO_ISOLATION in n["message"]]
        if refusing:
            raise RuntimeError(
                "the server refuses to run jobs unsandboxed ("
                + "; ".join(refusing)
                + "); install bubblewrap and give it cgroups, or run outside CI"
            )
        return len(r.json()) > 0

    def kill(self) -> None:
        """SIGKILL the server only (its jobs keep running under their supervisors)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self, timeout_s: float = READY_TIMEOUT_S) -> CorralServer:
        self.kill()
        return self.start(timeout_s)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, wait up to `timeout_s`, then SIGKILL; then stop leftover job processes."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        _kill_job_processes(self.home)
        # The home's cgroups: the server's close() keeps them while jobs run, and the jobs were
        # killed only now (one empty corral-<hometag> per home in each controller otherwise).
        from corral.engine.local.process_files import home_tag
        from tests.engine.local_support import remove_cgroup_tree

        remove_cgroup_tree(Path("/sys/fs/cgroup"), f"corral-{home_tag(self.home)}", wait_s=2.0)
        if self._own_home:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> CorralServer:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def _kill_job_processes(home: Path, grace_s: float = 5.0) -> None:
    """Job supervisors run in their own sessions; find them by their attempt dir under `home`.
    SIGTERM first (the supervisor stops its tasks and removes their cgroups), SIGKILL what is left."""
    import psutil

    marker = str(home / "engine")
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or []) and proc.pid != os.getpid():
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    if not found:
        return
    everything = list(found)
    for proc in found:
        try:
            everything.extend(proc.children(recursive=True))
            proc.terminate()
        except psutil.NoSuchProcess:
            continue
    _gone, alive = psutil.wait_procs(found, timeout=grace_s)
    for proc in [*alive, *everything]:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            continue


def admin_token(log_text: str) -> str:
    """The bootstrap admin token: from the CLI config the server wrote (it does not print the
    token then), else from the line it prints when it could not write one; "" before either."""
    written = TOKEN_FILE_LINE.search(log_text)
    if written:
        loaded = yaml.safe_load(Path(written.group(1)).read_text()) or {}
        return str(loaded.get("token", ""))
    shown = TOKEN_LINE.search(log_text)
    return shown.group(1) if shown else ""


def server_env(
    home: Path,
    *,
    database_url: str | None,
    virtual_gpus: int,
    extra_env: Mapping[str, str] | None,
    allow_unisolated: bool | None = None,
) -> dict[str, str]:
    """The server's environment: this process's, less any CORRAL_* setting, plus the harness's.
    `allow_unisolated` None means: only outside CI (see the module's docstring)."""
    if allow_unisolated is None:
        allow_unisolated = not in_ci()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORRAL_")}
    env.update(
        {
            "CORRAL_HOME": str(home),
            "CORRAL_VIRTUAL_GPUS": str(virtual_gpus),
            "CORRAL_GPU_MODEL": "VGPU",
            "CORRAL_NODE_NAME": "local",
            "CORRAL_ALLOW_UNISOLATED": "true" if allow_unisolated else "false",
            "CORRAL_LOG_LEVEL": "INFO",
            "CORRAL_SSH_GATEWAY_PORT": "0",  # off: tests that use it pass a free port
            # JupyterLab on the portal's origin: tests of the workspace origin pass a free port
            "CORRAL_WORKSPACE_PORT": "0",
            "PYTHONUNBUFFERED": "1",
        }
    )
    if database_url:
        env["CORRAL_DATABASE_URL"] = database_url
    env.update(extra_env or {})
    return env


def start_server(
    home: Path | str | None = None,
    *,
    database_url: str | None = None,
    virtual_gpus: int = 4,
    extra_env: Mapping[str, str] | None = None,
    demo: bool = False,
    port: int | None = None,
    token: str = "",
    via_cli: bool = False,
    allow_unisolated: bool | None = None,
    timeout_s: float = READY_TIMEOUT_S,
) -> CorralServer:
    """Start a server and wait until it serves the API and has registered its node. Pass `token`
    when the database already has its admin (a second server on the same database);
    `allow_unisolated=False` to require the sandbox outside CI too (benchmarks of it)."""
    own = home is None
    path = Path(tempfile.mkdtemp(prefix="corral-test-")) if home is None else Path(home)
    path.mkdir(parents=True, exist_ok=True)
    if database_url is None and not (via_cli or demo) and not (path / "corral.db").exists():
        copy_migrated_sqlite(path / "corral.db")
    server = CorralServer(
        home=path,
        port=port or free_port(),
        env=server_env(
            path,
            database_url=database_url,
            virtual_gpus=virtual_gpus,
            extra_env=extra_env,
            allow_unisolated=allow_unisolated,
        ),
        args=["--demo"] if demo else [],
        token=token,
        via_cli=via_cli,
        _own_home=own,
    )
    return server.start(timeout_s)
