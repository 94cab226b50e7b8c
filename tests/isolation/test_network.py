"""Job network isolation on the local engine: a job's own network namespace (shared by its
instances) cannot reach what listens on the host's loopback; outbound `internet` goes through
slirp4netns with the host loopback still blocked; nothing of the namespace outlives the job.
Real servers, real PostgreSQL, real namespaces; each probe is checked against a host-network
control run, so a probe that cannot connect at all fails the test."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from corral.config import Settings
from corral.engine.base import AttemptLaunch, AttemptPhase, FailureReason, InstanceLaunch
from corral.engine.isolation.netns import NetworkPolicy, connect_inside, namespace_path
from corral.engine.local import LocalEngine
from tests.engine.contract import new_attempt_id, wait_finished, wait_log
from tests.engine.local_support import local_engine_factory
from tests.pg import PostgresServer, postgres_server
from tests.server_fixture import CorralServer, start_server
from tests.support import require, require_binary

pytestmark = pytest.mark.isolation
__all__ = ["postgres_server"]

# Tries each host:port given; one line per target: "<target> CONNECTED" or "<target> blocked ...".
PROBE = (
    "import socket, sys\n"
    "for target in sys.argv[1:]:\n"
    "    host, port = target.rsplit(':', 1)\n"
    "    s = socket.socket(); s.settimeout(3)\n"
    "    try:\n"
    "        s.connect((host, int(port))); print(target, 'CONNECTED')\n"
    "    except OSError as e:\n"
    "        print(target, 'blocked', type(e).__name__, e)\n"
    "    s.close()\n"
)
SLIRP_HOST_LOOPBACK = "10.0.2.2"  # slirp's gateway: the host's 127.0.0.1 unless disabled


@pytest.fixture
def engines(tmp_path: Path) -> Iterator[Callable[..., LocalEngine]]:
    """make(network, outbound): an engine with that policy, each on its own home."""
    require_binary("bwrap")
    require_binary("slirp4netns")
    with ExitStack() as stack:

        def make(network: str = "isolated", outbound: str = "none") -> LocalEngine:
            home = tmp_path / f"home-{network}-{outbound}"
            factory = stack.enter_context(
                local_engine_factory(home, job_network=network, job_outbound=outbound)
            )
            engine = factory()
            caps = engine.capabilities()
            require(caps.sandbox and caps.network == network, f"bwrap and {network} network")
            return engine

        yield make


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP service on the host's loopback, like PostgreSQL or Prometheus would be."""
    sock = socket.create_server(("127.0.0.1", 0), backlog=16)
    yield sock
    sock.close()


def external_address() -> str | None:
    """A non-loopback IPv4 address of this machine, if it has one."""
    out = subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True
    )
    for line in out.stdout.splitlines():
        return line.split()[3].split("/")[0]
    return None


def launch(command: str, instances: int = 1) -> AttemptLaunch:
    aid = new_attempt_id()
    insts = tuple(
        InstanceLaunch("worker", r, r, "node-a", (), 1.0, 256, command, {"RANK": str(r)})
        for r in range(instances)
    )
    return AttemptLaunch(aid, aid.split(".")[0], 1, "alice", "team", insts)


def probe(engine: LocalEngine, targets: list[str]) -> dict[str, str]:
    """Runs PROBE as a job; {target: its line}."""
    job = launch(f'{sys.executable} -c "{PROBE}" {" ".join(targets)}')
    engine.launch(job)
    status = wait_finished(engine, job.attempt_id, 30)
    out = engine.logs(job.attempt_id, 0).data.decode(errors="replace")
    assert status.phase is AttemptPhase.SUCCEEDED, (status, out)
    lines = {
        line.split()[0]: line for line in out.splitlines() if line.split()[:1] and ":" in line.split()[0]
    }
    assert set(lines) == set(targets), out
    return lines


def namespaces_with_inode(inode: int) -> list[int]:
    """Pids of every process in the network namespace with this inode."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}/ns/net").st_ino == inode:
                    found.append(int(entry))
            except OSError:
                continue
    return found


def slirps_for(pid: int) -> list[int]:
    """slirp4netns processes attached to the namespace of process `pid`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv[0].endswith(b"slirp4netns") and str(pid).encode() in argv:
                found.append(int(entry))
    return found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CorralServer]:
    """A real server with default settings (one for the module: a start costs seconds)."""
    srv = start_server(tmp_path_factory.mktemp("netiso") / "home")
    try:
        yield srv
    finally:
        srv.stop()


def test_job_cannot_reach_the_api_postgresql_or_a_loopback_service(
    server: CorralServer,
    engines: Callable[..., LocalEngine],
    listener: socket.socket,
    postgres_server: PostgresServer,
) -> None:
    targets = [
        f"127.0.0.1:{server.port}",
        f"127.0.0.1:{postgres_server.port}",
        f"127.0.0.1:{listener.getsockname()[1]}",
    ]
    control = probe(engines("host"), targets)
    assert all("CONNECTED" in line for line in control.values()), control
    for outbound in ("none", "internet"):
        isolated = probe(engines("isolated", outbound), targets)
        assert not any("CONNECTED" in line for line in isolated.values()), (outbound, isolated)
        assert all("ConnectionRefused" in line for line in isolated.values()), isolated


def test_server_jobs_are_isolated_by_default(server: CorralServer) -> None:
    """Through the API of a server with default settings: its job cannot reach the server."""
    assert Settings(_env_file=None).job_network == "isolated"  # type: ignore[call-arg]
    with server.client() as c:
        target = f"127.0.0.1:{server.port}"
        spec = {"name": "n", "tasks": {"main": {"command": f'{sys.executable} -c "{PROBE}" {target}'}}}
        r = c.post("/api/v1/jobs", json=spec)
        assert r.status_code == 201, r.text
        job_id = r.json()["id"]
        deadline = time.monotonic() + 30
        while c.get(f"/api/v1/jobs/{job_id}").json()["state"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline, "the probe job did not finish"
            time.sleep(0.1)
        out = c.get(f"/api/v1/jobs/{job_id}/logs", params={"rank": 0}).json()["data"]
        assert f"{target} blocked ConnectionRefusedError" in out, out
        assert c.get("/api/v1/nodes").status_code == 200  # the server does listen there


def test_instances_of_one_job_share_their_namespace(engines: Callable[..., LocalEngine]) -> None:
    """Rank 1 reaches rank 0's port on 127.0.0.1 (MASTER_ADDR of the local node); the host does not."""
    engine = engines("isolated", "none")
    port = 29517
    rank0 = (
        "import socket; s = socket.create_server(('127.0.0.1', PORT)); print('listening', flush=True); "
        "c, _ = s.accept(); print('rank 0 got', c.recv(100).decode(), flush=True)"
    ).replace("PORT", str(port))
    rank1 = (
        "import socket, time\n"
        "for _ in range(200):\n"
        "    try:\n        c = socket.create_connection(('127.0.0.1', PORT)); break\n"
        "    except OSError:\n        time.sleep(0.05)\n"
        "c.sendall(b'hello from rank 1'); print('rank 1 sent')\n"
    ).replace("PORT", str(port))
    script = f'if [ "$RANK" = 0 ]; then {sys.executable} -c "{rank0}"; else {sys.executable} -c "{rank1}"; fi'
    job = launch(script, instances=2)
    engine.launch(job)
    wait_log(engine, job.attempt_id, b"listening", rank=0)
    with pytest.raises(ConnectionRefusedError):  # rank 0's port exists only inside the job
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    status = wait_finished(engine, job.attempt_id, 30)
    out0 = engine.logs(job.attempt_id, 0).data.decode()
    out1 = engine.logs(job.attempt_id, 1).data.decode()
    assert status.phase is AttemptPhase.SUCCEEDED, (status, out0, out1)
    assert "rank 0 got hello from rank 1" in out0 and "rank 1 sent" in out1


def test_a_proxy_on_the_host_reaches_a_jobs_port_from_inside_its_namespace(
    engines: Callable[..., LocalEngine],
) -> None:
    """The hook left for JupyterLab and port-forward: the host connects INTO the job's
    namespace (`connect_inside`), while the job's port stays closed on the host's loopback."""
    engine = engines("isolated", "none")
    port = 28731
    server = (
        "import socket; s = socket.create_server(('127.0.0.1', PORT)); print('listening', flush=True); "
        "c, _ = s.accept(); print('job got', c.recv(100).decode(), flush=True)"
    ).replace("PORT", str(port))
    job = launch(f'{sys.executable} -c "{server}"')
    engine.launch(job)
    wait_log(engine, job.attempt_id, b"listening")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    sup = json.loads((engine.attempts_dir / job.attempt_id / "supervisor.json").read_text())["pid"]
    ours = os.stat("/proc/self/ns/net").st_ino
    with connect_inside(namespace_path(sup), port) as conn:
        conn.sendall(b"hello from the proxy")
    assert wait_finished(engine, job.attempt_id, 20).phase is AttemptPhase.SUCCEEDED
    assert b"job got hello from the proxy" in engine.logs(job.attempt_id, 0).data
    assert os.stat("/proc/self/ns/net").st_ino == ours  # this process stayed in its namespace


def test_internet_policy_reaches_out_but_not_the_host_loopback(
    engines: Callable[..., LocalEngine], listener: socket.socket
) -> None:
    address = external_address()
    require(address is not None, "a non-loopback IPv4 address on this machine")
    outside = socket.create_server((str(address), 0), backlog=16)
    try:
        loop_port = listener.getsockname()[1]
        targets = [
            f"{address}:{outside.getsockname()[1]}",
            f"127.0.0.1:{loop_port}",
            f"{SLIRP_HOST_LOOPBACK}:{loop_port}",
        ]
        engine = engines("isolated", "internet")
        internet = probe(engine, targets)
        assert "CONNECTED" in internet[targets[0]], internet
        assert "blocked" in internet[targets[1]] and "blocked" in internet[targets[2]], internet
        # The host's resolv.conf may name a resolver on its loopback: the job gets slirp's.
        resolv = launch("cat /etc/resolv.conf")
        engine.launch(resolv)
        wait_finished(engine, resolv.attempt_id)
        assert engine.logs(resolv.attempt_id, 0).data == b"nameserver 10.0.2.3\n"
        none = probe(engines("isolated", "none"), targets[:1])
        assert "blocked" in none[targets[0]] and "unreachable" in none[targets[0]], none
    finally:
        outside.close()


@pytest.mark.parametrize("end", ["finishes", "stopped_by_a_restarted_engine", "supervisor_killed"])
def test_nothing_of_the_namespace_outlives_the_job(engines: Callable[..., LocalEngine], end: str) -> None:
    """Neither slirp4netns nor any process in the job's namespace remains after the attempt:
    neither when it ends normally nor when its supervisor is SIGKILLed (the engine then declares
    it lost and kills its cgroups)."""
    engine = engines("isolated", "internet")
    job = launch("echo up; sleep 30")
    engine.launch(job)
    wait_log(engine, job.attempt_id, b"up")
    adir = engine.attempts_dir / job.attempt_id
    sup = json.loads((adir / "supervisor.json").read_text())["pid"]
    inode = os.stat(f"/proc/{sup}/ns/net").st_ino
    assert inode != os.stat("/proc/self/ns/net").st_ino
    assert len(namespaces_with_inode(inode)) >= 3  # supervisor, bwrap, its init, the job's shell
    assert len(slirps_for(sup)) == 1
    if end == "finishes":
        engine.stop(job.attempt_id, 0)
        assert wait_finished(engine, job.attempt_id, 20).reason is FailureReason.STOPPED
    elif end == "stopped_by_a_restarted_engine":  # a server restart: a new engine adopts it
        engine.close()
        adopter = LocalEngine(
            engine.home, "node-a", virtual_gpus=4, cgroup_parent=engine.cgroup_parent, job_outbound="internet"
        )
        try:
            assert job.attempt_id in adopter.found_at_start
            assert adopter.poll([job.attempt_id])[job.attempt_id].phase is AttemptPhase.RUNNING
            assert len(slirps_for(sup)) == 1  # the restart did not touch the job's network
            adopter.stop(job.attempt_id, 0)
            assert wait_finished(adopter, job.attempt_id, 20).reason is FailureReason.STOPPED
        finally:
            adopter.close()
    else:
        os.kill(sup, signal.SIGKILL)
        assert wait_finished(engine, job.attempt_id, 20).reason is FailureReason.NODE_LOST
    deadline = time.monotonic() + 5
    while (namespaces_with_inode(inode) or slirps_for(sup)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert namespaces_with_inode(inode) == [] and slirps_for(sup) == []


def test_a_network_that_cannot_be_made_fails_the_attempt_clearly(
    engines: Callable[..., LocalEngine],
) -> None:
    engine = engines("isolated", "internet")
    engine.network.slirp4netns = "/nonexistent/slirp4netns"
    job = launch("echo should-not-run")
    engine.launch(job)
    status = wait_finished(engine, job.attempt_id, 20)
    assert status.phase is AttemptPhase.FAILED and status.reason is FailureReason.LAUNCH_FAILED
    assert "could not set up the job's network" in status.message and "slirp4netns" in status.message
    assert b"should-not-run" not in engine.logs(job.attempt_id, 0).data


def test_bad_network_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="job_network"):
        Settings(job_network="bridge")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="job outbound 'all' is not one of none, internet"):
        NetworkPolicy("isolated", "all")


def test_a_node_without_slirp4netns_refuses_internet_jobs_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "bin"
    path.mkdir()
    for tool in ("unshare", "true"):  # what the probe runs; no slirp4netns
        (path / tool).symlink_to(require_binary(tool))
    monkeypatch.setenv("PATH", str(path))
    policy = NetworkPolicy("isolated", "internet").probe()
    assert policy.problems == ["outbound policy 'internet' needs slirp4netns: apt-get install slirp4netns"]
    assert policy.spec() is None and policy.summary().startswith("NO network isolation")
    with local_engine_factory(tmp_path / "home", job_outbound="internet") as make:
        engine = make()
        assert engine.refusing and engine.capabilities().network == "host"
        (node,) = engine.nodes()
        assert "needs slirp4netns" in node.message
        job = launch("echo should-not-run")
        engine.launch(job)
        status = wait_finished(engine, job.attempt_id, 10)
        assert status.reason is FailureReason.LAUNCH_FAILED and "slirp4netns" in status.message
