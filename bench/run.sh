#!/usr/bin/env bash
# Side-by-side benchmarks, all measured in this one run on this machine:
#   1. spawn: bare fork+exec, forkbox sandbox, bubblewrap (`forkbox-bench spawn`), and the
#      queue's overhead over the raw engine (`forkbox-bench queue`);
#   2. queue throughput of /bin/true jobs: forkbox (a drained backlog, measured as the peers
#      are, and a closed loop) vs RQ (forking and SimpleWorker) vs Celery prefork on the same
#      Redis with the same number of worker processes, and the unsandboxed ceiling of W
#      processes spawning /bin/true in a loop;
#   3. HumanEval's 164 canonical solutions: forkbox vs one multiprocessing.Process per problem;
#   2b. where a queue job's CPU time goes: the same run under `perf record -a`, by role
#       (bench/profile.py), skipped with the reason where perf is unavailable;
#   2c. Redis CPU, commands and round trips per job: forkbox, BullMQ and Celery, each on a
#      fresh redis-server, in alternating rounds (bench/redis_cost.py; installs BullMQ into
#      bench/.node with npm);
#   4. scaling over K = 1, 2, 4 nodes in simulated hosts, the Redis cost per job, and the
#      single-core Redis ceiling (redis-benchmark).
# Raw results go to bench/out/raw/, one section file per table to bench/out/*.json
# (bench/sections.py), and docs/benchmarks.md is regenerated from those (bench/report.py).
#
# Environment: BENCH_JOBS (2000), BENCH_WORKERS (2), BENCH_SCALE_JOBS (2000), CARGO_TARGET_DIR;
# FORKBOX_BIN, FORKBOX_BENCH_BIN and FORKBOX_LOADGEN to use prebuilt binaries instead of a
# release build;
# BENCH_OUT (bench/out) and BENCH_DOC (docs/benchmarks.md) for a trial run elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."

JOBS=${BENCH_JOBS:-2000}
WORKERS=${BENCH_WORKERS:-2}
SCALE_JOBS=${BENCH_SCALE_JOBS:-2000}
OUT=${BENCH_OUT:-bench/out}
DOC=${BENCH_DOC:-docs/benchmarks.md}
RAW=$OUT/raw
rm -rf "$RAW"
mkdir -p "$RAW"

say() { echo "== $*" >&2; }

# Runs a command whose standard output is JSON into $RAW/NAME.json; on failure writes
# {"error": ...} instead, so one broken step does not lose the others.
capture() {
    local name=$1
    shift
    if "$@" >"$RAW/$name.json.tmp" 2>"$RAW/$name.log"; then
        mv "$RAW/$name.json.tmp" "$RAW/$name.json"
    else
        local rc=$?
        say "$name failed (exit $rc); see $RAW/$name.log"
        python3 -c 'import json,sys; print(json.dumps({"error": sys.argv[1]}))' \
            "exit $rc: $(tail -n 3 "$RAW/$name.log" | tr '\n' ' ')" >"$RAW/$name.json"
        rm -f "$RAW/$name.json.tmp"
    fi
}

say "python venv with rq and celery (bench/.venv)"
if ! bench/.venv/bin/python -c 'import rq, celery, redis, packaging' 2>/dev/null; then
    python3 -m venv bench/.venv
    bench/.venv/bin/pip install -q rq celery redis packaging
fi
PY=bench/.venv/bin/python

if ! command -v bwrap >/dev/null; then
    say "installing bubblewrap for the spawn comparison"
    (apt-get install -y -q bubblewrap >/dev/null 2>&1 || true)
fi

if [ -n "${FORKBOX_BIN:-}" ] && [ -n "${FORKBOX_BENCH_BIN:-}" ] && [ -n "${FORKBOX_LOADGEN:-}" ]; then
    FORKBOX=$FORKBOX_BIN
    BENCH=$FORKBOX_BENCH_BIN
    LOADGEN=$FORKBOX_LOADGEN
else
    say "building forkbox, forkbox-bench and forkbox-loadgen (release)"
    cargo build --release -q -p forkbox -p forkbox-bench -p forkbox-loadgen
    TARGET=${CARGO_TARGET_DIR:-target}/release
    FORKBOX=$(realpath "$TARGET/forkbox")
    BENCH=$(realpath "$TARGET/forkbox-bench")
    LOADGEN=$(realpath "$TARGET/forkbox-loadgen")
fi
export FORKBOX_BIN=$FORKBOX

say "starting redis-server"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
REDIS_DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --dir "$REDIS_DIR" \
    --logfile redis.log --daemonize no &
REDIS_PID=$!
trap 'kill $REDIS_PID 2>/dev/null; rm -rf "$REDIS_DIR"' EXIT
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done
URL=redis://127.0.0.1:$PORT

say "environment"
python3 - "$PORT" "$WORKERS" "$JOBS" >"$RAW/environment.json" <<'PYEOF'
import json, os, platform, subprocess, sys
def sh(*a):
    try:
        return subprocess.run(a, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "")
pyv = sh("bench/.venv/bin/python", "-c", "import rq, celery, sys; print(rq.__version__, celery.__version__, sys.version.split()[0])").split()
print(json.dumps({
    "cores": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
    "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    "redis": sh("redis-server", "--version"), "rq": pyv[0] if pyv else "", "celery": pyv[1] if len(pyv) > 1 else "",
    "python": pyv[2] if len(pyv) > 2 else "", "bwrap": sh("bwrap", "--version"),
    "workers": int(sys.argv[2]), "jobs": int(sys.argv[3]),
}))
PYEOF

say "1. spawn"
capture spawn "$BENCH" spawn --json
capture spawn-loopback "$BENCH" spawn --json --network-default loopback --overshoot-runs 10
capture spawn-shared-net "$BENCH" spawn --json --shared-net --overshoot-runs 10
capture queue "$BENCH" queue --jobs "$JOBS" --slots "$WORKERS" --section "$OUT/queue-overhead.json" --json

say "2. queue throughput ($JOBS jobs, $WORKERS worker processes)"
capture ceiling "$PY" bench/peers/ceiling.py --jobs "$JOBS" --workers "$WORKERS"
redis-cli -p "$PORT" -n 2 flushdb >/dev/null
capture rq-fork "$PY" bench/peers/rq_bench.py --redis "$URL/2" --jobs "$JOBS" --workers "$WORKERS"
redis-cli -p "$PORT" -n 3 flushdb >/dev/null
capture rq-simple "$PY" bench/peers/rq_bench.py --redis "$URL/3" --jobs "$JOBS" --workers "$WORKERS" \
    --worker-class rq.worker.SimpleWorker
redis-cli -p "$PORT" -n 4 flushdb >/dev/null
capture celery "$PY" bench/peers/celery_bench.py --redis "$URL/4" --jobs "$JOBS" --workers "$WORKERS"
# forkbox: one node with one slot per worker process, with Redis' own accounting around it.
redis-cli -p "$PORT" config resetstat >/dev/null
redis-cli -p "$PORT" info cpu >"$RAW/redis-cpu-before.txt"
"$LOADGEN" --redis "$URL/0" --queue bench --jobs "$JOBS" --spawn-workers 1 --slots "$WORKERS" \
    --concurrency $((WORKERS * 16)) --report "$RAW/forkbox-noop" --quiet >"$RAW/forkbox-noop.log" 2>&1 ||
    say "forkbox throughput run failed; see $RAW/forkbox-noop.log"
redis-cli -p "$PORT" info cpu >"$RAW/redis-cpu-after.txt"
redis-cli -p "$PORT" info commandstats >"$RAW/redis-commandstats.txt"
# The same jobs as a backlog: all enqueued before the node starts, measured as the peers are.
"$LOADGEN" --redis "$URL/0" --queue backlog --jobs "$JOBS" --backlog --spawn-workers 1 --slots "$WORKERS" \
    --report "$RAW/forkbox-backlog" --quiet >"$RAW/forkbox-backlog.log" 2>&1 ||
    say "forkbox backlog run failed; see $RAW/forkbox-backlog.log"

say "2b. where a queue job's CPU time goes (perf)"
# The same kind of run, machine-wide under perf, split into roles by bench/profile.py.
PROFILE_JOBS=$((JOBS / 2))
if ! command -v perf >/dev/null; then
    python3 -c 'import json; print(json.dumps({"error": "perf is not installed (apt-get install linux-perf)"}))' >"$RAW/cpu-profile.json"
elif ! perf record -a -q -o "$RAW/perf.probe" -- true >/dev/null 2>&1; then
    python3 -c 'import json; print(json.dumps({"error": "perf record -a is not permitted here (kernel.perf_event_paranoid)"}))' >"$RAW/cpu-profile.json"
else
    rm -f "$RAW/perf.probe"
    perf record -a -g -q -o "$RAW/perf.data" -- "$LOADGEN" --redis "$URL/0" --queue profile \
        --jobs "$PROFILE_JOBS" --spawn-workers 1 --slots "$WORKERS" --concurrency $((WORKERS * 16)) \
        --report "$RAW/forkbox-profile" --quiet >"$RAW/forkbox-profile.log" 2>&1 ||
        say "profiled run failed; see $RAW/forkbox-profile.log"
    capture cpu-profile bash -c 'perf script -i "$1" --show-task-events -F comm,pid,tid,period,ip,sym 2>/dev/null |
        python3 bench/profile.py --jobs "$2"' _ "$RAW/perf.data" "$PROFILE_JOBS"
    rm -f "$RAW/perf.data"
fi

say "2c. Redis cost per job: forkbox, BullMQ, Celery ($JOBS jobs, $WORKERS slots, 3 rounds)"
rm -f "$OUT/redis-cost.json"
if ! python3 bench/redis_cost.py --forkbox "$FORKBOX" --loadgen "$LOADGEN" --jobs "$JOBS" \
    --slots "$WORKERS" --rounds 3 --json "$RAW/redis-cost.json" --section "$OUT/redis-cost.json" \
    >"$RAW/redis-cost.txt" 2>"$RAW/redis-cost.log"; then
    say "Redis cost run failed or missed a system; see $RAW/redis-cost.log"
    [ -s "$OUT/redis-cost.json" ] || python3 -c 'import json, sys; print(json.dumps({
        "section": "redis-cost", "order": 45, "title": "Redis cost per job", "tables": [],
        "notes": ["not measured: " + sys.argv[1]]}))' "$(tail -n 3 "$RAW/redis-cost.log" | tr '\n' ' ')" \
        >"$OUT/redis-cost.json"
fi

say "3. HumanEval"
HUMANEVAL=${FORKBOX_HUMANEVAL:-../shared/data/HumanEval.jsonl.gz}
"$LOADGEN" --redis "$URL/0" --queue humaneval --jobs 164 --mix humaneval --humaneval "$HUMANEVAL" \
    --spawn-workers 1 --slots "$WORKERS" --concurrency 164 --report "$RAW/forkbox-humaneval" --quiet \
    >"$RAW/forkbox-humaneval.log" 2>&1 || say "forkbox HumanEval run failed; see $RAW/forkbox-humaneval.log"
capture humaneval-mp "$PY" bench/peers/humaneval_mp.py --data "$HUMANEVAL" --workers "$WORKERS" --style lean
capture humaneval-reference "$PY" bench/peers/humaneval_mp.py --data "$HUMANEVAL" --workers "$WORKERS" \
    --style reference

say "4. scaling (K = 1, 2, 4) and the Redis ceiling"
HOSTS=(--hosts 4)
if ! ip netns add "fbl-bench-probe" 2>/dev/null; then
    say "ip netns unavailable: scaling without simulated hosts"
    HOSTS=()
else
    ip netns del "fbl-bench-probe"
fi
"$LOADGEN" --queue scale --jobs "$SCALE_JOBS" --spawn-workers 4 "${HOSTS[@]}" --slots "$WORKERS" \
    --scale --scale-steps 1,2,4 --report "$RAW/forkbox-scaling" --quiet \
    >"$RAW/forkbox-scaling.log" 2>&1 || say "scaling run failed; see $RAW/forkbox-scaling.log"
redis-benchmark -p "$PORT" -q -n 200000 -c 50 -t ping,set,lpush,xadd --csv >"$RAW/redis-benchmark.csv" 2>/dev/null ||
    redis-benchmark -p "$PORT" -q -n 200000 -c 50 -t ping,set,lpush --csv >"$RAW/redis-benchmark.csv"
redis-benchmark -p "$PORT" -q -n 1000000 -c 50 -P 32 -t set --csv >"$RAW/redis-benchmark-pipelined.csv"

say "5. Python SDK round trip through the daemon"
if [ -x .venv/bin/python ]; then
    capture sdk-roundtrip env FORKBOX_BIN="$FORKBOX" .venv/bin/python sdk/python/bench_roundtrip.py --start-daemon -n 300 --json
else
    python3 -c 'import json; print(json.dumps({"error": "no .venv with the SDK (make bench creates it)"}))' >"$RAW/sdk-roundtrip.json"
fi

say "sections and docs/benchmarks.md"
python3 bench/sections.py "$RAW" "$OUT"
python3 bench/report.py "$OUT" "$DOC"
say "done: $DOC"
