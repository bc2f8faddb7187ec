#!/usr/bin/env bash
# A real node's /metrics, after it ran a job, passes `promtool check metrics` (names, types,
# suffixes, help texts), and every series the dashboard and the alert rules query is in it.
# Runs a private redis-server on a free port and one worker against it.
set -euo pipefail
# shellcheck source=tests/deploy/tools.sh
. "$(dirname "$0")/tools.sh"
why=$(ensure_promtool) || { echo "SKIPPED: $why"; exit 77; }
ensure_promtool
why=$(ensure_venv) || { echo "SKIPPED: $why"; exit 77; }
BIN=${FORKBOX_BIN:-$REPO/target/debug/forkbox}
[ -x "$BIN" ] || { echo "SKIPPED: no forkbox binary at $BIN (cargo build first)"; exit 77; }
command -v redis-server >/dev/null || { echo "SKIPPED: no redis-server"; exit 77; }

tmp=$(mktemp -d)
redis_pid='' worker_pid=''
cleanup() {
    [ -n "$worker_pid" ] && kill "$worker_pid" 2>/dev/null && wait "$worker_pid" 2>/dev/null
    [ -n "$redis_pid" ] && kill "$redis_pid" 2>/dev/null && wait "$redis_pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
redis_pid=$!
url="redis://127.0.0.1:$port"
for _ in $(seq 100); do redis-cli -p "$port" PING >/dev/null 2>&1 && break; sleep 0.1; done

"$BIN" worker --redis "$url" --queues metrics-check --slots 1 --metrics-addr 127.0.0.1:0 \
    >"$tmp/worker.log" 2>&1 &
worker_pid=$!
addr=''
for _ in $(seq 300); do
    addr=$(sed -n 's,.*metrics on http://\([^/]*\)/.*,\1,p' "$tmp/worker.log" | head -n1)
    [ -n "$addr" ] && break
    kill -0 "$worker_pid" 2>/dev/null || { cat "$tmp/worker.log"; echo "FAIL: the worker exited"; exit 1; }
    sleep 0.1
done
[ -n "$addr" ] || { cat "$tmp/worker.log"; echo "FAIL: the worker logged no metrics address"; exit 1; }

# One job that runs, so the histograms have samples and every labelled series exists.
"$BIN" submit --redis "$url" -q metrics-check --wait --timeout 60 -c 'echo hi' >/dev/null \
    || { cat "$tmp/worker.log"; echo "FAIL: the job did not run"; exit 1; }
curl -fsS "http://$addr/metrics" >"$tmp/metrics.txt"

if ! "$PROMTOOL" check metrics <"$tmp/metrics.txt"; then
    echo "FAIL: promtool check metrics found problems in the node's exposition"
    exit 1
fi
for name in forkbox_slots forkbox_queue_wait_seconds_bucket forkbox_jobs_in_flight \
    forkbox_queue_pending forkbox_dead_letter_length forkbox_build_info; do
    grep -q "^${name}[{ ]" "$tmp/metrics.txt" || { echo "FAIL: $name is not exported"; exit 1; }
done
for name in forkbox_dead_letter_total forkbox_reclaimed_total forkbox_job_duration_seconds_count \
    forkbox_spawn_seconds_count forkbox_queue_wait_seconds_count; do
    grep -q "^$name{.*queue=\"metrics-check\"" "$tmp/metrics.txt" \
        || { echo "FAIL: $name has no queue label"; exit 1; }
done
"$PY" "$REPO/tests/deploy/check_dashboard.py" --metrics "$tmp/metrics.txt"
echo "ok: promtool check metrics passes on a real node's scrape"
