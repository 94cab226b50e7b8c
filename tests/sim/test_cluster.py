from __future__ import annotations

from pathlib import Path

import pytest

from corral.scheduler.types import ANY_MODEL
from corral.sim.cluster import ClusterError, load_cluster


def test_shipped_clusters_load() -> None:
    philly = load_cluster("philly")
    assert philly.total_gpus > 0 and len(philly.groups) == 15
    openb = load_cluster("openb")
    nodes = openb.build_nodes()
    assert (len(nodes), openb.total_gpus) == (1213, 6212)
    assert {n.gpus[0].model for n in nodes} >= {"P100", "T4", "V100M16", "V100M32", "A10", "G2", "G3"}
    small = load_cluster("openb-small")
    assert small.total_gpus < openb.total_gpus
    assert {p.gpu_model for p in small.pools} == {p.gpu_model for p in openb.pools}


def test_groups_quotas_and_trace_groups_not_declared(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "pools: [{name: a, count: 2, gpus_per_node: 4, gpu_model: A100}]\n"
        "groups: [{name: x, guaranteed: {A100: 4}, max: 8}]\n"
        "default_group: {guaranteed: 1, borrowing: false}\n"
    )
    spec = load_cluster(str(path))
    groups = {g.name: g for g in spec.groups_for({"x", "y"})}
    assert groups["x"].guaranteed == {"A100": 4} and groups["x"].max == {ANY_MODEL: 8}
    assert groups["y"].guaranteed == {ANY_MODEL: 1} and not groups["y"].borrowing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("groups: []\n", "missing key 'pools'"),
        ("pools: [{name: a, count: 0, gpus_per_node: 4}]\n", "pools\\[0\\] 'a'.count: expected a positive"),
        ("pools: [{name: a, count: 1}]\ngroups: [{name: x, guaranteed: lots}]\n", "'x'.guaranteed"),
        ("pools: [: bad\n", "not valid YAML"),
        # the compiled scheduler checks Group.user_max_gpus is an int: refused here, by name
        ("pools: [{name: a, count: 1}]\ngroups: [{name: x, user_max_gpus: '8'}]\n", "'x'.user_max_gpus"),
        ("pools: [{name: a, count: 1}]\ngroups: [{name: x, user_max_gpus: 4.5}]\n", "'x'.user_max_gpus"),
    ],
)
def test_bad_cluster_files_say_what_is_wrong(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ClusterError, match=expected):
        load_cluster(str(path))


POOL = "pools: [{name: a, count: 1, gpus_per_node: 4}]\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # text or nan where a number goes: a traceback (float('abc')) or taken silently before
        ("pools: [{name: a, count: 1, cpus: abc}]\n", "pools\\[0\\] 'a'.cpus: expected a positive number"),
        ("pools: [{name: a, count: 1, cpus: .nan}]\n", "'a'.cpus: expected a positive number"),
        ("pools: [{name: a, count: 1, cpus: -4}]\n", "'a'.cpus: expected a positive number"),
        (POOL + "groups: [{name: x, weight: heavy}]\n", "'x'.weight: expected a positive number"),
        (POOL + "groups: [{name: x, weight: -1}]\n", "'x'.weight: expected a positive number"),
        (POOL + "groups: [{name: x, weight: .nan}]\n", "'x'.weight: expected a positive number"),
        # bool("no") is True: a quoted no lent the group's GPUs
        (POOL + "groups: [{name: x, borrowing: 'no'}]\n", "'x'.borrowing: expected true or false"),
        # the second entry silently replaced the first's quotas
        (POOL + "groups: [{name: x, guaranteed: 4}, {name: x}]\n", "group 'x' is listed more than once"),
        # the live platform refuses a max below the guarantee
        (POOL + "groups: [{name: x, guaranteed: 4, max: 2}]\n", "'x'.max: 2 GPUs of any model is below the"),
        (
            POOL + "groups: [{name: x, guaranteed: {A100: 4}, max: {A100: 2}}]\n",
            "2 GPUs of A100 is below the",
        ),
        # the name was overwritten by each trace group's own without a word
        (POOL + "default_group: {name: other, guaranteed: 1}\n", "c.yaml: default_group: no 'name' here"),
        # a misspelt key was a default silently taken (no guarantee at all)
        (POOL + "groups: [{name: x, guarenteed: 4}]\n", "'x': unknown key\\(s\\) guarenteed"),
        ("pools: [{name: a, count: 1, gpu: A100}]\n", "'a': unknown key\\(s\\) gpu;"),
        (POOL + "group: [{name: x}]\n", "unknown key\\(s\\) group;"),
        ("pools: [{name: a, count: 1, gpu_model: [A100]}]\n", "'a'.gpu_model: expected a GPU model name"),
        # read only when a trace group needed it: a traceback without the file's name, mid-replay
        (POOL + "default_group: {guaranteed: lots}\n", "c.yaml: default_group 'default_group'.guaranteed"),
    ],
)
def test_bad_values_in_cluster_files_are_named(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ClusterError, match=expected):
        load_cluster(str(path))


def test_a_cluster_past_the_size_limit_is_refused_at_once_naming_the_line(tmp_path: Path) -> None:
    """`count: 100000000` built nodes for minutes before `corral sim` printed anything."""
    path = tmp_path / "c.yaml"
    path.write_text("pools:\n  - name: big\n    gpus_per_node: 8\n    count: 100000000\ngroups: []\n")
    with pytest.raises(ClusterError) as refused:
        load_cluster(str(path))
    assert str(refused.value) == (
        f"{path}:4: pools[0] 'big'.count: 100,000,000 brings the cluster to 100,000,000 nodes; "
        "the simulator takes at most 100,000 nodes and 1,000,000 GPUs in all (it builds and scans every one)"
    )
    # the limit is over all pools, and over GPUs: the pool that goes past is named
    path.write_text(
        "pools:\n  - {name: a, count: 100000, gpus_per_node: 0}\n  - {name: b, count: 1, gpus_per_node: 1}\n"
    )
    with pytest.raises(
        ClusterError, match=r"c\.yaml:3: pools\[1\] 'b'\.count: 1 brings the cluster to 100,001 nodes"
    ):
        load_cluster(str(path))
    path.write_text("pools: [{name: a, count: 100000, gpus_per_node: 16}]\n")
    with pytest.raises(ClusterError, match=r"c\.yaml:1: .* brings the cluster to 1,600,000 GPUs"):
        load_cluster(str(path))
    path.write_text("pools: [{name: a, count: 100000, gpus_per_node: 8}]\n")
    assert load_cluster(str(path)).total_gpus == 800_000  # at the limits: taken


def test_a_fraction_for_a_whole_number_knob_is_refused_by_name() -> None:
    """`backfill_depth` is an int field of the Profile: 2.5 is an error naming the knob (the compiled
    scheduler would raise a bare TypeError at the first cycle), while a float knob takes 2.5."""
    from corral.sim.runner import PolicyError, parse_knobs

    with pytest.raises(PolicyError, match="backfill_depth is a whole number"):
        parse_knobs(["backfill_depth=2.5"])
    with pytest.raises(PolicyError, match="eta_limit is a whole number"):
        parse_knobs(["eta_limit=2.5"])
    assert parse_knobs(["backfill_depth=7", "starvation_s=2.5"]) == {"backfill_depth": 7, "starvation_s": 2.5}


def test_a_cluster_file_sets_policy_knobs_and_a_saved_export_keeps_the_servers(tmp_path: Path) -> None:
    """`--save-trace` wrote the cluster without the server's policy_knobs, and a cluster file could
    not set any: a CPU-only job that `--from-cluster` replays (the local engine places CPU-only
    work on GPU nodes) was rejected when the saved trace was replayed on the saved cluster."""
    from corral.cli.sim_live import _save
    from corral.sim.runner import simulate
    from corral.sim.trace import load_generic_csv, trace_from_rows

    rows = [{"submit_time": 0, "duration": 10, "num_gpus": 0, "group": "g", "job_id": "cpu"}]
    export = {
        "cluster": {"name": "live", "pools": [{"name": "a", "count": 1, "gpus_per_node": 4}], "groups": []},
        "policy_knobs": {"cpu_jobs_on_gpu_nodes": True},
    }
    trace_path, cluster_path = tmp_path / "live.csv", tmp_path / "live.cluster.yaml"
    _save(export, trace_from_rows("live", rows), trace_path, cluster_path)
    cluster = load_cluster(str(cluster_path))
    assert cluster.policy_knobs == {"cpu_jobs_on_gpu_nodes": True}
    result = simulate(load_generic_csv(trace_path), cluster, "default")
    assert result.rejected == [] and result.jobs[0].end == 10.0
    path = tmp_path / "c.yaml"
    path.write_text(
        "pools: [{name: a, count: 1}]\npolicy_knobs: {las_thresholds: [10, 20], starvation_s: 60}\n"
    )
    assert load_cluster(str(path)).policy_knobs == {"las_thresholds": (10.0, 20.0), "starvation_s": 60}
    for bad, error in (
        ("{nope: 1}", "c.yaml: policy_knobs: 'nope' is not a knob: use one of"),
        ("{starvation_s: [1, 2]}", r"c.yaml: policy_knobs: starvation_s: \[1, 2\]: \[1, 2\] is not a number"),
        ("{size_order: 2}", "c.yaml: policy_knobs: size_order: 2: size_order is on or off: 1 or 0"),
        ("{grace_s: .nan}", "grace_s must be"),
    ):
        path.write_text(f"pools: [{{name: a, count: 1}}]\npolicy_knobs: {bad}\n")
        with pytest.raises(ClusterError, match=error):
            load_cluster(str(path))


def test_a_bad_knob_value_says_what_the_knob_takes() -> None:
    """`--knob size_order=2` said "'2' is not a number (list: 3600,36000; on/off: 1 or 0)": 2 is a
    number; an on/off knob, a list and a number now each say what they take."""
    import re

    from corral.sim.errors import PolicyError
    from corral.sim.runner import parse_knobs

    for item, error in (
        ("size_order=2", "--knob 'size_order=2': size_order is on or off: 1 or 0"),
        ("cpu_jobs_on_gpu_nodes=yes", "cpu_jobs_on_gpu_nodes is on or off: 1 or 0"),
        ("las_thresholds=1h,10h", "--knob 'las_thresholds=1h,10h': las_thresholds is a list of numbers"),
        ("backfill_depth=lots", "--knob 'backfill_depth=lots': 'lots' is not a number"),
    ):
        with pytest.raises(
            PolicyError, match=re.escape(error) + "$" if "is not a number" in error else re.escape(error)
        ):
            parse_knobs([item])


def test_the_private_baseline_replays_with_the_same_knobs() -> None:
    """`--private-baseline --knob ...` replayed each group's private cluster without the knobs."""
    from corral.sim.runner import private_baseline

    from .helpers import cluster, trace

    tr = trace(("cpu", 0, 10, 0))
    plain = private_baseline(tr, cluster(1, 4), "default")
    knobbed = private_baseline(tr, cluster(1, 4), "default", None, {"cpu_jobs_on_gpu_nodes": True})
    assert plain["g"]["private_rejected"] == 1 and knobbed["g"]["private_rejected"] == 0
