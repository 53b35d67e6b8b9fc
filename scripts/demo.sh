#!/usr/bin/env bash
# The demo `make demo` runs: migrate the embedded stores, start the bundled fleet of real
# vLLM engines, send a minute of steady traffic, and stop the fleet (also on Ctrl-C).
# It grows as the collector, dashboard and alerts arrive (`fleetscope up`).
set -uo pipefail
BIN=${BIN:-.venv/bin}
"$BIN/fleetscope" migrate || exit $?
trap '"$BIN/fleetscope" fleet down' EXIT
trap 'exit 130' INT TERM
"$BIN/fleetscope" fleet up --detach || exit $?
"$BIN/fleetscope" fleet status
"$BIN/fleetscope" fleet traffic --scenario steady --duration "${DEMO_SECONDS:-60}"
