#!/usr/bin/env bash
# Installs what running strata needs on a fresh Debian machine (run as root), and nothing the
# tests alone need (those are scripts/setup.sh's): the Postgres server binaries (strata starts
# its own cluster with them), debootstrap for the Debian base image, and libseccomp, which the
# sandbox filter is built with. Idempotent; safe to run again.
set -euo pipefail

need_apt=()
command -v cargo >/dev/null || { echo "setup: cargo is required (install Rust with rustup)" >&2; exit 1; }
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_apt+=(postgresql)
command -v psql >/dev/null || need_apt+=(postgresql-client)
id postgres >/dev/null 2>&1 || need_apt+=(postgresql)
command -v debootstrap >/dev/null || need_apt+=(debootstrap)
# Sandbox networks: the node firewall (ADR 0022) is nftables.
command -v nft >/dev/null || need_apt+=(nftables)
# The sandbox system-call filter is built with libseccomp (linked at build time).
ls /usr/lib/*/libseccomp.so >/dev/null 2>&1 || need_apt+=(libseccomp-dev)

if [ ${#need_apt[@]} -gt 0 ]; then
  echo "setup: installing ${need_apt[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# The Debian package starts its own cluster on 5432; strata does not use it.
