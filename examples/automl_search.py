"""A small AutoML driver on Corral: random search with median early stopping over a toy objective,
every trial a CPU-only job, all through the Python SDK (corral.sdk.Client).

    python examples/automl_search.py --experiment lr-sweep --trials 12 --parallel 4

What it shows (README, "AutoML tools"):
- each trial is a job labelled {experiment: NAME, trial: N, lr: ..., momentum: ...}: its
  parameters are in its labels, so a driver that restarts with the same --experiment finds its
  trials again (`iter_jobs(labels=..., user=<you>)`: your own jobs only, as labels are free text
  and another user's experiment may carry the same name) and goes on where it stopped;
- at most --parallel trials are live at once; `wait_any` watches them all with one request per
  poll and returns the ones that ended;
- each trial appends {"step": s, "loss": x} lines to $CORRAL_OUTPUTS/metrics.jsonl; the driver
  reads every live trial's with one `metrics_of(ids)` per round while they run;
- median stopping: a running trial whose best loss at its latest step is worse than the median
  of the other trials' losses at that step is cancelled;
- on Ctrl-C every trial still live is cancelled with one call,
  `cancel_by_labels({"experiment": NAME})` (your own jobs carrying the label, by default).

CORRAL_URL and CORRAL_TOKEN (or $CORRAL_HOME/config.yaml) say which server; `--url`/`--token` too.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from typing import Any

from corral.sdk import TERMINAL_STATES, Client, CorralError

# The trial: a toy objective whose loss falls with the steps towards a floor set by the two
# parameters (best near lr=0.003, momentum=0.9). It writes one JSON line per step, the whole
# protocol; inside the server's own environment `corral.sdk.report_metrics(step=s, loss=x)`
# writes the same line.
TRIAL_PROGRAM = """
import json, math, os, random, time
lr, momentum, steps = float(os.environ["LR"]), float(os.environ["MOMENTUM"]), int(os.environ["STEPS"])
floor = (math.log10(lr) + 2.5) ** 2 * 0.5 + (momentum - 0.9) ** 2 * 4
path = os.path.join(os.environ["CORRAL_OUTPUTS"], "metrics.jsonl")
for step in range(1, steps + 1):
    loss = floor + 1.0 / (1 + step * lr * 300) + random.gauss(0, 0.01)
    with open(path, "a") as fh:
        fh.write(json.dumps({"step": step, "loss": round(loss, 5)}) + "\\n")
    time.sleep(float(os.environ["STEP_S"]))
"""


def trial_spec(
    experiment: str, number: int, lr: float, momentum: float, args: argparse.Namespace
) -> dict[str, Any]:
    return {
        "name": f"{experiment}-t{number}",
        "command": f"python3 -c '{TRIAL_PROGRAM}'",
        "resources": {"gpus": 0, "cpus": 0.2, "memory": "128MiB"},
        "max_runtime": "10m",
        "env": {
            "LR": repr(lr),
            "MOMENTUM": repr(momentum),
            "STEPS": str(args.steps),
            "STEP_S": str(args.step_s),
        },
        "labels": {
            "experiment": experiment,
            "trial": number,
            "lr": f"{lr:.6g}",
            "momentum": f"{momentum:.4g}",
        },
    }


def sample(rng: random.Random) -> tuple[float, float]:
    return 10 ** rng.uniform(-4, -1), rng.uniform(0.5, 0.99)


def losses_by_step(metrics: dict[str, Any]) -> dict[int, float]:
    """A trial's best loss so far at each step it reported."""
    best, out = float("inf"), {}
    for point in metrics["points"]:
        if point["step"] is not None and "loss" in point["values"]:
            best = min(best, point["values"]["loss"])
            out[point["step"]] = best
    return out


def median_stop(
    client: Client, live: list[int], curves: dict[int, dict[int, float]], args: argparse.Namespace
) -> None:
    """Cancel each live trial whose best loss at its latest step is worse than the median of the
    other trials' at that step (only once at least --min-peers others got there)."""
    if not live:
        return
    for item in client.metrics_of(live, tail=1000):  # every live trial's curve in one request
        curves[item["job_id"]] = losses_by_step(item)
    for job_id in live:
        mine = curves.get(job_id, {})
        if not mine or max(mine) < args.grace_steps:
            continue
        step = max(mine)
        peers = [c[step] for other, c in curves.items() if other != job_id and step in c]
        if len(peers) >= args.min_peers and mine[step] > statistics.median(peers):
            median = statistics.median(peers)
            print(f"  stop trial job {job_id}: loss {mine[step]:.4f} at step {step} > median {median:.4f}")
            try:
                why = f"stopped early: loss {mine[step]:.4f} at step {step} > median {median:.4f}"
                client.cancel(job_id, reason=why)
            except CorralError as exc:  # it ended meanwhile
                print(f"  (not stopped: {exc})")


def run(client: Client, args: argparse.Namespace) -> int:
    experiment, rng = args.experiment, random.Random(args.seed)
    # Restarted? Its trials are found again by label, with their parameters: only this user's
    # jobs (an admin's driver would otherwise adopt another user's experiment of the same name).
    me = client.me()["name"]
    trials = {job["id"]: job for job in client.iter_jobs(labels={"experiment": experiment}, user=me)}
    if trials:
        print(f"found {len(trials)} trials of experiment {experiment} (restarted)")
    for _ in range(len(trials)):
        sample(rng)  # the same seed goes on with the next parameters
    # the earlier trials' curves are what the median rule compares the new ones with
    curves = (
        {m["job_id"]: losses_by_step(m) for m in client.metrics_of(list(trials), tail=1000)} if trials else {}
    )
    while True:
        live = [i for i, job in trials.items() if job["state"] not in TERMINAL_STATES]
        while len(live) < args.parallel and len(trials) < args.trials:
            lr, momentum = sample(rng)
            job = client.submit(trial_spec(experiment, len(trials), lr, momentum, args))
            print(f"trial {len(trials)}: job {job['id']} lr={lr:.2g} momentum={momentum:.2f}")
            trials[job["id"]] = job
            live.append(job["id"])
        if not live:
            break
        try:
            for job in client.wait_any(live, timeout_s=args.poll_s, poll_s=1.0):
                trials[job["id"]] = job
                print(f"  job {job['id']} {job['state']}")
        except TimeoutError:
            pass
        median_stop(client, [i for i in live if trials[i]["state"] not in TERMINAL_STATES], curves, args)
    finals = {m["job_id"]: losses_by_step(m) for m in client.metrics_of(list(trials), tail=1000)}
    scored = {i: min(c.values()) for i, c in finals.items() if c}
    if not scored:
        print("no trial reported a loss", file=sys.stderr)
        return 1
    best = min(scored, key=lambda i: scored[i])
    labels = trials[best]["labels"]
    params = f"lr={labels['lr']} momentum={labels['momentum']}"
    print(f"best: job {best} (trial {labels['trial']}) loss {scored[best]:.4f} {params}")
    stopped = sum(1 for job in trials.values() if job["state"] == "cancelled")
    print(f"{len(trials)} trials, {stopped} stopped early")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--experiment", default=f"search-{int(time.time())}", help="the label value of this search's trials"
    )
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--parallel", type=int, default=4, help="trials live at once")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--step-s", type=float, default=0.3, help="seconds per step of a trial")
    parser.add_argument("--grace-steps", type=int, default=5, help="steps before a trial may be stopped")
    parser.add_argument("--min-peers", type=int, default=2, help="other trials at a step before comparing")
    parser.add_argument("--poll-s", type=float, default=3.0, help="how often the running trials are compared")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--url")
    parser.add_argument("--token")
    args = parser.parse_args()
    client = Client(args.url, args.token) if args.url else Client.from_config()
    with client:
        try:
            return run(client, args)
        except KeyboardInterrupt:
            done = client.cancel_by_labels({"experiment": args.experiment})
            print(f"interrupted: cancelled {done['matched']} live trials")
            return 130


if __name__ == "__main__":
    sys.exit(main())
