#!/usr/bin/env bash
# Counts and lists the skipped tests recorded in the suites' logs (the directory in $1).
# A skip prints `SKIPPED: <reason>` (Rust tests and the shell checks) or `SKIPPED [n] <where>:
# <reason>` (pytest -rs, for n tests); every occurrence counts.
set -euo pipefail
dir=${1:?usage: skips.sh LOG_DIR}
total=0
for log in "$dir"/*.log; do
    [ -e "$log" ] || continue
    lines=$(grep -aoE 'SKIPPED( \[[0-9]+\])?:? .*' "$log" | sort | uniq -c || true)
    [ -n "$lines" ] || continue
    n=$(printf '%s\n' "$lines" | awk '{ k = 1; if (match($0, /SKIPPED \[[0-9]+\]/)) k = substr($0, RSTART + 9, RLENGTH - 10); s += $1 * k } END { print s }')
    total=$((total + n))
    echo "skipped in $(basename "$log" .log):"
    printf '%s\n' "$lines" | sed 's/^ */  /'
done
echo "make test: $total skipped test(s)"
