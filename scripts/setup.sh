#!/usr/bin/env bash
# Installs what the tests need on a fresh Debian machine (run as root): what running strata
# needs (scripts/setup-run.sh), the test tools (a browser, a registry, skopeo, an S3 server, the
# stock SDKs) and the base images, built with the debug binary the tests use. Idempotent; safe
# to run again.
set -euo pipefail

"$(dirname "$0")/setup-run.sh"
need_apt=()
# openssl is the benchmark baseline.
command -v openssl >/dev/null || need_apt+=(openssl)
# The operator page (/ui) is tested in a real headless browser.
command -v chromium >/dev/null || need_apt+=(chromium)
# README examples (tests/integration/ops_readme.rs) use curl.
command -v curl >/dev/null || need_apt+=(curl)
# Registry pulls are tested against a real registry (CNCF distribution) on loopback, with
# images pushed by skopeo; htpasswd makes the password file of the protected instance.
command -v docker-registry >/dev/null || need_apt+=(docker-registry)
command -v skopeo >/dev/null || need_apt+=(skopeo)
command -v htpasswd >/dev/null || need_apt+=(apache2-utils)
# The e2e tests serve the node's own Debian index (lz4-compressed by apt) to sandboxes.
command -v lz4 >/dev/null || need_apt+=(lz4)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

# `strata build` is compared with `docker build` (tests/e2e/test_docker_equivalence.py), which
# starts its own daemon on a private socket with no bridge or iptables rules. The package's own
# service must not start: its default rules would change how this node forwards sandbox traffic.
if ! command -v dockerd >/dev/null; then
  echo "setup: installing docker.io (its service is not started)" >&2
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends docker.io >/dev/null
  rm -f /usr/sbin/policy-rc.d
  trap - EXIT
fi

# The packages `apt_install` tests install, served to sandboxes from the tests' own outside
# world (tests/e2e/conftest.py) with the node's Debian index, so the tests reach no mirror.
mkdir -p /var/cache/strata-test/apt
ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1 || apt-get update -qq
if ! ls /var/cache/strata-test/apt/tree_*.deb >/dev/null 2>&1; then
  (cd /var/cache/strata-test/apt && apt-get download -qq tree 2>/dev/null)
fi
# apt in a sandbox also fetches the English translations the node's InRelease names (by hash,
# so the file is the one that InRelease signs). The release and its mirror are the ones this
# machine's apt uses (its first plain release with a main component), as apt lists them.
base_uri=$(apt-get indextargets --no-release-info --format '$(BASE_URI) $(RELEASE)' \
  'Identifier: Packages' 'Component: main' | awk '$2 !~ /-/ && !found {print $1; found = 1}')
if [ -z "$base_uri" ]; then
  echo "setup: this machine's apt sources name no Debian release with a main component" >&2
  exit 1
fi
release="/var/lib/apt/lists/$(printf '%s' "${base_uri#*://}" | tr / _)InRelease"
translation=$(awk '/^SHA256:/{s=1;next} /^[^ ]/{s=0} s && $3=="main/i18n/Translation-en.xz"{print $1}' "$release")
if [ -n "$translation" ] && [ ! -s "/var/cache/strata-test/apt/$translation" ]; then
  curl -fsS -o "/var/cache/strata-test/apt/$translation" \
    "${base_uri}main/i18n/by-hash/SHA256/$translation"
fi

# The stock E2B SDK for the conformance suite, pinned, in a virtualenv beside the checkout.
(
  cd "$(dirname "$0")/.."
  if ! python3 -m venv --help >/dev/null 2>&1; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
  fi
  [ -x .venv/bin/python ] || python3 -m venv .venv
  if ! cmp -s tests/e2e/requirements.txt .venv/requirements.installed; then
    .venv/bin/pip install --quiet --disable-pip-version-check -r tests/e2e/requirements.txt
    cp tests/e2e/requirements.txt .venv/requirements.installed
  fi
)

# An S3-protocol server (moto, pinned) for the object-store blob tests and `strata bench upload
# --store s3`; the tests start and stop it themselves. Its own virtualenv, so it pins nothing of
# the SDK's.
(
  cd "$(dirname "$0")/.."
  [ -x .venv-s3/bin/python ] || python3 -m venv .venv-s3
  if ! cmp -s tests/s3/requirements.txt .venv-s3/requirements.installed; then
    .venv-s3/bin/pip install --quiet --disable-pip-version-check -r tests/s3/requirements.txt
    cp tests/s3/requirements.txt .venv-s3/requirements.installed
  fi
)

# The stock E2B JS SDK for the conformance suite, pinned by tests/e2e/js/package-lock.json.
(
  cd "$(dirname "$0")/../tests/e2e/js"
  if ! command -v npm >/dev/null; then
    apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
  fi
  if ! cmp -s package-lock.json node_modules/.installed-lock.json; then
    npm ci --silent --no-audit --no-fund
    cp package-lock.json node_modules/.installed-lock.json
  fi
)

# Base images for sandboxes (busybox, debian:bookworm, e2bdev/base), built once into the node
# data directory, where `cargo test` also finds them. Needs root (sandboxes are namespaces).
(
  cd "$(dirname "$0")/.."
  cargo build --quiet --bins
  ./scripts/base-images.sh ./target/debug/strata
)
