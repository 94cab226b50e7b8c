#!/usr/bin/env bash
# Every check the project has, in the order that fails fastest. Called by `./run test` and CI.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
echo "== ruff"; ruff check src tests bench scripts; ruff format --check src tests bench scripts
if [ -d deploy/prometheus/rules ]; then
  echo "== promtool"
  promtool check rules deploy/prometheus/rules/*.yml
  promtool test rules deploy/prometheus/tests/*.yml
fi
if [ $# -eq 0 ]; then
  # mypy (about a minute without its cache) and the pure-Python pass below each keep one core
  # busy, so they run side by side; mypy's report is printed when both have ended.
  mypy_out=$(mktemp)
  mypy >"$mypy_out" 2>&1 &
  mypy_pid=$!
  trap 'kill "$mypy_pid" 2>/dev/null; rm -f "$mypy_out"' EXIT
  # The compiled scheduler runs the suite below; the pure-Python modules are what runs where no build
  # could be made (no C compiler) and in non-editable installs: their own tests, once (~45 s), and
  # the tests that patch the scheduler (marked pure_scheduler), which the run below then leaves out
  # instead of running them again in a child pytest (tests/conftest.py).
  echo "== pytest tests/scheduler and the pure_scheduler tests, pure-Python scheduler (mypy beside it)"
  pure_rc=0
  CORRAL_PURE_PYTHON=1 pytest -q -p no:cacheprovider tests/scheduler || pure_rc=$?
  [ "$pure_rc" -ne 0 ] || CORRAL_PURE_PYTHON=1 pytest -q -p no:cacheprovider -m pure_scheduler tests/sim || pure_rc=$?
  mypy_rc=0; wait "$mypy_pid" || mypy_rc=$?
  trap - EXIT
  echo "== mypy"; cat "$mypy_out"; rm -f "$mypy_out"
  if [ "$mypy_rc" -ne 0 ] || [ "$pure_rc" -ne 0 ]; then exit 1; fi
  # Two workers: most tests wait on servers, daemons and browsers, and one process kept about one
  # core of two busy. Each test module runs whole on one worker, the Slurm tests all on one
  # (tests/conftest.py, pytest_xdist_make_scheduler). CORRAL_TEST_WORKERS=0 runs it in one process.
  set -- -n "${CORRAL_TEST_WORKERS:-2}" -m "not pure_scheduler"
else
  echo "== mypy"; mypy
fi
echo "== pytest"
# The slowest tests are listed so that what each change adds to the suite's time is visible.
exec pytest --durations=25 "$@"
