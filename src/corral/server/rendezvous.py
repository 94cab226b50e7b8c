"""Where every instance of a multi-role job can be reached, as environment variables (the way
OpenPAI gives each task the hosts and ports of every task role).

Every process of an attempt gets the same map:

    CORRAL_ROLES=ps,worker                      task roles, in the spec's order
    CORRAL_ROLE_PS_COUNT=1                      instances of the role
    CORRAL_ROLE_PS_HOSTS=10.0.0.5               host of each instance, by index within the role
    CORRAL_ROLE_PS_PORTS=31001                  the port reserved for each instance
    CORRAL_ROLE_PS_ADDRS=10.0.0.5:31001         host:port pairs, the same order
    ...the same for WORKER

and its own: CORRAL_HOST, CORRAL_PORT (the host and port other instances will use to reach it:
listen on CORRAL_PORT). `<ROLE>` is the role name in upper case with every character other than
a letter or digit replaced by `_` (`env_role("data-loader") == "DATA_LOADER"`).

Ports: on this machine (the local engine) a free port is picked per instance when the attempt is
launched; on other nodes a stable per-job guess in [30000, 50000), like MASTER_PORT's.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from corral.domain import InstancePlacement

LOCAL_ADDRESSES = ("127.0.0.1", "localhost", "::1")
REMOTE_PORT_BASE = 30000
REMOTE_PORT_SPAN = 20000


def env_role(role: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "_", role).upper()


def free_local_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def instance_port(address: str, job_id: int, rank: int) -> int:
    """A free port when the instance runs on this machine, else a stable per-(job, rank) guess."""
    if address in LOCAL_ADDRESSES:
        return free_local_port()
    return REMOTE_PORT_BASE + (job_id * 64 + rank) % REMOTE_PORT_SPAN


@dataclass(frozen=True, slots=True)
class Endpoint:
    role: str
    index: int
    rank: int
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class Rendezvous:
    roles: tuple[str, ...]
    endpoints: tuple[Endpoint, ...]  # by rank

    def shared_env(self) -> dict[str, str]:
        env = {"CORRAL_ROLES": ",".join(self.roles)}
        for role in self.roles:
            mine = sorted((e for e in self.endpoints if e.role == role), key=lambda e: e.index)
            key = f"CORRAL_ROLE_{env_role(role)}"
            env[f"{key}_COUNT"] = str(len(mine))
            env[f"{key}_HOSTS"] = ",".join(e.host for e in mine)
            env[f"{key}_PORTS"] = ",".join(str(e.port) for e in mine)
            env[f"{key}_ADDRS"] = ",".join(f"{e.host}:{e.port}" for e in mine)
        return env

    def instance_envs(self) -> dict[int, dict[str, str]]:
        """{rank: the shared map plus that instance's own host and port}; the map is built once."""
        shared = self.shared_env()
        return {e.rank: {**shared, "CORRAL_HOST": e.host, "CORRAL_PORT": str(e.port)} for e in self.endpoints}


@dataclass(frozen=True, slots=True)
class PlacedInstance:
    role: str
    index: int
    rank: int
    address: str  # the node's address (NodeReport.address)


def plan_rendezvous(
    job_id: int,
    roles: Sequence[str],
    instances: Sequence[PlacedInstance],
    port_for: Callable[[str, int, int], int] = instance_port,
) -> Rendezvous:
    """`roles` in the spec's order (roles with no placed instance are still listed, count 0)."""
    endpoints = tuple(
        Endpoint(i.role, i.index, i.rank, i.address, port_for(i.address, job_id, i.rank))
        for i in sorted(instances, key=lambda i: i.rank)
    )
    return Rendezvous(tuple(roles), endpoints)


def rendezvous_for_placement(
    job_id: int, roles: Sequence[str], placement: Sequence[InstancePlacement], addresses: Mapping[str, str]
) -> Rendezvous:
    """From an attempt's stored placement and node addresses."""
    instances = [
        PlacedInstance(
            role=p.role,
            index=p.index,
            rank=p.rank,
            address=addresses.get(p.node, "127.0.0.1"),
        )
        for p in placement
    ]
    return plan_rendezvous(job_id, roles, instances)
