#!/usr/bin/env bash
# Set up (quick when already done), then run the test suite.
#
#   scripts/test.sh                      # pytest tests -q
#   scripts/test.sh tests/test_infra.py  # extra args go to pytest
#
# Exit code: pytest's (5 = no tests collected).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export VENV="${VENV:-$REPO/.venv}"
cd "$REPO"

t0=$SECONDS
bash "$REPO/scripts/setup.sh"
echo "[test] setup took $((SECONDS - t0)) s"

# shellcheck source=scripts/triton_env.sh
source "$REPO/scripts/triton_env.sh"
if (($# == 0)); then
    set -- tests
fi
t1=$SECONDS
rc=0
"$VENV/bin/python" -m pytest -q "$@" || rc=$?
echo "[test] pytest exit code $rc after $((SECONDS - t1)) s (total $((SECONDS - t0)) s)"
exit "$rc"
