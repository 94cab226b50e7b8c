#!/usr/bin/env bash
# Every check the project has, in the order that fails fastest. Called by `./run test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check src tests bench; ruff format --check src tests bench
echo "== mypy"; mypy
if [ -d deploy/prometheus/rules ]; then
  echo "== promtool"
  promtool check rules deploy/prometheus/rules/*.yml
  promtool test rules deploy/prometheus/tests/*.yml
fi
echo "== pytest"
# The slowest tests are listed so that what each change adds to the suite's time is visible.
exec pytest --durations=25 "$@"
