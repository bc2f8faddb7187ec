#!/usr/bin/env bash
# Runs inside the VM tier's guest, as root in the root cgroup: each line of OUT/plan is a test
# binary and its filters, run with a bound; logs and exit codes go to OUT, then OUT/done.
set -u
OUT=$1
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export FORKBOX_REQUIRE_RUNTIMES=1 FORKBOX_VM_GUEST=1 RUST_BACKTRACE=1 TMPDIR=/tmp
{
  uname -r
  cat /proc/self/cgroup
  echo "controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
  ./target/debug/forkbox check
} >"$OUT/check.log" 2>&1
while IFS=$'\t' read -r name bin args; do
  # shellcheck disable=SC2086 # the filters are words
  timeout --kill-after=10 900 "$bin" $args --test-threads=2 --nocapture >"$OUT/$name.log" 2>&1
  echo $? >"$OUT/$name.rc"
done <"$OUT/plan"
touch "$OUT/done"
