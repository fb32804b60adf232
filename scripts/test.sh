#!/usr/bin/env bash
# Sets up a fresh machine and runs the whole test suite against real Postgres.
#
# Tests never write to the node's own data directory (/var/lib/strata); they only read the base
# images setup builds there. As root, the suite runs in a private mount namespace in which that
# directory is mounted read-only, so a test that writes there fails instead of leaving files
# behind (STRATA_TEST_NODE_WRITABLE=1 skips this, for debugging only).
set -euo pipefail
script="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cd "$(dirname "$0")/.."
node_dir=/var/lib/strata

if [ -z "${STRATA_TEST_IN_NAMESPACE:-}" ]; then
  ./scripts/setup.sh
  if [ "$(id -u)" = 0 ] && [ -z "${STRATA_TEST_NODE_WRITABLE:-}" ]; then
    mkdir -p "$node_dir"
    exec unshare --mount --propagation private env STRATA_TEST_IN_NAMESPACE=1 bash -c \
      'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" && shift && exec "$@"' \
      _ "$node_dir" "$script" "$@"
  fi
fi
if [ -n "${STRATA_TEST_IN_NAMESPACE:-}" ] && touch "$node_dir/.write-probe" 2>/dev/null; then
  rm -f "$node_dir/.write-probe"
  echo "test: $node_dir is writable inside the test namespace" >&2
  exit 1
fi

# The integration tests' Postgres (tests/integration/common) is throwaway: once the run is over it
# is stopped and removed, which frees the gigabytes its per-test databases add up to at once.
# (Dropping each database as its test ends would hold back the feed horizon other tests read.)
remove_test_cluster() {
  [ -z "${STRATA_TEST_DATABASE_URL:-}" ] || return 0
  local dir=/tmp/strata-test-pg pid
  if [ -f "$dir/data/postmaster.pid" ]; then
    pid=$(head -1 "$dir/data/postmaster.pid")
    kill -INT "$pid" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  rm -rf "$dir"
}

status=0
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --no-fail-fast "$@" || status=$?
else
  cargo test --no-fail-fast "$@" || status=$?
fi
remove_test_cluster
[ "$status" = 0 ] || exit "$status"
# The real E2B SDK against a real strata (uses the debug binary the run above built).
.venv/bin/python -m pytest tests/e2e -q
