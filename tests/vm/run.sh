#!/usr/bin/env bash
# The VM tier: boots Debian's kernel under qemu (through virtme-ng) over this machine's own
# filesystem, where cgroup v2 offers every controller to root, and runs inside it the limit
# tests that need a real delegated cgroup (jobs' and sessions'), the runtime matrix and the
# cgroup unit checks. The test binaries are built here first; the guest only runs them. One
# boot runs everything.
#
# The outcome is written to target/vm-tier.status ("passed", "FAILED ...", or "SKIPPED:
# reason" where qemu cannot run here) for `make test` to show at its end.
#
#   FORKBOX_VM_KERNEL   kernel image (default: the newest /boot/vmlinuz-*)
#   FORKBOX_VM_VENV     the virtualenv holding vng (default: .venv-vm)
#   FORKBOX_VM_TIMEOUT  seconds for the whole boot and run (default: 1800)
set -uo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
VENV=${FORKBOX_VM_VENV:-$ROOT/.venv-vm}
TIMEOUT=${FORKBOX_VM_TIMEOUT:-1800}
STATUS=$ROOT/target/vm-tier.status
OUT=$ROOT/target/vm-tier
CARGO=${CARGO:-cargo}
mkdir -p "$ROOT/target"

skip() {
  echo "SKIPPED: VM tier: $*"
  echo "SKIPPED: $*" >"$STATUS"
  # Hosts meant to run everything fail instead (as forkbox_testkit::skipped does for Rust tests).
  [ "${FORKBOX_REQUIRE_PRIVILEGED:-}" = 1 ] && exit 1
  exit 0
}
fail() {
  echo "FAILED: VM tier: $*"
  echo "FAILED: $*" >"$STATUS"
  exit 1
}

# --- what qemu needs -------------------------------------------------------------------------
command -v qemu-system-x86_64 >/dev/null ||
  skip "qemu-system-x86_64 is not installed (as root: apt-get install -y qemu-system-x86)"
[ -x "$VENV/bin/vng" ] ||
  skip "no virtme-ng in $VENV (make $VENV/bin/vng installs it)"
command -v busybox >/dev/null ||
  skip "busybox is not installed (as root: apt-get install -y busybox-static)"
KERNEL=${FORKBOX_VM_KERNEL:-$(ls /boot/vmlinuz-* 2>/dev/null | sort -V | tail -n1)}
[ -n "$KERNEL" ] || skip "no kernel image in /boot (as root: apt-get install -y linux-image-amd64)"
[ -r "$KERNEL" ] || skip "$KERNEL is not readable by uid $(id -u) (the VM tier runs as root)"
[ "$(id -u)" = 0 ] || skip "the guest runs the host's files as the host user; the cgroup tests need root"

# --- the test binaries, built on the host ----------------------------------------------------
echo "vm: building the test binaries"
artifacts=$("$CARGO" test -p forkbox --no-run --lib --test cgroup_limits --test runtimes \
  --test sandbox --test sandbox_kernel_state --test killed_usage --test staged \
  --test session_engine \
  --message-format=json 2>/dev/null) ||
  fail "cargo test --no-run failed"
exe() {
  python3 -c '
import json, sys
want = sys.argv[1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"] \
            and m["target"]["name"] == want and m["target"]["kind"] != ["bin"]:
        print(m["executable"])
' "$1" <<<"$artifacts" | tail -n1
}
LIB=$(exe forkbox)
CGROUP=$(exe cgroup_limits)
RUNTIMES=$(exe runtimes)
SANDBOX=$(exe sandbox)
KERNEL_STATE=$(exe sandbox_kernel_state)
KILLED_USAGE=$(exe killed_usage)
STAGED=$(exe staged)
SESSION=$(exe session_engine)
for b in "$LIB" "$CGROUP" "$RUNTIMES" "$SANDBOX" "$KERNEL_STATE" "$KILLED_USAGE" "$STAGED" \
  "$SESSION"; do
  [ -x "$b" ] || fail "test binary not found ($b)"
done

rm -rf "$OUT"
mkdir -p "$OUT"
# name, binary, arguments: what the guest runs, one line each.
{
  printf '%s\t%s\t%s\n' cgroup-unit "$LIB" "sandbox::isolate::cgroup sandbox::isolate::limits"
  printf '%s\t%s\t%s\n' cgroup-limits "$CGROUP" ""
  # The unprivileged rows take the rlimit fallback, which the host's own run covers.
  printf '%s\t%s\t%s\n' runtimes "$RUNTIMES" "as_root memory_hogs"
  printf '%s\t%s\t%s\n' sandbox-limits "$SANDBOX" "check_reports_capabilities_and_mechanisms"
  # Socket and pipe buffers in the unprivileged rows' memory budget, on a kernel (6.1) that
  # shows net.core.wmem_max in no namespace but the host's.
  printf '%s\t%s\t%s\n' sandbox-buffers "$SANDBOX" \
    "buffers_count_in_the_memory_limit a_job_using_a_few_sockets sockets_whose_peers_are_closed"
  # Root with every capability (CAP_SYS_RESOURCE, which this host's root may lack).
  printf '%s\t%s\t%s\n' oom-rank "$KERNEL_STATE" "jobs_are_the_oom_killers_first_choice"
  # A stopped job's usage read from its cgroup (cpu.stat, memory.peak), where the host's own
  # run reads it from the sandbox's /proc.
  printf '%s\t%s\t%s\n' killed-usage "$KILLED_USAGE" ""
  # A staged job's cgroup narrowed to the run stage's limits between the stages.
  printf '%s\t%s\t%s\n' staged-memory "$STAGED" "under_a_cgroup_each_stage"
  # A session's limits held across its calls by its cgroup (memory.max, pids.max, cpu.stat)
  # and its disk, where the host's own run takes the rlimit fallback.
  printf '%s\t%s\t%s\n' session-limits "$SESSION" \
    "memory_grown_over_calls pids_limit disk_filled_over_calls cpu_time_is_counted"
} >"$OUT/plan"

# --- one boot --------------------------------------------------------------------------------
echo "vm: booting $KERNEL (TCG, 2 CPUs, 2 GiB); the console is in $OUT/console.log"
start=$(date +%s)
timeout --kill-after=30 "$TIMEOUT" env PATH="$VENV/bin:$PATH" vng --disable-kvm \
  --run "$KERNEL" --memory 2G --cpus 2 --rwdir "$OUT" --cwd "$ROOT" \
  -- "bash tests/vm/guest.sh $OUT" </dev/null >"$OUT/console.log" 2>&1
rc=$?
took=$(($(date +%s) - start))
if [ ! -f "$OUT/done" ]; then
  tail -n 40 "$OUT/console.log"
  [ $rc = 124 ] && fail "the guest did not finish within ${TIMEOUT}s"
  fail "the guest stopped before its tests finished (vng exit $rc)"
fi

# --- what the guest saw ----------------------------------------------------------------------
echo "vm: guest ran for ${took}s"
sed 's/^/vm: guest: /' "$OUT/check.log"
failed=""
while IFS=$'\t' read -r name _ _; do
  code=$(cat "$OUT/$name.rc" 2>/dev/null || echo missing)
  grep -E '^(SKIPPED|RETRIED|test result:)|^test .* FAILED$|panicked' "$OUT/$name.log" | cut -c1-400 | sed "s/^/vm: $name: /"
  if [ "$code" != 0 ]; then
    failed="$failed $name"
    echo "--- vm: $name exited $code; its log: ---"
    tail -n 80 "$OUT/$name.log"
    # Last, so that a shortened copy of this output still shows them: each panic's message,
    # from its "panicked at" line to its backtrace.
    echo "--- vm: $name: what failed ---"
    awk '/panicked at/ {p = 1} /^stack backtrace:|^note: / {p = 0} p' "$OUT/$name.log" |
      cut -c1-600 | head -n 60
  fi
done <"$OUT/plan"
[ -z "$failed" ] || fail "failing in the guest:$failed"
skipped=$(cat "$OUT"/*.log | grep -c '^SKIPPED' || true)
[ "$skipped" = 0 ] || fail "$skipped checks were skipped in the guest, where nothing should be"
echo "passed (${took}s in the guest)" >"$STATUS"
echo "vm: passed"
