"""Synthetic workloads for what-if studies: `corral sim synth` writes a trace in the generic format.

The workload is sized against a cluster (a CLUSTER.yaml): `load` is the offered GPU-time over the
arrival window divided by the cluster's GPUs, so load 1.3 offers 30% more work than the cluster can
run while jobs arrive (queues grow, then drain after the last arrival).

What a trace holds:
- users (`users_per_group` per group) who each resubmit a few job *templates* (a job name): a
  template has a typical duration (log-normal, median `median_duration_s`, spread
  `duration_sigma`) and each run of it varies around that (log-normal, `run_sigma`), so history of
  the same (user, name) predicts a run the way the live platform's estimator expects;
- sizes: single-node jobs take GPUs from `size_mix`; a `gang_share` of jobs are multi-node gangs
  of `gang_instances` instances of a full node's GPUs each;
- a `constrained_share` of jobs name the GPU model(s) they accept (weighted by capacity; one in
  four accepts two models); a group whose guarantee names only some models runs only on those;
- `bursty` groups submit in bursts (`burst_size` jobs of one template at once) making up
  `burst_share` of all jobs; the other arrivals follow a day/night cycle of amplitude `diurnal`;
- a `estimate_share` of jobs carry a user limit (`max_runtime_s`): a round number of hours,
  1.5-4x the template's typical duration and never below the run's own duration.

Same seed, same spec, same cluster: the same trace, byte for byte.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from corral.scheduler.types import ANY_MODEL
from corral.sim.cluster import ClusterSpec
from corral.sim.errors import SynthError
from corral.sim.trace import Trace, TraceJob

DAY_S = 86400.0
MIN_DURATION_S = 30.0
MAX_DURATION_S = 3 * DAY_S


@dataclass(frozen=True, slots=True)
class SynthSpec:
    jobs: int = 9000
    load: float = 1.3
    size_mix: Mapping[int, float] = field(default_factory=lambda: {1: 0.45, 2: 0.15, 4: 0.2, 8: 0.2})
    gang_share: float = 0.25
    gang_instances: Mapping[int, float] = field(default_factory=lambda: {2: 0.5, 4: 0.35, 8: 0.15})
    constrained_share: float = 0.33
    bursty: tuple[str, ...] = ("burst",)  # groups that submit in bursts (missing ones are ignored)
    burst_share: float = 0.15
    burst_size: tuple[int, int] = (20, 60)
    diurnal: float = 0.5  # arrival rate swings between (1 - diurnal) and (1 + diurnal) of its mean
    users_per_group: int = 8
    templates_per_user: int = 4
    median_duration_s: float = 2400.0
    duration_sigma: float = 1.4
    run_sigma: float = 0.25
    estimate_share: float = 0.5
    seed: int = 0

    def check(self) -> None:
        if self.jobs < 1:
            raise SynthError(f"jobs must be >= 1, got {self.jobs}")
        if not 0 < self.load < math.inf:  # inf put every arrival at time 0
            raise SynthError(f"load must be > 0 and finite, got {self.load:g}")
        for name in ("gang_share", "constrained_share", "burst_share", "estimate_share"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise SynthError(f"{name} must be between 0 and 1, got {value:g}")
        if not 0.0 <= self.diurnal < 1.0:
            raise SynthError(f"diurnal must be in [0, 1), got {self.diurnal:g}")
        for name in ("size_mix", "gang_instances"):
            mix = getattr(self, name)
            weights_ok = all(0 <= w < math.inf for w in mix.values())  # (nan fails both ways)
            if not mix or not weights_ok or any(k < 1 for k in mix) or sum(mix.values()) <= 0:
                raise SynthError(f"{name} needs positive sizes with non-negative weights, got {dict(mix)}")
        low, high = self.burst_size
        if not 1 <= low <= high:
            raise SynthError(f"burst_size must be LOW-HIGH with 1 <= LOW <= HIGH, got {low}-{high}")
        if self.users_per_group < 1 or self.templates_per_user < 1:
            raise SynthError("users_per_group and templates_per_user must be >= 1")
        if not self.median_duration_s > 0:
            raise SynthError(f"median_duration_s must be > 0, got {self.median_duration_s:g}")


def parse_mix(text: str, what: str) -> dict[int, float]:
    """ "1:45,2:15,8:40" -> {1: 45.0, 2: 15.0, 8: 40.0}; a clear error naming `what` otherwise."""
    out: dict[int, float] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        size, sep, weight = part.partition(":")
        try:
            out[int(size)] = float(weight) if sep else 1.0
        except ValueError:
            raise SynthError(f"{what}: {part!r} is not SIZE:WEIGHT (e.g. 1:45,8:20)")
    if not out:
        raise SynthError(f"{what}: empty; give SIZE:WEIGHT pairs (e.g. 1:45,8:20)")
    return out


def _pick(rng: random.Random, mix: Mapping[int, float]) -> int:
    sizes = sorted(mix)
    return rng.choices(sizes, weights=[mix[s] for s in sizes])[0]


@dataclass(frozen=True, slots=True)
class _Template:
    user: str
    name: str
    typical_s: float


class _Generator:
    def __init__(self, spec: SynthSpec, cluster: ClusterSpec) -> None:
        self.spec, self.cluster = spec, cluster
        self.rng = random.Random(spec.seed)
        self.model_gpus: dict[str, int] = {}
        self.model_width: dict[str, int] = {}
        for p in cluster.pools:
            if p.gpus_per_node:
                self.model_gpus[p.gpu_model] = self.model_gpus.get(p.gpu_model, 0) + p.count * p.gpus_per_node
                self.model_width[p.gpu_model] = max(self.model_width.get(p.gpu_model, 0), p.gpus_per_node)
        if not self.model_gpus:
            raise SynthError(f"cluster {cluster.name}: no GPU nodes to size a GPU workload against")
        self.widest = max(self.model_width.values())
        # Nodes a gang instance (a whole widest node) can take, per model and in all.
        self.wide_nodes = dict.fromkeys(self.model_gpus, 0)
        for p in cluster.pools:
            if p.gpus_per_node >= self.widest:
                self.wide_nodes[p.gpu_model] += p.count
        self._check_sizes()
        self.groups = list(cluster.groups)
        if not self.groups:
            raise SynthError(f"cluster {cluster.name}: no groups; the generator draws jobs per group")
        self.templates = {g.name: self._templates(g.name) for g in self.groups}

    def _check_sizes(self) -> None:
        """Refuse sizes no node of the cluster could place as generated: a single-node size wider
        than every node (it was silently cut to the widest node's width: `--size-mix 16:1` on
        8-GPU nodes gave 8-GPU jobs), and a gang of more whole nodes than the cluster has (the
        replay rejected every one)."""
        s, models = self.spec, sorted(self.model_width, key=lambda m: (-self.model_width[m], m))
        wide = [m for m in models if self.model_width[m] == self.widest]
        too_wide = sorted(k for k, w in s.size_mix.items() if k > self.widest and w > 0)
        if too_wide:
            raise SynthError(
                f"size_mix: {too_wide[0]} GPUs is more than a node of cluster {self.cluster.name} has "
                f"(the largest: {self.widest} GPUs, {'/'.join(wide)}); a single-node job cannot be "
                f"wider than a node: give jobs over {self.widest} GPUs as multi-node gangs of whole "
                f"{self.widest}-GPU nodes (gang_share, gang_instances), or drop {too_wide[0]}"
            )
        nodes = sum(self.wide_nodes.values())
        too_many = sorted(k for k, w in s.gang_instances.items() if k > nodes and w > 0 and s.gang_share > 0)
        if too_many:
            raise SynthError(
                f"gang_instances: a gang of {too_many[0]} whole {self.widest}-GPU nodes cannot be "
                f"placed: cluster {self.cluster.name} has {nodes} such nodes"
            )

    def _templates(self, group: str) -> list[_Template]:
        s, rng = self.spec, self.rng
        out = []
        for u in range(s.users_per_group):
            for t in range(s.templates_per_user):
                typical = s.median_duration_s * math.exp(rng.gauss(0.0, s.duration_sigma))
                out.append(_Template(f"{group}-u{u}", f"{group}-u{u}-job{t}", typical))
        return out

    def _group_models(self, group: str) -> list[str] | None:
        """The models a group's guarantee is limited to (None: any model)."""
        g = next(x for x in self.groups if x.name == group)
        named = [m for m, n in g.guaranteed.items() if n > 0 and m != ANY_MODEL]
        if named and not any(m == ANY_MODEL for m, n in g.guaranteed.items() if n > 0):
            return [m for m in named if m in self.model_gpus]
        return None

    def _shape(self, group: str) -> tuple[int, int, str | None]:
        """(instances, GPUs per instance, model constraint) of one job of `group`."""
        s, rng = self.spec, self.rng
        only = self._group_models(group)
        gang = only is None and rng.random() < s.gang_share
        if gang:
            instances, per = _pick(rng, s.gang_instances), self.widest
        else:
            instances, per = 1, _pick(rng, s.size_mix)
        # Models whose nodes can hold it (a gang: enough whole nodes of one model to pin it there).
        fitting = [
            m
            for m in (only or self.model_gpus)
            if self.model_width[m] >= per and (instances == 1 or self.wide_nodes[m] >= instances)
        ]
        if gang and not fitting:  # no one model has nodes enough: the gang runs on any
            return instances, per, None
        if not fitting:  # wider than the nodes of the group's models (_check_sizes refused wider
            # than every node): the widest of the group's nodes' width
            fitting = only or list(self.model_gpus)
            per = max(self.model_width[m] for m in fitting)
        if only is None and rng.random() >= s.constrained_share:
            return instances, per, None
        weights = [self.model_gpus[m] for m in fitting]
        first = rng.choices(fitting, weights=weights)[0]
        rest = [m for m in fitting if m != first]
        if rest and rng.random() < 0.25:
            second = rng.choices(rest, weights=[self.model_gpus[m] for m in rest])[0]
            return instances, per, "|".join(sorted((first, second)))
        return instances, per, first

    def _job(self, index: int, group: str, template: _Template) -> TraceJob:
        s, rng = self.spec, self.rng
        duration = template.typical_s * math.exp(rng.gauss(0.0, s.run_sigma))
        duration = round(min(max(duration, MIN_DURATION_S), MAX_DURATION_S), 1)
        instances, per, model = self._shape(group)
        limit = None
        if rng.random() < s.estimate_share:
            hours = math.ceil(template.typical_s * rng.uniform(1.5, 4.0) / 3600.0)
            limit = max(hours * 3600.0, math.ceil(duration / 3600.0) * 3600.0)
        return TraceJob(
            job_id=f"synth-{index}",
            submit_time=0.0,
            duration=duration,
            num_gpus=instances * per,
            group=group,
            user=template.user,
            name=template.name,
            gpu_model=model,
            instances=instances,
            cpus=float(4 * per),
            memory_mib=16384 * per,
            max_runtime_s=limit,
        )

    def _arrival_times(self, count: int, window: float) -> list[float]:
        """`count` sorted times in [0, window) from a rate that swings with the day."""
        a, rng = self.spec.diurnal, self.rng
        steps = 2048
        grid = [window * i / steps for i in range(steps + 1)]
        cdf = [0.0]
        for t0, t1 in itertools.pairwise(grid):
            mid = (t0 + t1) / 2
            cdf.append(cdf[-1] + (1.0 + a * math.sin(2 * math.pi * mid / DAY_S)) * (t1 - t0))
        total = cdf[-1]
        out = []
        for _ in range(count):
            u = rng.random() * total
            i = min(max(bisect.bisect_right(cdf, u) - 1, 0), steps - 1)
            span = cdf[i + 1] - cdf[i]
            out.append(grid[i] + (grid[i + 1] - grid[i]) * ((u - cdf[i]) / span if span else 0.0))
        out.sort()
        return out

    def generate(self) -> Trace:
        s, rng = self.spec, self.rng
        bursty = [g.name for g in self.groups if g.name in s.bursty]
        weights = {g.name: max(sum(g.guaranteed.values()), 1) for g in self.groups}
        steady_groups = [g.name for g in self.groups if g.name not in bursty] or bursty
        burst_jobs = round(s.jobs * s.burst_share) if bursty else 0
        # (jobs of one burst or a single job, group, template)
        units: list[tuple[int, str, _Template]] = []
        left = burst_jobs
        while left > 0:
            size = min(left, rng.randint(*s.burst_size))
            group = rng.choice(bursty)
            units.append((size, group, rng.choice(self.templates[group])))
            left -= size
        gw = [weights[g] for g in steady_groups]
        for _ in range(s.jobs - burst_jobs):
            group = rng.choices(steady_groups, weights=gw)[0]
            units.append((1, group, rng.choice(self.templates[group])))
        rng.shuffle(units)
        jobs: list[list[TraceJob]] = []
        index = 0
        for size, group, template in units:
            batch = []
            for _ in range(size):
                batch.append(self._job(index, group, template))
                index += 1
            jobs.append(batch)
        work = sum(j.num_gpus * j.duration for batch in jobs for j in batch)
        window = work / (s.load * sum(self.model_gpus.values()))
        times = self._arrival_times(len(jobs), window)
        out: list[TraceJob] = []
        for at, batch in zip(times, jobs, strict=True):
            for k, job in enumerate(batch):  # a burst: one job a second, as a submit loop would
                out.append(_with_submit(job, round(at + k, 1)))
        out.sort(key=lambda j: j.submit_time)
        notes = (
            f"synthetic: {s.jobs:,} job{'' if s.jobs == 1 else 's'}, load {s.load:g} over "
            f"{window / 3600:,.1f} h on "
            f"{sum(self.model_gpus.values()):,} GPUs of {self.cluster.name}, seed {s.seed}",
            self._as_generated(out, burst_jobs),
        )
        return Trace(name=f"synth-s{s.seed}", jobs=tuple(out), notes=notes)

    def _as_generated(self, jobs: list[TraceJob], burst_jobs: int) -> str:
        """The shares the trace has, which differ from those asked for: a group whose guarantee
        names only some models (`infer`: T4) runs no gangs and names a model in every job."""
        n = len(jobs)
        gangs = sum(j.instances > 1 for j in jobs) / n
        named = sum(j.gpu_model is not None for j in jobs) / n
        limits = sum(j.max_runtime_s is not None for j in jobs) / n
        pinned = [g.name for g in self.groups if self._group_models(g.name) is not None]
        why = f" ({', '.join(pinned)}: every job, no gangs: its guarantee names only some models)"
        return (
            f"as generated: {gangs:.1%} multi-node gangs, {named:.1%} naming a GPU model"
            f"{why if pinned else ''}, {burst_jobs / n:.1%} in bursts, {limits:.1%} with a user limit"
        )


def _with_submit(job: TraceJob, at: float) -> TraceJob:
    from dataclasses import replace

    return replace(job, submit_time=at)


def generate(spec: SynthSpec, cluster: ClusterSpec) -> Trace:
    """A synthetic trace for `cluster` (see the module doc); raises SynthError on a bad spec."""
    spec.check()
    return _Generator(spec, cluster).generate()
