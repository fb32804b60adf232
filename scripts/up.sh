#!/usr/bin/env bash
# Sets up a fresh machine and runs strata on its embedded default: a local Postgres in the
# data directory, the local blob store, API on http://127.0.0.1:3000.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cargo build --release
exec ./target/release/strata up "$@"
