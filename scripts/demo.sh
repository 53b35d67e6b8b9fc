#!/usr/bin/env bash
# `make demo`: the whole product in one process (`fleetscope up`) on the embedded store: the
# bundled fleet of real vLLM engines (the CPU build here) with its gateway, the long-context-rollout
# incident as traffic, the collector, the alert evaluator printing its notifications, a status line
# every 10 s and the dashboard at http://127.0.0.1:8501. Ctrl-C stops everything and flushes.
# DEMO_ARGS passes options on, e.g. DEMO_ARGS="--fleet sim --replicas 12" make demo.
set -uo pipefail
BIN=${BIN:-.venv/bin}
# shellcheck disable=SC2086  # DEMO_ARGS is split into options on purpose
exec "$BIN/fleetscope" up ${DEMO_ARGS:-}
