#!/usr/bin/env bash
# Builds the built-in base images (busybox, debian:bookworm, e2bdev/base) that are missing from
# the node's data directory, with the strata binary given (default: the release build). Needs
# root: sandboxes are namespaces. About two minutes the first time (debootstrap, then apt in a
# sandbox), nothing once they exist.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:-./target/release/strata}"
if [ "$(id -u)" != 0 ]; then
  echo "setup: not root; skipping the sandbox base images (sandboxes need root)" >&2
  exit 0
fi
ls /var/lib/apt/lists/*_Packages >/dev/null 2>&1 || apt-get update -qq
data_dir="${STRATA_DATA_DIR:-/var/lib/strata}"
if [ ! -e "$data_dir/images/e2bdev%2Fbase.json" ]; then
  echo "setup: building the base images in $data_dir (debootstrap and apt: about two minutes)" >&2
fi
STRATA_DATA_DIR="$data_dir" "$bin" image build-base
