#!/usr/bin/env bash
# Set up everything Corral needs on a Debian/Ubuntu machine with Python 3.11+.
#   scripts/setup.sh demo   system packages for running Corral (bubblewrap) + .venv
#   scripts/setup.sh test   also everything the test suite runs for real: PostgreSQL, Prometheus,
#                           Alertmanager, promtool, Chromium, Slurm daemons and munge
# Idempotent: a second run installs nothing new. Needs root or sudo for the system packages.
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-demo}"

# openssh-sftp-server: the SSH gateway runs sftp-server inside a job's sandbox for SFTP and scp
demo_pkgs=(python3-venv python3-dev gcc bubblewrap procps iproute2 slirp4netns openssh-sftp-server)
test_pkgs=(postgresql prometheus prometheus-alertmanager chromium fonts-dejavu-core
           slurmd slurmctld slurm-client munge util-linux openssh-client openssh-server)

pkgs=("${demo_pkgs[@]}")
[ "$mode" = test ] && pkgs+=("${test_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "corral setup: installing system packages: ${missing[*]}"
    # Debian's packages start no services inside a container without systemd; tests start their own.
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "corral setup: apt-get not found; install these yourself: ${missing[*]}" >&2
  fi
fi

python=${PYTHON:-python3}
"$python" -c 'import sys; assert sys.version_info >= (3, 11), "Corral needs Python 3.11+"'
[ -x .venv/bin/python ] || "$python" -m venv .venv
stamp=.venv/.corral-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[dev]"
  touch "$stamp"
fi
# The scheduler and the simulator's replay compiled with mypyc (docs/scheduler.md, "Compiled
# build"): a replay takes about a quarter less CPU. Rebuilt only when their sources or the pinned
# mypy changed (a stamp in build/mypyc/; about 80 s); when it cannot be built (no C compiler)
# everything runs the pure-Python modules, with the same results.
.venv/bin/python scripts/build_compiled.py || true  # one line: built, up to date, or failed and why
# The demo's "sklearn" environment (corral.environments.demo) is built offline from these wheels
# (CORRAL_ENV_FIND_LINKS); fetched once, here, like the packages above.
wheels=.venv/wheelhouse
wstamp=$wheels/.corral-fetched
if [ ! -f "$wstamp" ] || [ pyproject.toml -nt "$wstamp" ]; then
  .venv/bin/pip download -q --only-binary :all: -d "$wheels" "numpy==2.4.6" "scikit-learn==1.9.1"
  touch "$wstamp"
fi
