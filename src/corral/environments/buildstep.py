"""What an environment's build job runs, inside its sandbox as the submitter, on either engine.
Standard library only: the server publishes this file and its uv binary on the storage root
(corral.environments.tools) and the job runs it with the environment's own interpreter, never
with the server's environment. The request comes in the job's env:

    CORRAL_ENV_SOURCE_KIND   requirements | pyproject
    CORRAL_ENV_SOURCE        the requirements.txt or pyproject.toml text
    CORRAL_ENV_PYTHON        the interpreter to build for (the version's recorded interpreter)
    CORRAL_ENV_UV            the published uv's name beside this file (unset: uv on PATH)
    CORRAL_ENV_INDEX_URL     the admin's package index, or ""
    CORRAL_ENV_FIND_LINKS    a dir of wheels bound read-only into the job, or ""
    CORRAL_ENV_STORE         the read-only view of `<storage root>/env/store` (cache check)
    CORRAL_ENV_CACHE_DOMAIN  whose copies this build may share: `shared` (an admin's build) or
                             `user-<id>` (the submitter's own); see cache_keys

Steps: resolve the request to a lock (`uv pip compile`, wheels only: no package code runs during
the build), write it to $CORRAL_OUTPUTS/lock.txt; if the store already holds that lock's key
(its own domain's copy, or an admin's), stop there (a cache hit); else make a relocatable venv at
$CORRAL_OUTPUTS/venv and install the lock into it. The interpreter's version goes to
$CORRAL_OUTPUTS/python.txt: the server checks it is the one it recorded (a node with another
Python at that path fails the build, not the jobs).
The server then moves the venv into the store (corral.environments.builds)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

LOCK_FILE = "lock.txt"
PYTHON_FILE = "python.txt"
VENV_DIR = "venv"
HIT_MARKER = "cache-hit"
CACHE_DOMAIN_ENV = "CORRAL_ENV_CACHE_DOMAIN"
# Copies built by admins, shared by every build. A user's build writes its venv as the user (who
# may edit it: their Slurm login shell reaches the outputs dir), so its copy is keyed in that
# user's own domain and never becomes another user's cache hit (review104, finding 2).
SHARED_DOMAIN = "shared"


def lock_pins(lock: str) -> list[str]:
    """The lock's requirement lines, without comments, blanks and uv's annotations, sorted."""
    pins = []
    for line in lock.splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            pins.append(text)
    return sorted(pins)


def cache_domain(user_id: int, is_admin: bool) -> str:
    """The cache domain of a build submitted by user `user_id`: admins' builds are shared."""
    return SHARED_DOMAIN if is_admin else f"user-{user_id}"


def cache_key(python_version: str, lock: str, domain: str) -> str:
    """The store's key of a lock built in `domain`: the same pins for the same interpreter are
    the same env, shared within the domain. Keys made before domains (no `domain` line) are
    never computed again: those copies serve the versions that name them, and no new build."""
    text = f"domain {domain}\npython {python_version}\n" + "\n".join(lock_pins(lock)) + "\n"
    return hashlib.sha256(text.encode()).hexdigest()


def cache_keys(python_version: str, lock: str, domain: str) -> list[str]:
    """The keys a build in `domain` may share, its own first: a user's build may use an admin's
    copy, never the other way round, nor another user's."""
    domains = [domain] if domain == SHARED_DOMAIN else [domain, SHARED_DOMAIN]
    return [cache_key(python_version, lock, d) for d in domains]


def _index_args() -> list[str]:
    args = ["--only-binary", ":all:"]
    index_url = os.environ.get("CORRAL_ENV_INDEX_URL", "")
    find_links = os.environ.get("CORRAL_ENV_FIND_LINKS", "")
    if index_url:
        args += ["--index-url", index_url]
    else:
        args.append("--no-index")
    if find_links:
        args += ["--find-links", find_links]
    return args


def _run(argv: list[str]) -> None:
    print("+ uv " + " ".join(argv[1:]), flush=True)  # which uv: the first line of the log
    done = subprocess.run(argv, check=False)
    if done.returncode != 0:
        print(f"corral env build: {argv[1:3]} failed with exit code {done.returncode}", flush=True)
        raise SystemExit(done.returncode or 1)


def _uv_env(work: Path) -> None:
    # The job's own work dir: a build job has no home (storage/plan.py), and a cache the user
    # could write would feed the venv that goes into the store.
    os.environ["UV_CACHE_DIR"] = str(work / ".uv-cache")
    os.environ["UV_NO_CONFIG"] = "1"  # no uv.toml of the user's naming another index
    os.environ["UV_PYTHON_DOWNLOADS"] = "never"
    os.environ["UV_LINK_MODE"] = "copy"  # never hard links into the user's cache
    os.environ["UV_SYSTEM_CERTS"] = "1"  # the node's CA store (/etc/ssl): a site's mirror or proxy
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_FIND_LINKS", "PIP_INDEX_URL"):
        os.environ.pop(name, None)


def _uv() -> str:
    published = os.environ.get("CORRAL_ENV_UV", "")
    if published:
        if os.path.basename(published) != published:
            raise SystemExit(f"corral env build: CORRAL_ENV_UV={published!r} must be a file name")
        return os.path.join(os.path.dirname(os.path.abspath(__file__)), published)
    return shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")


def main() -> None:
    work = Path(os.environ.get("CORRAL_WORK_DIR") or os.getcwd())
    outputs = Path(os.environ["CORRAL_OUTPUTS"])
    kind = os.environ["CORRAL_ENV_SOURCE_KIND"]
    python = os.environ["CORRAL_ENV_PYTHON"]
    uv = _uv()
    _uv_env(work)
    request = work / ("pyproject.toml" if kind == "pyproject" else "requirements.in")
    request.write_text(os.environ["CORRAL_ENV_SOURCE"])
    lock = outputs / LOCK_FILE
    print(f"corral env build: resolving {request.name} for {python} with uv {uv}", flush=True)
    compile_args = ["--no-header", "--no-annotate", "--quiet", "-o", str(lock)]
    _run([uv, "pip", "compile", str(request), "--python", python, *_index_args(), *compile_args])
    version = subprocess.run(
        [python, "-I", "-c", "import platform; print(platform.python_version())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (outputs / PYTHON_FILE).write_text(version + "\n")
    keys = cache_keys(version, lock.read_text(), os.environ.get(CACHE_DOMAIN_ENV) or SHARED_DOMAIN)
    key = keys[0]
    print(f"corral env build: lock {key} ({len(lock_pins(lock.read_text()))} packages)", flush=True)
    store = os.environ.get("CORRAL_ENV_STORE", "")
    for found in keys:
        if store and os.path.isdir(os.path.join(store, found)):
            (outputs / HIT_MARKER).write_text(found + "\n")
            print(f"corral env build: cache hit, {found} is built already; nothing to install", flush=True)
            return
    venv = outputs / VENV_DIR
    _run([uv, "venv", "--relocatable", "--python", python, "--no-config", str(venv)])
    install = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--no-deps"]
    _run([*install, *_index_args(), "-r", str(lock)])
    print(f"corral env build: built {key}", flush=True)


if __name__ == "__main__":
    main()
