"""Presenting replays: the Rich comparison table and the PNG plots of `corral sim compare --out`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from corral.sim.metrics import job_arrays
from corral.sim.replay import SimResult

TABLE_COLUMNS = (
    ("policy", "policy", "{}"),
    ("jobs", "jobs", "{:,}"),
    ("rejected", "jobs_rejected", "{:,}"),
    ("avg JCT h", "avg_jct_s", "h"),
    ("p50 JCT h", "p50_jct_s", "h"),
    ("p99 JCT h", "p99_jct_s", "h"),
    ("avg queue s", "avg_queue_s", "{:,.0f}"),
    ("p50 queue s", "p50_queue_s", "{:,.0f}"),
    ("p99 queue s", "p99_queue_s", "{:,.0f}"),
    ("makespan d", "makespan_s", "d"),
    ("GPU alloc", "gpu_alloc_rate", "{:.1%}"),
    ("alloc arrivals", "gpu_alloc_arrivals", "{:.1%}"),
    ("frag GPUs", "frag_unusable_gpus_avg", "{:.1f}"),
    ("worst slowdown", "worst_group_slowdown", "{:.2f}"),
    ("min share held", "worst_guarantee_held", "{:.1%}"),
    ("ETA err s", "eta_median_abs_err_s", "{:,.0f}"),
    ("ETA rel err", "eta_rel_err_median", "{:.0%}"),
    ("censored", "jobs_censored", "{:,}"),
    ("preempt", "preemptions", "{:,}"),
    ("wall s", "wall_s", "{:.1f}"),
)


# The figures that decide whether policies behaved differently at all.
OUTCOME_KEYS = ("jobs", "avg_jct_s", "p99_jct_s", "avg_queue_s", "p99_queue_s", "makespan_s", "preemptions")
NO_WAIT_S = 1e-6


def compare_warnings(summaries: Sequence[dict[str, Any]]) -> list[str]:
    """Why a comparison says less than it seems, in words: the policies replayed different jobs
    (one with quotas rejects a job its group's quota can never admit, one without runs it, so the
    rows cover different jobs); no job ever waited (the cluster is larger than the load: every
    policy starts every job at once, so they must all agree); or every policy gave the same
    figures anyway. Policies only differ when jobs queue."""
    if len(summaries) < 2:
        return []
    warnings = []
    rejected = {s["policy"]: s["jobs_rejected"] for s in summaries}
    if len(set(rejected.values())) > 1:
        counts = ", ".join(f"{policy} {n:,}" for policy, n in rejected.items())
        warnings.append(
            f"the policies replayed different jobs: rejected {counts} (a policy with quotas rejects "
            "a job its group's quota can never admit; one without runs it), so their figures cover "
            "different jobs (each policy's rejected jobs: corral sim --policy NAME)"
        )
    first = summaries[0]
    scale = (
        f"{first['jobs']:,} job{'' if first['jobs'] == 1 else 's'} on {first['cluster_gpus']:,} GPUs; "
        "use --arrival-speedup (more load), "
        "a smaller --cluster, or more of the trace (--max-jobs)"
    )
    if all(s["jobs"] and (s["p99_queue_s"] or 0.0) <= NO_WAIT_S for s in summaries):
        warnings.append(f"no job waited under any policy: the cluster is larger than the load ({scale})")
    elif all(all(s.get(k) == first.get(k) for k in OUTCOME_KEYS) for s in summaries[1:]):
        warnings.append(
            f"every policy gave identical results: too little contention to tell them apart ({scale})"
        )
    return warnings


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "h":
        return f"{value / 3600:,.2f}"
    if fmt == "d":
        return f"{value / 86400:,.1f}"
    return fmt.format(value)


def compare_table(summaries: Sequence[dict[str, Any]], title: str) -> Table:
    table = Table(title=title)
    for header, _, _ in TABLE_COLUMNS:
        table.add_column(header, justify="left" if header == "policy" else "right")
    for s in summaries:
        table.add_row(*(_cell(s.get(key), fmt) for _, key, fmt in TABLE_COLUMNS))
    return table


def compare_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    """The same table as Markdown (for notes and reports)."""
    head = "| " + " | ".join(h for h, _, _ in TABLE_COLUMNS) + " |"
    rule = "|" + "---|" * len(TABLE_COLUMNS)
    rows = ["| " + " | ".join(_cell(s.get(k), f) for _, k, f in TABLE_COLUMNS) + " |" for s in summaries]
    return "\n".join([head, rule, *rows])


def _cdf(ax: Any, values: np.ndarray, label: str) -> None:
    if values.size == 0:
        return
    xs = np.sort(values)
    ys = np.arange(1, xs.size + 1) / xs.size
    step = max(1, xs.size // 4000)  # plot at most ~4000 points per curve
    ax.plot(np.maximum(xs[::step], 1.0), ys[::step], label=label)


def write_plots(results: Sequence[SimResult], out_dir: Path) -> list[Path]:
    """JCT CDF, queueing-delay CDF and GPU allocation over time, one curve per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    arrays = [(r.policy, job_arrays(r)) for r in results]
    written = []
    for key, title, fname in (
        ("jct", "Job completion time", "jct_cdf.png"),
        ("queue", "Queueing delay", "queue_cdf.png"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for policy, a in arrays:
            _cdf(ax, a[key], policy)
        ax.set_xscale("log")
        ax.set_xlabel("seconds (log; values below 1 s drawn at 1 s)")
        ax.set_ylabel("fraction of jobs")
        ax.set_title(f"{title} CDF")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out_dir / fname, dpi=110)
        plt.close(fig)
        written.append(out_dir / fname)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for r in results:
        t = np.frombuffer(r.alloc_t, dtype=np.float64)
        g = np.frombuffer(r.alloc_gpus, dtype=np.float64)
        step = max(1, t.size // 5000)
        ax.step(
            t[::step] / 86400, 100 * g[::step] / max(r.total_gpus, 1), where="post", label=r.policy, lw=0.8
        )
    ax.set_xlabel("days from trace start")
    ax.set_ylabel("GPUs allocated (%)")
    ax.set_title("GPU allocation over time")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / "gpu_alloc.png", dpi=110)
    plt.close(fig)
    written.append(out_dir / "gpu_alloc.png")
    return written
