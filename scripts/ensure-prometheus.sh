#!/usr/bin/env bash
# Make sure the Prometheus ecosystem's real binaries are installed for the tests that run them
# (issue 41: remote-write in, /metrics out, alerts through Alertmanager): Debian's `prometheus`
# (prometheus, promtool), `prometheus-alertmanager` (prometheus-alertmanager, amtool) and
# `victoria-metrics` (vmagent). Installs what is missing (root only). Installing starts nothing
# here: each test starts a binary itself on a free loopback port with a config it writes.
set -euo pipefail

say() { echo "ensure-prometheus: $*"; }
declare -A PACKAGE=(
  [prometheus]=prometheus [promtool]=prometheus
  [prometheus-alertmanager]=prometheus-alertmanager [amtool]=prometheus-alertmanager
  [vmagent]=victoria-metrics
)
missing=()
for bin in "${!PACKAGE[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || missing+=("${PACKAGE[$bin]}")
done
# Alertmanager's default template ships with the package (an extracted binary lacks it)
[ -f /usr/share/prometheus/alertmanager/default.tmpl ] || missing+=(prometheus-alertmanager)
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" != 0 ]; then
  say "missing: ${packages[*]}; install them from Debian's packages (needs root)"
  exit 1
fi
say "installing ${packages[*]} from Debian's packages (once)"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# no init system runs here: installing starts no service (each test starts its own binary)
apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
for bin in "${!PACKAGE[@]}"; do
  command -v "$bin" >/dev/null 2>&1 || { say "installed, but $bin is not on PATH"; exit 1; }
done
say "$(prometheus --version 2>&1 | head -1); $(vmagent --version 2>&1 | head -1)"
