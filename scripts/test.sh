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
