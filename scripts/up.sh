#!/usr/bin/env bash
# Sets up a fresh machine and runs strata on its embedded default: a local Postgres in the
# data directory, the local blob store, API on http://127.0.0.1:3000. Installs only what
# running needs (the test tools are scripts/setup.sh's) and builds once, in release.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup-run.sh
if [ ! -x ./target/release/strata ]; then
  echo "up: building strata in release mode (the first build takes several minutes)" >&2
fi
cargo build --release
./scripts/base-images.sh ./target/release/strata
exec ./target/release/strata up "$@"
