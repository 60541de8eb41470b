#!/usr/bin/env bash
# Installs what the console's browser tests need, when it is missing:
# Debian's Chromium (the browser Playwright drives; Playwright's own browser
# downloads cannot work on a machine that reaches only package registries)
# and this folder's node_modules (playwright-core, pinned in
# package-lock.json). Idempotent and silent when everything is there, so
# `make test-browser` and .ci/run can call it every time.
set -euo pipefail
cd "$(dirname "$0")"

log() { printf '[e2e install] %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

chromium_path=${CHROMIUM_PATH:-/usr/bin/chromium}

# as_root runs a command as root: directly when we are root, through sudo
# (non-interactive, so a password prompt fails instead of hanging CI) when
# sudo exists.
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo -n "$@"
  else
    die "need root to run '$*' (not root, no sudo): install Debian's chromium package by hand, or set CHROMIUM_PATH to a Chromium binary"
  fi
}

if [ ! -x "$chromium_path" ]; then
  if [ -n "${CHROMIUM_PATH:-}" ]; then
    die "CHROMIUM_PATH=$CHROMIUM_PATH is not an executable file"
  fi
  command -v apt-get >/dev/null 2>&1 ||
    die "$chromium_path is missing and there is no apt-get: install Chromium and set CHROMIUM_PATH to it"
  log "installing Debian's chromium"
  export DEBIAN_FRONTEND=noninteractive
  # The package lists may be stale or absent on a fresh machine: refresh
  # them only when the install fails, so a machine with good lists does not
  # pay for an update.
  if ! as_root apt-get install -y -q --no-install-recommends chromium >/dev/null; then
    log "apt-get install failed; running apt-get update and trying again"
    as_root apt-get update -q >/dev/null
    as_root apt-get install -y -q --no-install-recommends chromium >/dev/null
  fi
  [ -x "$chromium_path" ] || die "chromium installed but $chromium_path is not there"
  log "$("$chromium_path" --version 2>/dev/null || echo "chromium installed at $chromium_path")"
fi

command -v node >/dev/null 2>&1 || die "node is missing: install Node.js (20 or later) and npm"
command -v npm >/dev/null 2>&1 || die "npm is missing: install npm"

# npm ci when node_modules is missing or older than the lock file (npm ci
# rewrites node_modules whole, so its mtime marks the last install).
if [ ! -d node_modules ] || [ package-lock.json -nt node_modules ]; then
  log "npm ci in $(pwd)"
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  touch node_modules
fi
