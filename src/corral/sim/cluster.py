"""CLUSTER.yaml: the simulated cluster (node pools) and its tenant groups with quotas.

```yaml
name: philly
pools:
  - {name: v100, count: 64, gpus_per_node: 8, gpu_model: V100, cpus: 64, memory_mib: 524288}
groups:
  - {name: research, guaranteed: 64}                 # int: GPUs of any model
  - {name: vision, guaranteed: {V100: 32}, max: {V100: 128}, weight: 2, borrowing: true}
default_group: {guaranteed: 0}   # for trace groups not listed (optional; default: quota 0)
```
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from corral.scheduler.profiles import Profile
from corral.scheduler.types import ANY_MODEL, GPU, Group, Node
from corral.sim.errors import ClusterError
from corral.yaml_lines import line_of

SHIPPED_CLUSTERS = ("philly", "openb", "openb-small", "synth")


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    count: int
    gpus_per_node: int
    gpu_model: str
    cpus: float
    memory_mib: int


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    name: str
    pools: tuple[Pool, ...]
    groups: tuple[Group, ...]
    default_group: Mapping[str, Any] | None = None
    # Profile fields the file sets (`policy_knobs:`, as `--knob`; a `--save-trace` export's
    # cpu_jobs_on_gpu_nodes): every replay on this cluster uses them, `--knob` wins
    policy_knobs: Mapping[str, Any] | None = None

    @property
    def total_gpus(self) -> int:
        return sum(p.count * p.gpus_per_node for p in self.pools)

    def build_nodes(self) -> tuple[Node, ...]:
        nodes = []
        for pool in self.pools:
            for i in range(pool.count):
                name = f"{pool.name}-{i:04d}"
                gpus = tuple(
                    GPU(index=g, uuid=f"GPU-{name}-{g}", model=pool.gpu_model)
                    for g in range(pool.gpus_per_node)
                )
                nodes.append(Node(name=name, cpus=pool.cpus, memory_mib=pool.memory_mib, gpus=gpus))
        return tuple(nodes)

    def groups_for(self, trace_groups: set[str]) -> tuple[Group, ...]:
        """The declared groups plus a group (from `default_group`) for each trace group not declared."""
        known = {g.name for g in self.groups}
        extra = sorted(trace_groups - known)
        template = dict(self.default_group or {})
        made = tuple(_group({**template, "name": name}, "default_group") for name in extra)
        return self.groups + made

    def with_private_quota(self, group: Group) -> ClusterSpec:
        """A private cluster just for `group`: its guaranteed GPUs of each model, rounded up to
        whole nodes of the pool with that model (GPUs of any model come from the largest pool)."""
        pools = []
        largest = max(range(len(self.pools)), key=lambda i: self.pools[i].count * self.pools[i].gpus_per_node)
        for i, pool in enumerate(self.pools):
            any_model = group.guaranteed.get(ANY_MODEL, 0) if i == largest else 0
            quota = group.guaranteed.get(pool.gpu_model, 0) + any_model
            if quota > 0 and pool.gpus_per_node:
                count = -(-quota // pool.gpus_per_node)
                pools.append(dataclasses.replace(pool, count=count))
        private = Group(name=group.name, guaranteed=dict(group.guaranteed), borrowing=False)
        return ClusterSpec(
            name=f"{self.name}-private-{group.name}",
            pools=tuple(pools),
            groups=(private,),
            policy_knobs=self.policy_knobs,
        )


# The replay builds every node and GPU as an object and its cycles scan them: 100,000 nodes of 8
# GPUs take seconds to build, and the largest shipped cluster (openb) has 1,213 nodes. A
# mistyped count (100000000) ran for minutes, building, before printing anything.
MAX_NODES = 100_000
MAX_GPUS = 1_000_000

POOL_KEYS = ("name", "count", "gpus_per_node", "gpu_model", "cpus", "memory_mib")
GROUP_KEYS = ("name", "guaranteed", "max", "user_max_gpus", "weight", "borrowing")
CLUSTER_KEYS = ("name", "pools", "groups", "default_group", "policy_knobs")


def _require(entry: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in entry:
        raise ClusterError(f"{where}: missing key {key!r}")
    return entry[key]


def _known_keys(entry: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """A misspelt key (`guarenteed: 64`) is an error, not a default silently taken."""
    unknown = [str(k) for k in entry if k not in allowed]
    if unknown:
        raise ClusterError(f"{where}: unknown key(s) {', '.join(unknown)}; use {', '.join(allowed)}")


def _positive_int(value: Any, where: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        raise ClusterError(f"{where}: expected a {'non-negative' if allow_zero else 'positive'} whole number")
    return value


def _positive_number(value: Any, where: str) -> float:
    """A finite number > 0 (CPUs, a weight): text, nan or a negative is an error naming the field."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not (0 < value < math.inf):
        raise ClusterError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _flag(value: Any, where: str) -> bool:
    """true or false; a quoted "no" or "false" would otherwise be taken as true (bool of text)."""
    if not isinstance(value, bool):
        raise ClusterError(f"{where}: expected true or false, got {value!r}")
    return value


def _quota(value: Any, where: str) -> dict[str, int]:
    if value is None:
        return {}
    if isinstance(value, int) and not isinstance(value, bool):
        return {ANY_MODEL: _positive_int(value, where, allow_zero=True)}
    if isinstance(value, Mapping):
        return {str(k): _positive_int(v, f"{where}.{k}", allow_zero=True) for k, v in value.items()}
    raise ClusterError(f"{where}: expected a number of GPUs or a mapping model -> GPUs")


def _group(entry: Mapping[str, Any], where: str) -> Group:
    if not isinstance(entry, Mapping):
        raise ClusterError(f"{where}: expected a mapping")
    name = str(_require(entry, "name", where))
    at = f"{where} {name!r}"
    _known_keys(entry, GROUP_KEYS, at)
    max_quota = entry.get("max")
    guaranteed = _quota(entry.get("guaranteed", 0), f"{at}.guaranteed")
    limits = None if max_quota is None else _quota(max_quota, f"{at}.max")
    for key, most in (limits or {}).items():  # the live platform's rule (services/accounts.py)
        if most < guaranteed.get(key, 0):
            of = "of any model" if key == ANY_MODEL else f"of {key}"
            raise ClusterError(f"{at}.max: {most} GPUs {of} is below the guarantee {guaranteed[key]}")
    return Group(
        name=name,
        guaranteed=guaranteed,
        max=limits,
        user_max_gpus=None
        if entry.get("user_max_gpus") is None
        else _positive_int(entry["user_max_gpus"], f"{at}.user_max_gpus", allow_zero=True),
        weight=_positive_number(entry.get("weight", 1.0), f"{at}.weight"),
        borrowing=_flag(entry.get("borrowing", True), f"{at}.borrowing"),
    )


def _pool(entry: Any, where: str) -> Pool:
    if not isinstance(entry, Mapping):
        raise ClusterError(f"{where}: expected a mapping")
    name = str(_require(entry, "name", where))
    at = f"{where} {name!r}"
    _known_keys(entry, POOL_KEYS, at)
    model = entry.get("gpu_model", "GPU")
    if not isinstance(model, str | int) or isinstance(model, bool) or not str(model).strip():
        raise ClusterError(f"{at}.gpu_model: expected a GPU model name, got {model!r}")
    return Pool(
        name=name,
        count=_positive_int(_require(entry, "count", at), f"{at}.count"),
        gpus_per_node=_positive_int(entry.get("gpus_per_node", 0), f"{at}.gpus_per_node", allow_zero=True),
        gpu_model=str(model),
        cpus=_positive_number(entry.get("cpus", 64), f"{at}.cpus"),
        memory_mib=_positive_int(entry.get("memory_mib", 262144), f"{at}.memory_mib"),
    )


def _check_size(pools: tuple[Pool, ...], source: str, node: yaml.Node | None) -> None:
    """At most MAX_NODES nodes and MAX_GPUS GPUs in all, refused naming the line of the pool's
    `count` that goes past (`node`: the file's YAML node tree, when there is a file)."""
    nodes = gpus = 0
    for i, pool in enumerate(pools):
        nodes += pool.count
        gpus += pool.count * pool.gpus_per_node
        if nodes <= MAX_NODES and gpus <= MAX_GPUS:
            continue
        line = "" if node is None else f":{line_of(node, ('pools', i, 'count'))}"
        what = f"{nodes:,} nodes" if nodes > MAX_NODES else f"{gpus:,} GPUs"
        raise ClusterError(
            f"{source}{line}: pools[{i}] {pool.name!r}.count: {pool.count:,} brings the cluster to {what}; "
            f"the simulator takes at most {MAX_NODES:,} nodes and {MAX_GPUS:,} GPUs in all "
            "(it builds and scans every one)"
        )


def parse_cluster(data: Any, source: str, node: yaml.Node | None = None) -> ClusterSpec:
    """A ClusterSpec from CLUSTER.yaml's data; `node` (yaml.compose of the same text) lets an
    error name its line."""
    if not isinstance(data, Mapping):
        raise ClusterError(f"{source}: expected a mapping with 'pools' and 'groups'")
    _known_keys(data, CLUSTER_KEYS, source)
    pools_raw = _require(data, "pools", source)
    if not isinstance(pools_raw, list) or not pools_raw:
        raise ClusterError(f"{source}: 'pools' must be a non-empty list")
    pools = tuple(_pool(p, f"{source}: pools[{i}]") for i, p in enumerate(pools_raw))
    if len({p.name for p in pools}) != len(pools):
        raise ClusterError(f"{source}: pool names must be unique")
    _check_size(pools, source, node)
    groups_raw = data.get("groups") or []
    if not isinstance(groups_raw, list):
        raise ClusterError(f"{source}: 'groups' must be a list")
    groups = tuple(_group(g, f"{source}: groups[{i}]") for i, g in enumerate(groups_raw))
    seen: set[str] = set()
    for g in groups:  # a second entry would silently replace the first's quotas in the replay
        if g.name in seen:
            raise ClusterError(f"{source}: group {g.name!r} is listed more than once")
        seen.add(g.name)
    default = data.get("default_group")
    if default is not None:
        if not isinstance(default, Mapping):
            raise ClusterError(f"{source}: 'default_group' must be a mapping")
        if "name" in default:  # it was overwritten by each trace group's name without a word
            raise ClusterError(
                f"{source}: default_group: no 'name' here: it is the quota of each trace group "
                "that 'groups' does not list, under that group's own name"
            )
        # checked now, naming the file: it is otherwise read only when a trace group needs it
        _group({**default, "name": "default_group"}, f"{source}: default_group")
    return ClusterSpec(
        name=str(data.get("name", Path(source).stem)),
        pools=pools,
        groups=groups,
        default_group=default,
        policy_knobs=_policy_knobs(data.get("policy_knobs"), f"{source}: policy_knobs"),
    )


def _policy_knobs(value: Any, where: str) -> dict[str, Any] | None:
    """`policy_knobs: {las_thresholds: [3600, 36000], starvation_s: 0, cpu_jobs_on_gpu_nodes: true}`:
    the same names and checks as `--knob NAME=VALUE`."""
    from corral.sim.runner import PolicyError, knob_values

    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ClusterError(f"{where}: expected a mapping knob -> value")
    try:
        knobs = knob_values(value)
        if knobs:  # a value the profile refuses (nan, below 0): named now, not at the replay
            dataclasses.replace(Profile(), **knobs)
    except (PolicyError, ValueError) as exc:
        raise ClusterError(f"{where}: {exc}")
    return knobs


def load_cluster(name_or_path: str) -> ClusterSpec:
    """A shipped example (`philly`, `openb`) or a path to a CLUSTER.yaml."""
    if name_or_path in SHIPPED_CLUSTERS:
        path = Path(str(resources.files("corral").joinpath("examples", "clusters", f"{name_or_path}.yaml")))
    else:
        path = Path(name_or_path)
        if not path.is_file():
            shipped = ", ".join(SHIPPED_CLUSTERS)
            raise ClusterError(
                f"cluster {name_or_path!r}: not a shipped example ({shipped}) and no such file"
            )
    try:
        text = path.read_text(encoding="utf-8")
        data, node = yaml.safe_load(text), yaml.compose(text)
    except yaml.YAMLError as exc:
        raise ClusterError(f"{path}: not valid YAML: {exc}")
    return parse_cluster(data, str(path), node)
