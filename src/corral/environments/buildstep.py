"""What an environment's build job runs, inside its sandbox as the submitter (standard library
only; `python -m corral.environments.buildstep` under the server's own environment, whose `uv`
it uses). The request comes in the job's env:

    CORRAL_ENV_SOURCE_KIND   requirements | pyproject
    CORRAL_ENV_SOURCE        the requirements.txt or pyproject.toml text
    CORRAL_ENV_PYTHON        the interpreter to build for (the server's base interpreter)
    CORRAL_ENV_INDEX_URL     the admin's package index, or ""
    CORRAL_ENV_FIND_LINKS    a dir of wheels bound read-only into the job, or ""
    CORRAL_ENV_STORE         the read-only view of `<storage root>/env/store` (cache check)

Steps: resolve the request to a lock (`uv pip compile`, wheels only: no package code runs during
the build), write it to $CORRAL_OUTPUTS/lock.txt; if the store already holds that lock's key,
stop there (a cache hit); else make a relocatable venv at $CORRAL_OUTPUTS/venv and install the
lock into it. The server then moves the venv into the store (corral.environments.builds)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

LOCK_FILE = "lock.txt"
VENV_DIR = "venv"
HIT_MARKER = "cache-hit"


def lock_pins(lock: str) -> list[str]:
    """The lock's requirement lines, without comments, blanks and uv's annotations, sorted."""
    pins = []
    for line in lock.splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            pins.append(text)
    return sorted(pins)


def cache_key(python_version: str, lock: str) -> str:
    """The store's key of a lock: the same pins for the same interpreter are the same env."""
    text = f"python {python_version}\n" + "\n".join(lock_pins(lock)) + "\n"
    return hashlib.sha256(text.encode()).hexdigest()


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
    print("+ " + " ".join(argv), flush=True)
    done = subprocess.run(argv, check=False)
    if done.returncode != 0:
        print(f"corral env build: {argv[1:3]} failed with exit code {done.returncode}", flush=True)
        raise SystemExit(done.returncode or 1)


def _uv_env(work: Path) -> None:
    home = os.environ.get("HOME") or str(work)
    os.environ["UV_CACHE_DIR"] = os.path.join(home, ".cache", "uv")  # the submitter's own cache
    os.environ["UV_NO_CONFIG"] = "1"  # no uv.toml of the user's naming another index
    os.environ["UV_PYTHON_DOWNLOADS"] = "never"
    os.environ["UV_LINK_MODE"] = "copy"  # never hard links into the user's cache
    os.environ["UV_SYSTEM_CERTS"] = "1"  # the node's CA store (/etc/ssl): a site's mirror or proxy
    for name in ("UV_INDEX_URL", "UV_EXTRA_INDEX_URL", "UV_INDEX", "UV_FIND_LINKS", "PIP_INDEX_URL"):
        os.environ.pop(name, None)


def main() -> None:
    work = Path(os.environ.get("CORRAL_WORK_DIR") or os.getcwd())
    outputs = Path(os.environ["CORRAL_OUTPUTS"])
    kind = os.environ["CORRAL_ENV_SOURCE_KIND"]
    python = os.environ["CORRAL_ENV_PYTHON"]
    uv = shutil.which("uv") or os.path.join(os.path.dirname(sys.executable), "uv")
    _uv_env(work)
    request = work / ("pyproject.toml" if kind == "pyproject" else "requirements.in")
    request.write_text(os.environ["CORRAL_ENV_SOURCE"])
    lock = outputs / LOCK_FILE
    print(f"corral env build: resolving {request.name} for {python}", flush=True)
    compile_args = ["--no-header", "--no-annotate", "--quiet", "-o", str(lock)]
    _run([uv, "pip", "compile", str(request), "--python", python, *_index_args(), *compile_args])
    version = subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    key = cache_key(version, lock.read_text())
    print(f"corral env build: lock {key} ({len(lock_pins(lock.read_text()))} packages)", flush=True)
    store = os.environ.get("CORRAL_ENV_STORE", "")
    if store and os.path.isdir(os.path.join(store, key)):
        (outputs / HIT_MARKER).write_text(key + "\n")
        print(f"corral env build: cache hit, {key} is built already; nothing to install", flush=True)
        return
    venv = outputs / VENV_DIR
    _run([uv, "venv", "--relocatable", "--python", python, "--no-config", str(venv)])
    install = [uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--no-deps"]
    _run([*install, *_index_args(), "-r", str(lock)])
    print(f"corral env build: built {key}", flush=True)


if __name__ == "__main__":
    main()
