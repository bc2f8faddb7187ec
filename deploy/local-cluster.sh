#!/usr/bin/env bash
# A multi-host Forkbox cluster on one Linux machine: each "host" is a network namespace
# joined to a bridge by a veth pair, so jobs and results cross a real (virtual) network.
# Host 0 runs Redis (AOF on); hosts 1..H-1 run one `forkbox worker` each.
#
#   deploy/local-cluster.sh up [H]    create H hosts (default 3) and start the services
#   deploy/local-cluster.sh status    namespaces, processes, Redis and worker health
#   deploy/local-cluster.sh down      remove everything `up` created; safe to repeat
#
# Needs root (ip netns), iproute2 and redis-server. Everything it creates is named fbx-*
# and listed in the run directory, so `down` touches nothing else on the machine.
#
# Environment:
#   FORKBOX_BIN            worker binary (default: target/release/forkbox in this repo)
#   FORKBOX_CLUSTER_DIR    run directory: pids, logs, Redis data (default /tmp/forkbox-cluster)
#   FORKBOX_CLUSTER_NET    first three octets of the private /24 (default 10.77.0)
#   FORKBOX_SLOTS          slots per worker (default 2)
#   FORKBOX_GRACE          worker drain seconds on SIGTERM (default 10)
#   FORKBOX_CLUSTER_WORKERS=0  start Redis and the network only (no worker binary needed)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DIR=${FORKBOX_CLUSTER_DIR:-/tmp/forkbox-cluster}
NET=${FORKBOX_CLUSTER_NET:-10.77.0}
BIN=${FORKBOX_BIN:-$REPO/target/release/forkbox}
SLOTS=${FORKBOX_SLOTS:-2}
GRACE=${FORKBOX_GRACE:-10}
WORKERS=${FORKBOX_CLUSTER_WORKERS:-1}
BRIDGE=fbx-br0
REDIS_PORT=6379
METRICS_PORT=9464

die() { echo "local-cluster: $*" >&2; exit 1; }
say() { echo "local-cluster: $*"; }

host_ns() { echo "fbx-h$1"; }
host_veth() { echo "fbx-h$1-v"; }        # root-namespace end; the other end is eth0 inside
host_ip() { echo "$NET.$((10 + $1))"; }
redis_ip() { host_ip 0; }

# Every resource is recorded before it is created, so `down` also cleans up after a
# half-finished `up`.
record() { echo "$1 $2" >>"$DIR/resources"; }

pid_alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# Children, grandchildren, ... of a pid: the worker's zygote and sandboxes live there.
descendants() {
    local parent=$1 child
    for child in $(ps -e -o pid=,ppid= | awk -v p="$parent" '$2 == p { print $1 }'); do
        echo "$child"
        descendants "$child"
    done
}

wait_for() { # wait_for SECONDS CMD...: poll until CMD succeeds
    local deadline=$((SECONDS + $1)); shift
    until "$@" >/dev/null 2>&1; do
        [ "$SECONDS" -lt "$deadline" ] || return 1
        sleep 0.2
    done
}

preflight() {
    [ "$(id -u)" -eq 0 ] || die "needs root (network namespaces)"
    command -v ip >/dev/null || die "needs iproute2 (ip)"
    command -v redis-server >/dev/null || die "needs redis-server"
    command -v redis-cli >/dev/null || die "needs redis-cli"
    if [ "$WORKERS" != 0 ]; then command -v curl >/dev/null || die "needs curl"; fi
    if [ "$WORKERS" != 0 ] && [ ! -x "$BIN" ]; then
        die "no worker binary at $BIN (cargo build --release -p forkbox, or set FORKBOX_BIN)"
    fi
    if [ -e "$DIR/resources" ]; then
        die "a cluster is already recorded in $DIR; run '$0 down' first"
    fi
    if ip -o link show "$BRIDGE" >/dev/null 2>&1 || ip netns list | grep -q '^fbx-'; then
        die "fbx-* interfaces or namespaces already exist; run '$0 down' first"
    fi
    if ip -4 route show | grep -v "dev $BRIDGE" | grep -q "^$NET\."; then
        die "$NET.0/24 is already routed on this machine; pick another FORKBOX_CLUSTER_NET"
    fi
}

start_network() {
    local hosts=$1 i ns veth
    record link "$BRIDGE"
    ip link add "$BRIDGE" type bridge
    ip addr add "$NET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for ((i = 0; i < hosts; i++)); do
        ns=$(host_ns "$i"); veth=$(host_veth "$i")
        record netns "$ns"
        ip netns add "$ns"
        record link "$veth"
        ip link add "$veth" type veth peer name eth0 netns "$ns"
        ip link set "$veth" master "$BRIDGE" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr add "$(host_ip "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" route add default via "$NET.1"
    done
}

start_redis() {
    local ns; ns=$(host_ns 0)
    mkdir -p "$DIR/redis"
    ip netns exec "$ns" redis-server \
        --bind "$(redis_ip)" 127.0.0.1 --port "$REDIS_PORT" --protected-mode no \
        --appendonly yes --appendfsync everysec --save "" \
        --dir "$DIR/redis" --logfile "$DIR/redis.log" \
        --daemonize yes --pidfile "$DIR/redis.pid"
    wait_for 10 test -s "$DIR/redis.pid" || die "redis did not start (see $DIR/redis.log)"
    record pid "$(cat "$DIR/redis.pid")"
    wait_for 10 redis-cli -h "$(redis_ip)" -p "$REDIS_PORT" ping || die "redis unreachable at $(redis_ip)"
}

start_worker() {
    local i=$1 ns ip pid
    ns=$(host_ns "$i"); ip=$(host_ip "$i")
    # shellcheck disable=SC2016  # $1/$@ are for the inner sh, not this script
    # Its own UTS namespace too, so each node reports a distinct hostname as a real host would.
    ip netns exec "$ns" unshare --uts -- sh -c 'hostname "$1" && shift && exec "$@"' sh "$ns" \
        "$BIN" worker \
        --redis "redis://$(redis_ip):$REDIS_PORT/0" \
        --queues default --slots "$SLOTS" \
        --metrics-addr "$ip:$METRICS_PORT" --grace "$GRACE" \
        >"$DIR/$ns.log" 2>&1 </dev/null &
    pid=$!
    echo "$pid" >"$DIR/$ns.pid"
    record pid "$pid"
    if ! wait_for 20 curl -fsS "http://$ip:$METRICS_PORT/healthz"; then
        pid_alive "$pid" || die "worker on $ns exited (see $DIR/$ns.log)"
        die "worker on $ns not healthy after 20 s (see $DIR/$ns.log)"
    fi
}

cmd_up() {
    local hosts=${1:-3} i
    [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 2 ] && [ "$hosts" -le 20 ] \
        || die "H must be 2..20 (one Redis host and at least one worker host)"
    preflight
    mkdir -p "$DIR"
    : >"$DIR/resources"
    echo "$hosts" >"$DIR/hosts"
    # A failed `up` (a die, or any failing command under set -e) leaves nothing behind.
    UP_DONE=0
    trap '[ "$UP_DONE" = 1 ] || { say "up failed; tearing down"; cmd_down; }' EXIT
    start_network "$hosts"
    start_redis
    say "redis on $(host_ns 0) at $(redis_ip):$REDIS_PORT (AOF on)"
    if [ "$WORKERS" != 0 ]; then
        for ((i = 1; i < hosts; i++)); do
            start_worker "$i"
            say "worker on $(host_ns "$i") at $(host_ip "$i"), metrics http://$(host_ip "$i"):$METRICS_PORT/metrics"
        done
    else
        say "FORKBOX_CLUSTER_WORKERS=0: hosts 1..$((hosts - 1)) have no worker"
    fi
    UP_DONE=1
    say "up: $hosts hosts; submit with: redis-cli -h $(redis_ip) XADD 'forkbox:{default}:jobs' '*' job '{\"cmd\":\"echo hi\"}'"
}

stop_pids() { # SIGTERM, wait up to GRACE+5 s, then SIGKILL whatever is left
    local pids=("$@") pid deadline
    [ "${#pids[@]}" -gt 0 ] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    deadline=$((SECONDS + GRACE + 5))
    for pid in "${pids[@]}"; do
        while pid_alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.2; done
    done
    for pid in "${pids[@]}"; do
        pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}"; do
        while pid_alive "$pid" && [ "$(ps -o stat= -p "$pid" 2>/dev/null)" != Z ]; do sleep 0.1; done
    done
}

cmd_down() {
    local kind name pids=() pid ns
    if [ -f "$DIR/resources" ]; then
        while read -r kind name; do
            if [ "$kind" = pid ] && pid_alive "$name"; then
                pids+=("$name")
                for pid in $(descendants "$name"); do pids+=("$pid"); done
            fi
        done <"$DIR/resources"
    fi
    # Anything else still running inside our namespaces (a stray redis-cli, say).
    for ns in $(ip netns list 2>/dev/null | awk '/^fbx-h[0-9]+/ { print $1 }'); do
        for pid in $(ip netns pids "$ns" 2>/dev/null); do pids+=("$pid"); done
    done
    stop_pids "${pids[@]}"
    # Namespaces first (that also destroys the eth0 ends of the veths), then root-side links.
    for ns in $(ip netns list 2>/dev/null | awk '/^fbx-h[0-9]+/ { print $1 }'); do
        ip netns del "$ns"
    done
    for name in $(ip -o link show 2>/dev/null | awk -F': ' '{ print $2 }' | sed 's/@.*//' | grep '^fbx-' || true); do
        ip link del "$name" 2>/dev/null || true
    done
    if [ -d "$DIR" ]; then
        rm -rf "$DIR"
    fi
    say "down: nothing left"
}

cmd_status() {
    local hosts i ns pid ip state
    if [ ! -f "$DIR/hosts" ]; then
        say "no cluster recorded in $DIR"
        ip netns list | grep '^fbx-' && return 1
        return 0
    fi
    hosts=$(cat "$DIR/hosts")
    for ((i = 0; i < hosts; i++)); do
        ns=$(host_ns "$i"); ip=$(host_ip "$i")
        if ! ip netns list | grep -q "^$ns\b"; then
            printf '%-8s %-12s missing\n' "$ns" "$ip"; continue
        fi
        if [ "$i" -eq 0 ]; then
            state=$(redis-cli -h "$ip" -p "$REDIS_PORT" ping 2>&1 || true)
            printf '%-8s %-12s redis %s\n' "$ns" "$ip" "$state"
        else
            pid=$(cat "$DIR/$ns.pid" 2>/dev/null || true)
            if pid_alive "$pid"; then
                state=$(curl -fsS -m 2 "http://$ip:$METRICS_PORT/healthz" 2>/dev/null && echo " healthy" || echo "unhealthy")
                printf '%-8s %-12s worker pid %s %s\n' "$ns" "$ip" "$pid" "$state"
            else
                printf '%-8s %-12s no worker\n' "$ns" "$ip"
            fi
        fi
    done
    if [ "$(redis-cli -h "$(redis_ip)" -p "$REDIS_PORT" EXISTS 'forkbox:{default}:jobs' 2>/dev/null)" = 1 ]; then
        redis-cli -h "$(redis_ip)" -p "$REDIS_PORT" XINFO GROUPS 'forkbox:{default}:jobs' \
            | paste -d' ' - - | sed 's/^/  /'
    fi
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up [H] | down | status" >&2; exit 2 ;;
esac
