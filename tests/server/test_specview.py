from corral.server.specview import read_spec
from corral.spec import JobSpecV1


def stored(spec: dict[str, object]) -> JobSpecV1:
    """A submitted spec as the loops get it back from its row."""
    return JobSpecV1.model_validate(spec)


def test_task_order_is_the_specs_order_because_it_is_the_rank_order() -> None:
    spec = stored(
        {
            "name": "two-roles",
            "tasks": {
                "worker": {"instances": 2, "command": "w", "resources": {"gpus": 1, "memory": "2GiB"}},
                "chief": {"command": "c"},
            },
            "max_runtime": "90m",
            "stop_grace": "30s",
        }
    )
    view = read_spec(spec)
    assert [t.role for t in view.tasks] == ["worker", "chief"]
    assert view.tasks[0].resources.memory_mib == 2048 and view.tasks[0].resources.gpus == 1
    assert view.num_instances == 3
    assert view.max_runtime_s == 5400 and view.stop_grace_s == 30


def test_defaults_when_the_spec_leaves_them_out() -> None:
    view = read_spec(stored({"name": "one", "command": "true"}))
    assert [t.role for t in view.tasks] == ["main"]
    assert view.max_runtime_s is None and view.stop_grace_s == 10.0 and view.environment == "default"
