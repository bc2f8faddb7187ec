#!/usr/bin/env bash
# deploy/local-cluster.sh end to end: three hosts (Redis + two workers) on private
# network namespaces, 300 jobs submitted from the host namespace, one worker killed
# mid-run, every result present exactly once, and nothing left after `down`.
#
# Without the worker binary it still checks the network half (namespaces, bridge, Redis
# with AOF reachable from the host and from the other hosts, teardown) and prints SKIPPED
# for the worker half.
#
# Usage: test_local_cluster.sh network|full
#   network  hosts, bridge, Redis over the veths, teardown (no worker binary needed)
#   full     workers too: the 300-job run (SKIPPED when the binary is missing)
# Exit: 0 pass, 77 skipped, 1 fail.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CLUSTER=$REPO/deploy/local-cluster.sh
BIN=${FORKBOX_BIN:-$REPO/target/release/forkbox}
JOBS=${FORKBOX_TEST_JOBS:-300}
REDIS_IP=10.77.0.10
Q='forkbox:{default}'
export FORKBOX_CLUSTER_DIR=${FORKBOX_CLUSTER_DIR:-/tmp/forkbox-cluster-test}
export FORKBOX_BIN=$BIN

fail() { echo "FAIL: $*"; exit 1; }
pass() { echo "ok: $*"; }
rcli() { redis-cli -h "$REDIS_IP" "$@"; }

MODE=${1:-full}
case "$MODE" in network|full) ;; *) echo "usage: $0 network|full" >&2; exit 2 ;; esac
if [ "$MODE" = full ] && [ ! -x "$BIN" ]; then
    echo "SKIPPED: worker half (300 jobs, worker killed mid-run, exactly-once results): no worker binary at $BIN; build it with cargo build --release -p forkbox"
    exit 77
fi

if [ "$(id -u)" -ne 0 ]; then echo "SKIPPED: local cluster needs root for ip netns"; exit 77; fi
for tool in ip redis-server redis-cli curl; do
    command -v "$tool" >/dev/null || { echo "SKIPPED: $tool is not installed"; exit 77; }
done
if ip netns list | grep -q '^fbx-' || ip -o link show fbx-br0 >/dev/null 2>&1; then
    fail "fbx-* namespaces or links exist before the test; run deploy/local-cluster.sh down"
fi

pids_before=$(ps -e -o pid= | sort -n)
trap '"$CLUSTER" down >/dev/null 2>&1 || true' EXIT

assert_clean() {
    local left
    left=$(ip netns list | grep '^fbx-' || true)
    [ -z "$left" ] || fail "namespaces left after down: $left"
    left=$(ip -o link show | awk -F': ' '{ print $2 }' | grep '^fbx-' || true)
    [ -z "$left" ] || fail "links left after down: $left"
    # Processes started during the test that are still running and belong to the cluster.
    left=$(comm -13 <(echo "$pids_before") <(ps -e -o pid= | sort -n) \
        | while read -r pid; do
            cmd=$( { tr '\0' ' ' </proc/"$pid"/cmdline; } 2>/dev/null || true)
            case "$cmd" in *redis-server*10.77.0.*|*"$FORKBOX_CLUSTER_DIR"*|*forkbox\ worker*) echo "$pid $cmd" ;; esac
        done)
    [ -z "$left" ] || fail "processes left after down: $left"
    [ ! -e "$FORKBOX_CLUSTER_DIR" ] || fail "run directory $FORKBOX_CLUSTER_DIR left after down"
    pass "down left no namespace, link, process or run directory"
}

submit_jobs() { # XADD JOBS jobs from the host namespace, over the veth network
    local i
    for ((i = 1; i <= JOBS; i++)); do
        printf 'XADD %s:jobs * job "{\\"id\\":\\"t-%d\\",\\"cmd\\":\\"sleep 0.05; echo %d\\"}"\n' "$Q" "$i" "$i"
    done | rcli >/dev/null
}

count_results() { # result keys present for t-1..t-JOBS
    rcli EVAL "local n = 0
        for i = 1, tonumber(ARGV[2]) do
            if redis.call('EXISTS', ARGV[1] .. ':result:t-' .. i) == 1 then n = n + 1 end
        end
        return n" 0 "$Q" "$JOBS"
}

if [ "$MODE" = network ]; then
    # ---- network half only ----
    FORKBOX_CLUSTER_WORKERS=0 "$CLUSTER" up 3
    [ "$(ip netns list | grep -c '^fbx-h[0-2]\b')" -eq 3 ] || fail "expected 3 fbx-h* namespaces"
    ip -o link show fbx-br0 >/dev/null || fail "bridge fbx-br0 missing"
    [ "$(rcli PING)" = PONG ] || fail "Redis not reachable from the host namespace at $REDIS_IP"
    for ns in fbx-h1 fbx-h2; do
        [ "$(ip netns exec "$ns" redis-cli -h "$REDIS_IP" PING)" = PONG ] \
            || fail "Redis not reachable from $ns over the bridge"
        # Only the veth network connects the hosts: loopback in a worker host has no Redis.
        if ip netns exec "$ns" redis-cli -h 127.0.0.1 PING >/dev/null 2>&1; then
            fail "$ns reaches a Redis on its own loopback; namespaces are not isolated"
        fi
    done
    pass "3 hosts up; Redis on fbx-h0 reachable from the host, fbx-h1 and fbx-h2"
    [ "$(rcli CONFIG GET appendonly | tail -1)" = yes ] || fail "Redis AOF is off"
    pass "Redis runs with appendonly yes"
    submit_jobs
    [ "$(rcli XLEN "$Q:jobs")" -eq "$JOBS" ] || fail "stream holds $(rcli XLEN "$Q:jobs") entries, want $JOBS"
    pass "$JOBS jobs XADDed from the host namespace to $Q:jobs"
    status=$("$CLUSTER" status)
    grep -q 'fbx-h0.*redis PONG' <<<"$status" || fail "status does not report Redis: $status"
    [ "$(rcli XRANGE "$Q:jobs" - + COUNT 1 | tail -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')" = t-1 ] \
        || fail "submitted job is not the JSON the protocol expects"
    pass "status reports the hosts"
    "$CLUSTER" down
    assert_clean
    "$CLUSTER" down >/dev/null || fail "second down failed; down must be idempotent"
    pass "down is idempotent"
    exit 0
fi

# ---- full run with workers ----
FORKBOX_SLOTS=${FORKBOX_SLOTS:-4} "$CLUSTER" up 3
pass "3 hosts up with workers on fbx-h1 and fbx-h2"
submit_jobs
pass "$JOBS jobs submitted from the host namespace"

# Kill the worker on fbx-h1 mid-run: SIGKILL, as a crash would. Its pending entries must
# be reclaimed by the worker on fbx-h2.
victim=$(cat "$FORKBOX_CLUSTER_DIR/fbx-h1.pid")
deadline=$((SECONDS + 60))
until [ "$(count_results)" -ge $((JOBS / 5)) ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "fewer than $((JOBS / 5)) results after 60 s"
    sleep 0.2
done
done_before=$(count_results)
pending=$(rcli XPENDING "$Q:jobs" workers | head -1)
kill -KILL "$victim"
pass "killed the worker on fbx-h1 (pid $victim) after $done_before results, $pending pending"
[ "$done_before" -lt "$JOBS" ] || fail "all jobs finished before the kill; the test proves nothing"

deadline=$((SECONDS + ${FORKBOX_TEST_TIMEOUT:-240}))
until [ "$(count_results)" -eq "$JOBS" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "only $(count_results)/$JOBS results after the kill (see $FORKBOX_CLUSTER_DIR/*.log)"
    sleep 1
done
pass "all $JOBS result keys present"

# Exactly once: one completion per id on its done list and in the results stream.
dup=$(rcli EVAL "local bad = {}
    for i = 1, tonumber(ARGV[2]) do
        local n = redis.call('LLEN', ARGV[1] .. ':done:t-' .. i)
        if n ~= 1 then table.insert(bad, 't-' .. i .. '=' .. n) end
    end
    return bad" 0 "$Q" "$JOBS")
[ -z "$dup" ] || fail "done lists without exactly one element: $dup"
pass "every done list holds exactly one element"
stream=$(rcli XLEN "$Q:results")
[ "$stream" -eq "$JOBS" ] || fail "results stream holds $stream entries, want $JOBS"
ids=$(rcli --raw XRANGE "$Q:results" - + | grep -o '"id":"t-[0-9]*"' | sort)
[ "$(echo "$ids" | wc -l)" -eq "$JOBS" ] && [ "$(echo "$ids" | uniq -d | wc -l)" -eq 0 ] \
    || fail "results stream ids are not $JOBS distinct jobs"
pass "results stream holds $JOBS entries, one per job"
ok=$(rcli EVAL "local n = 0
    for i = 1, tonumber(ARGV[2]) do
        local r = redis.call('GET', ARGV[1] .. ':result:t-' .. i)
        if r and string.find(r, '\"status\":\"ok\"', 1, true) then n = n + 1 end
    end
    return n" 0 "$Q" "$JOBS")
[ "$ok" -eq "$JOBS" ] || fail "$ok/$JOBS results have status ok"
pass "every result has status ok"

# The dashboard and alerts query only series the surviving node really exports.
curl -fsS "http://10.77.0.12:9464/metrics" >"$FORKBOX_CLUSTER_DIR/metrics.txt" || fail "scrape of fbx-h2 failed"
python=${DEPLOY_PYTHON:-python3}
"$python" "$REPO/tests/deploy/check_dashboard.py" --metrics "$FORKBOX_CLUSTER_DIR/metrics.txt" \
    || fail "dashboard queries series the node does not export"
pass "dashboard and alert metrics all present in a real scrape"

"$CLUSTER" down
assert_clean
"$CLUSTER" down >/dev/null || fail "second down failed; down must be idempotent"
pass "down is idempotent"
