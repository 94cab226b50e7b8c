"""examples/automl_search.py against a real server whose jobs run (sandboxed, CPU only): trials
are submitted with their labels, watched with wait_any, read through the metrics they append to
$CORRAL_OUTPUTS/metrics.jsonl, the worse ones stopped by the median rule, and a restarted driver
finds its earlier trials by label and only adds the missing ones."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from corral.sdk import Client
from tests.server_fixture import CorralServer, corral_server

__all__ = ["corral_server"]  # the fixture

ROOT = Path(__file__).resolve().parents[2]


def driver(server: CorralServer, *args: str) -> str:
    env = {**os.environ, "CORRAL_URL": server.url, "CORRAL_TOKEN": server.token}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "automl_search.py"), "--experiment", "ex1", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_example_search_runs_stops_early_and_resumes(corral_server: CorralServer) -> None:
    # seed 2: of the first three trials (run together), trial 1 is far worse (lr 1.5e-4: loss
    # ~2.2 at step 3 against ~1.0 and ~0.5), so the median rule must stop it while it runs
    common = (
        *("--parallel", "3", "--steps", "10", "--step-s", "0.4", "--poll-s", "1", "--grace-steps", "3"),
        *("--seed", "2"),
    )
    out = driver(corral_server, "--trials", "5", *common)
    assert re.search(r"^best: job \d+ \(trial \d\) loss \d\.\d{4} lr=", out, re.M), out
    with Client(corral_server.url, corral_server.token) as client:
        trials = client.jobs(labels={"experiment": "ex1"}, limit=100)["items"]
        assert len(trials) == 5 and {j["state"] for j in trials} <= {"succeeded", "cancelled"}, trials
        stopped = {j["id"] for j in trials if j["state"] == "cancelled"}
        assert all(
            j["reason"].startswith("cancel requested by admin: stopped early: loss ")
            for j in trials
            if j["id"] in stopped
        ), trials
        # every cancelled trial was stopped by the rule (one it meant to stop may have ended first),
        # and the clearly bad one was
        assert stopped <= {int(i) for i in re.findall(r"stop trial job (\d+)", out)}, out
        bad = next(j for j in trials if j["labels"]["trial"] == "1")
        assert bad["id"] in stopped and float(bad["labels"]["lr"]) < 2e-4, (bad, out)
        finished = [j for j in trials if j["state"] == "succeeded"]
        assert finished and all(len(client.metrics(j["id"])["points"]) == 10 for j in finished)
    again = driver(corral_server, "--trials", "7", *common)
    assert "found 5 trials of experiment ex1 (restarted)" in again, again
    assert len(re.findall(r"^trial \d: job \d+", again, re.M)) == 2, again
    with Client(corral_server.url, corral_server.token) as client:
        assert client.jobs(labels={"experiment": "ex1"})["total"] == 7
