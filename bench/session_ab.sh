#!/bin/sh
# Alternates two forkbox builds through forkbox-session-bench, one run each per round, in one
# go: `bench/session_ab.sh BEFORE AFTER [ROUNDS]` (paths to the two `forkbox` binaries; keep a
# copy of the build before a change). Each run prints its own report (with the one-shot
# baseline measured in that run); compare the builds round by round. OPENS and CALLS set the
# runs' --opens and --calls (60 and 300).
set -eu
before=$1
after=$2
rounds=${3:-12}
bench=${BENCH:-target/release/forkbox-session-bench}
for i in $(seq 1 "$rounds"); do
  for b in before after; do
    if [ "$b" = before ]; then bin=$before; else bin=$after; fi
    echo "=== round $i: $b (load $(cut -d' ' -f1-3 /proc/loadavg)) $(date -u +%T)"
    "$bench" --forkbox "$bin" --opens "${OPENS:-60}" --calls "${CALLS:-300}" --levels 1 \
      --rounds 2 || echo "=== round $i: $b: the run failed"
  done
done
