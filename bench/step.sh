#!/usr/bin/env bash
# One step of `make bench`: bench/step.sh TITLE COMMAND [ARGS...]
# Prints the title, runs the command, prints its wall time and appends "title<TAB>seconds<TAB>exit
# status" to bench/results/steps.tsv (bench/summary.py adds them up). Exits with the command's status.
set -u
title=$1
shift
echo "== $title"
start=$(date +%s)
"$@"
rc=$?
took=$(($(date +%s) - start))
printf '   (%s: %d min %02d s)\n' "$title" $((took / 60)) $((took % 60))
mkdir -p bench/results
printf '%s\t%d\t%d\n' "$title" "$took" "$rc" >>bench/results/steps.tsv
exit $rc
