"""Node commands: `corral node ls|gpus|cordon|uncordon|drain|remove|gpu` (`node risk`: cli/monitor.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

import typer
from rich.table import Table

from corral.cli.common import Output, OutputOpt, ago, client, friendly_errors, out, print_json
from corral.sdk.base import seg

node_app = typer.Typer(
    help="Nodes: list, GPU readings, cordon, uncordon, drain, remove, gpu quarantine|return, risk.",
    no_args_is_help=True,
)


@node_app.command("ls")
@friendly_errors
def node_ls(output: OutputOpt = Output.table) -> None:
    """List nodes with their GPUs, the jobs holding them and the GPUs out of service."""
    with client() as c:
        nodes = c.nodes()
    if output is Output.json:
        print_json(nodes)
        return
    table = Table(
        "NODE", "STATE", "CPUS", "MEMORY", "GPUS", "IN USE", "GPUS OUT", "HEARTBEAT", "FLAGS", box=None
    )
    for n in nodes:
        models = sorted({g["model"] for g in n["gpus"]})
        used = [_holder(g) for g in n["gpus"] if g.get("allocated") or g["job_id"] is not None]
        table.add_row(
            n["name"],
            n["state"],
            f"{n['cpus']:g}",
            memory_text(int(n["memory_mib"])),
            f"{len(n['gpus'])} {'/'.join(models)}".strip(),
            ", ".join(used) or "-",
            ", ".join(_out_of_service(n["gpus"])) or "-",
            ago(n["last_heartbeat"]),
            "; ".join(n.get("flags") or []) or "-",
        )
    out.print(table)


@node_app.command("gpus")
@friendly_errors
def node_gpus(output: OutputOpt = Output.table) -> None:
    """Each GPU's utilization and memory in use now, with the job and group holding it where you
    may see them (your jobs; a group admin's groups' jobs; all for an admin)."""
    with client() as c:
        usage = c.gpu_usage()
    if output is Output.json:
        print_json(usage)
        return
    table = Table("NODE", "GPU", "MODEL", "UTIL", "MEMORY USED", "HELD BY", "GROUP", "SAMPLED", box=None)
    for g in usage["gpus"]:
        util, used = g["utilization_percent"], g["memory_used_mib"]
        # a GPU that fell off the bus has no reading
        util_text = "lost" if g["present"] is False else "-" if util is None else f"{util:.0f}%"
        holder = "-" if not g["allocated"] else ("a job" if g["job_id"] is None else f"job {g['job_id']}")
        table.add_row(
            g["node"],
            str(g["gpu"]),
            g["model"],
            util_text,
            "-" if used is None else memory_text(int(used)),
            holder,
            g["group"] or "-",
            ago(g["sampled_at"]),
        )
    out.print(table)


def _holder(gpu: dict[str, Any]) -> str:
    """'INDEX:job N', or 'INDEX:a job' for a job the caller may not see (the API names none)."""
    return f"{gpu['index']}:" + ("a job" if gpu["job_id"] is None else f"job {gpu['job_id']}")


def memory_text(mib: int) -> str:
    """A node's memory, never more than it has: 4000 MiB is "3.9GiB" (it read "4GiB", and a
    workspace's default 4GiB, 4096 MiB, was refused as too large for it)."""
    if mib % 1024 == 0:
        return f"{mib // 1024}GiB"
    return f"{mib * 10 // 1024 / 10:.1f}GiB"  # rounded down


def _out_of_service(gpus: list[dict[str, Any]]) -> list[str]:
    """GPUs the scheduler does not place on: quarantined or lost (Corral's verdict, until an admin
    returns them) or reported unhealthy by the engine, as 'INDEX:why'."""
    out_gpus = []
    for g in gpus:
        health = g.get("health") or "healthy"
        if health != "healthy":
            out_gpus.append(f"{g['index']}:{health}")
        elif not g.get("healthy", True):
            out_gpus.append(f"{g['index']}:unhealthy")
    return out_gpus


def _node_action(action: str) -> Callable[[str, Output], None]:
    @friendly_errors
    def command(
        name: Annotated[str, typer.Argument(metavar="NODE")], output: OutputOpt = Output.table
    ) -> None:
        with client() as c:
            node = c.node_action(name, action)
        if output is Output.json:
            print_json(node)
        else:
            out.print(f"node {name}: {node['state']}")

    command.__doc__ = {
        "cordon": "Take no new jobs on NODE.",
        "uncordon": "Return NODE to service.",
        "drain": "Take no new jobs on NODE and let it empty.",
    }[action]
    return command


for _action in ("cordon", "uncordon", "drain"):
    node_app.command(_action)(_node_action(_action))


@node_app.command("remove")
@friendly_errors
def node_remove(name: Annotated[str, typer.Argument(metavar="NODE")]) -> None:
    """Remove a decommissioned NODE (admin): it must be cordoned, drained or down, with no job on
    it. Jobs that ran there keep its name in their history. Remove it from the engine first (Slurm:
    slurm.conf or `scontrol delete nodename=`): a node the engine still reports comes back
    cordoned."""
    with client() as c:
        c.remove_node(name)
    out.print(f"node {name}: removed")


@node_app.command("gpu")
@friendly_errors
def node_gpu(
    name: Annotated[str, typer.Argument(metavar="NODE")],
    index: Annotated[int, typer.Argument(metavar="INDEX", min=0)],
    action: Annotated[str, typer.Argument(metavar="quarantine|return")],
) -> None:
    """Quarantine one GPU (no new job on it; the node's others keep working), or return a
    quarantined or lost GPU to service once examined (admin)."""
    if action not in ("quarantine", "return"):
        raise typer.BadParameter(f"{action!r}: give quarantine or return")
    with client() as c:
        node = c.request("POST", f"/nodes/{seg(name)}/gpus/{index}/{action}")
    health = next(g["health"] for g in node["gpus"] if g["index"] == index)
    out.print(f"node {name} GPU {index}: {health}")


def register(app: typer.Typer) -> None:
    """Add `corral node` to the root `corral` app."""
    app.add_typer(node_app, name="node")
