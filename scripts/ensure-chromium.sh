#!/usr/bin/env bash
# Make sure Debian's headless Chromium is installed for the real-browser dashboard tests
# (Playwright drives /usr/bin/chromium; its own browser download is not used). Installs the
# `chromium` package when it is missing (root only); FLEETSCOPE_CHROMIUM names another binary.
set -euo pipefail

say() { echo "ensure-chromium: $*"; }
BIN=${FLEETSCOPE_CHROMIUM:-/usr/bin/chromium}

if [ -x "$BIN" ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  say "$BIN is missing and this is not root: install Debian's chromium package, or set FLEETSCOPE_CHROMIUM"
  exit 1
fi
say "installing chromium from Debian's packages (once)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium fonts-dejavu-core >/dev/null
[ -x "$BIN" ] || { say "chromium installed but $BIN is not there"; exit 1; }
say "$("$BIN" --version 2>/dev/null || echo chromium)"
