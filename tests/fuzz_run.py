"""Run schemathesis (its CLI, with tests/fuzz_hooks.py) against a running Corral server and read
back what it found: used by tests/api/test_fuzz.py (a reduced run) and bench/fuzz_api.py (the
full one). Test code, not shipped in the `corral` package."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
LINKS_LINE = re.compile(r"API Links:\s+(\d+) covered / (\d+) selected / (\d+) total")
ALL_PHASES = ("examples", "coverage", "fuzzing", "stateful")


@dataclass
class FuzzResult:
    who: str
    seed: int
    cases: int  # test cases schemathesis generated (all phases)
    requests_by_operation: Counter[str]  # every request sent, stateful steps included
    stateful_responses: Counter[str]  # "POST /api/v1/jobs 201": the stateful phase's answers
    failures: dict[str, int]  # failure code and title -> unique failures
    failing_operations: dict[str, list[str]]
    errors: int  # test cases that errored (could not be run), not failures
    server_errors: int  # 5xx answers seen
    unreadable_4xx: dict[str, int]  # 4xx answers without a JSON `detail`
    accepted: dict[str, int]  # failures dropped as accepted exceptions (tests/fuzz_hooks.py)
    links_covered: int
    links_total: int
    wall_s: float
    exit_code: int
    output: str = field(repr=False)

    @property
    def requests(self) -> int:
        return sum(self.requests_by_operation.values())

    @property
    def failure_count(self) -> int:
        return sum(self.failures.values())


def member_token(base_url: str, admin_token: str, name: str = "fuzzmember") -> tuple[str, int]:
    """Create a plain member (group "default") and a token for it: (secret, token id)."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {admin_token}"}) as admin:
        admin.post("/api/v1/users", json={"name": name, "groups": ["default"]}).raise_for_status()
        made = admin.post("/api/v1/tokens", json={"name": "fuzz", "user": name})
        made.raise_for_status()
        return str(made.json()["token"]), int(made.json()["id"])


ADMIN = "admin"  # the server's bootstrap admin (corral.services.auth.ADMIN_USER)
EXAMPLE_POLICY = "example-policy"  # the policy the schema's example page (POST /oncall/pages) names
SESSIONS_PER_USER = 3  # the fuzzing phase revokes some (it reuses the ids GET /sessions lists)


def fuzz_server_env() -> dict[str, str]:
    """The fuzzed server's settings beyond the harness's: a (empty) local package index, so that
    POST /environments is allowed at all (without one it is a 409 whatever the body) and gives
    the links from it a version to follow; its builds fail, finding nothing to install."""
    return {"CORRAL_ENV_FIND_LINKS": tempfile.mkdtemp(prefix="corral-fuzz-index-")}


def seed_linked_data(base_url: str, admin_token: str, users: tuple[str, ...]) -> None:
    """What the schema's examples and the declared links start from and a fuzzer cannot make
    itself: the escalation policy the example page names, and a portal session of each user
    (only a login with the right password makes one) for GET /sessions → DELETE /sessions/{id}.
    Setting a password revokes no token."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {admin_token}"}) as admin:
        steps = {"steps": [{"user": ADMIN}]}
        admin.put(f"/api/v1/oncall/policies/{EXAMPLE_POLICY}", json=steps).raise_for_status()
        for user in users:
            password = f"fuzz-{user}-password"
            admin.put(f"/api/v1/users/{user}/password", json={"password": password}).raise_for_status()
            for _ in range(SESSIONS_PER_USER):
                with httpx.Client(base_url=base_url) as anonymous:
                    login = {"username": user, "password": password}
                    anonymous.post("/api/v1/auth/login", json=login).raise_for_status()


def token_ids(base_url: str, admin_token: str) -> list[int]:
    """Ids of every token that exists now (the run protects them from revocation)."""
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {admin_token}"}) as admin:
        listed = admin.get("/api/v1/tokens", params={"all": "true"})
        listed.raise_for_status()
        return [int(t["id"]) for t in listed.json()]


def run_schemathesis(
    base_url: str,
    token: str,
    *,
    who: str,
    protected_token_ids: list[int],
    max_examples: int,
    seed: int,
    phases: tuple[str, ...] = ALL_PHASES,
    workers: int = 1,
    timeout_s: float = 1800.0,
    stateful_steps: int = 10,
    stateful_examples: int | None = None,
    max_time_s: int | None = None,
    extra_args: tuple[str, ...] = (),
) -> FuzzResult:
    """One schemathesis run with every check, authenticated with `token`."""
    work = Path(tempfile.mkdtemp(prefix=f"corral-fuzz-{who}-"))
    stats_path = work / "stats.json"
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "tests.fuzz_hooks",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH", "")])),
        "FUZZ_PROTECTED_TOKEN_IDS": ",".join(str(i) for i in protected_token_ids),
        "FUZZ_STATS_FILE": str(stats_path),
    }
    command = [
        sys.executable, "-m", "schemathesis.cli",
        "--config-file", str(_config_file(work, stateful_steps, stateful_examples)),
        "run", f"{base_url}/openapi.json",
        "--checks", "all",
        "--seed", str(seed),
        "--max-examples", str(max_examples),
        "--phases", ",".join(phases),
        "--workers", str(workers),
        "--header", f"Authorization: Bearer {token}",
        "--generation-database", "none",
        # Strings that are text: a lone UTF-16 surrogate is "valid" for JSON Schema but no text;
        # the API refuses it with a 400 (tests/api/test_fuzz.py holds that).
        "--generation-codec", "utf-8",
        "--suppress-health-check", "all",
        "--request-timeout", "30",
        "--no-color",
        "--report", "json",
        "--report-json-path", str(work / "report.json"),
        *(("--max-time", str(max_time_s)) if max_time_s else ()),
        *extra_args,
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
        )
        wall = time.perf_counter() - started
        return _read_result(who, seed, work, done.stdout + done.stderr, done.returncode, wall)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run_as_member_and_admin(
    base_url: str, admin_token: str, **options: Any
) -> tuple[list[FuzzResult], dict[str, str]]:
    """The same run as a fresh member and as the admin, both at once (the runs wait on the server
    far more than they compute); `options` go to run_schemathesis. Returns the two results and
    the tokens they used ({"member": ..., "admin": ...}), to check they still work after."""
    from concurrent.futures import ThreadPoolExecutor

    tokens = {"member": member_token(base_url, admin_token)[0], "admin": admin_token}
    protected = token_ids(base_url, admin_token)
    seed_linked_data(base_url, admin_token, users=("fuzzmember", ADMIN))

    def fuzz(who: str) -> FuzzResult:
        return run_schemathesis(base_url, tokens[who], who=who, protected_token_ids=protected, **options)

    stateful_time_s = options.pop("stateful_time_s", None)
    phases: tuple[str, ...] = options.get("phases", ALL_PHASES)
    if stateful_time_s and "stateful" in phases and len(phases) > 1:
        # Schemathesis ends a stateful suite at Hypothesis's first "inconsistent data generation"
        # (a replayed scenario that the server's changed state takes elsewhere), often after a
        # few dozen scenarios; under a time budget it runs suite after suite with fresh seeds
        # and counts the links covered over all of them. So the stateful phase runs on its own,
        # for `stateful_time_s`, after the others (whose data it then finds on the server).
        others = tuple(p for p in phases if p != "stateful")

        def fuzz(who: str) -> FuzzResult:
            token = tokens[who]
            first_options: dict[str, Any] = {**options, "phases": others}
            first = run_schemathesis(base_url, token, who=who, protected_token_ids=protected, **first_options)
            budget: dict[str, Any] = {**options, "phases": ("stateful",), "max_time_s": stateful_time_s}
            stateful = run_schemathesis(base_url, token, who=who, protected_token_ids=protected, **budget)
            return merge_results(first, stateful)

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(fuzz, tokens)), tokens


def merge_results(first: FuzzResult, stateful: FuzzResult) -> FuzzResult:
    """One identity's result from two runs: the other phases, then the stateful one."""

    def added(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
        return dict(Counter(a) + Counter(b))

    return FuzzResult(
        who=first.who,
        seed=first.seed,
        cases=first.cases + stateful.cases,
        requests_by_operation=first.requests_by_operation + stateful.requests_by_operation,
        stateful_responses=first.stateful_responses + stateful.stateful_responses,
        failures=added(first.failures, stateful.failures),
        failing_operations={
            check: first.failing_operations.get(check, []) + stateful.failing_operations.get(check, [])
            for check in {**first.failing_operations, **stateful.failing_operations}
        },
        errors=first.errors + stateful.errors,
        server_errors=first.server_errors + stateful.server_errors,
        unreadable_4xx=added(first.unreadable_4xx, stateful.unreadable_4xx),
        accepted=added(first.accepted, stateful.accepted),
        links_covered=stateful.links_covered,
        links_total=max(first.links_total, stateful.links_total),
        wall_s=first.wall_s + stateful.wall_s,
        exit_code=max(first.exit_code, stateful.exit_code),
        output=first.output + "\n" + stateful.output,
    )


def _config_file(work: Path, stateful_steps: int, stateful_examples: int | None) -> Path:
    """Stateful steps per scenario (and scenarios, where given apart from `--max-examples`), and
    only the links the schema declares: schemathesis's own inferred links guess (a node's GPU
    `job_id`, null when free, fed to GET /jobs/{job_id})."""
    path = work / "schemathesis.toml"
    scenarios = ""
    if stateful_examples:
        scenarios = f"\n[phases.stateful.generation]\nmax-examples = {stateful_examples}\n"
    path.write_text(
        f"[phases.stateful]\nmax-steps = {stateful_steps}\n{scenarios}"
        "\n[phases.stateful.inference]\nalgorithms = []\n"
    )
    return path


def _read_result(who: str, seed: int, work: Path, output: str, exit_code: int, wall: float) -> FuzzResult:
    report_path = work / "report.json"
    if not report_path.exists():
        raise RuntimeError(f"schemathesis wrote no report (exit {exit_code}):\n{output[-4000:]}")
    report: dict[str, Any] = json.loads(report_path.read_text())
    stats: dict[str, Any] = json.loads((work / "stats.json").read_text())
    links = LINKS_LINE.search(output)
    by_operation: Counter[str] = Counter()
    server_errors = 0
    for key, count in stats["responses"].items():
        label, status = key.rsplit(" ", 1)
        by_operation[label] += count
        server_errors += count if status.startswith("5") else 0
    failures = report.get("failures", [])
    return FuzzResult(
        who=who,
        seed=seed,
        cases=int(report["test_cases"]["generated"]),
        requests_by_operation=by_operation,
        stateful_responses=Counter(stats.get("stateful_responses", {})),
        failures={f"{f['code']} {f['title']}": int(f["count"]) for f in failures},
        failing_operations={f"{f['code']} {f['title']}": list(f["operations"]) for f in failures},
        errors=int(report["test_cases"].get("errored", 0)) + len(report.get("errors", [])),
        server_errors=server_errors,
        unreadable_4xx=dict(stats["unreadable_4xx"]),
        accepted=dict(stats["accepted"]),
        links_covered=int(links.group(1)) if links else 0,
        links_total=int(links.group(3)) if links else 0,
        wall_s=wall,
        exit_code=exit_code,
        output=output,
    )
