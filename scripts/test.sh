#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite against real Postgres.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "$@"
else
  cargo test --no-fail-fast "$@"
fi
# The real E2B SDK against a real strata (uses the debug binary the run above built).
.venv/bin/python -m pytest tests/e2e -q
