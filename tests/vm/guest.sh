#!/usr/bin/env bash
# Runs inside the VM tier's guest, as root in the root cgroup: each line of OUT/plan
# (tests/vm/plan.sh: a name, the row's own environment, a test binary and its filters) is run
# with a bound; logs, exit codes and seconds taken go to OUT, then OUT/done.
set -u
OUT=$1
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/vm/plan.sh
. "$HERE/plan.sh"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export FORKBOX_REQUIRE_RUNTIMES=1 FORKBOX_VM_GUEST=1 RUST_BACKTRACE=1 TMPDIR=/tmp
# virtme-ng's init mounts a shadow file of its own over /etc/shadow, readable by every user;
# the host's is private (root:shadow 0640), as the escape checks need it. A private copy goes
# over it, owned and moded as Debian's. Never outside the guest (tests/vm/plan_test.sh runs
# this script on the host with FORKBOX_VM_STAND_IN=1).
if [ "${FORKBOX_VM_STAND_IN:-}" != 1 ] && [ $((0$(stat -c %a /etc/shadow) & 4)) != 0 ]; then
  shadow_copy=/run/forkbox-vm-shadow
  install -m 0640 -o root -g shadow /etc/shadow "$shadow_copy" &&
    mount --bind "$shadow_copy" /etc/shadow
fi
{
  stat -c '%n: %a %U:%G' /etc/shadow
  uname -r
  cat /proc/self/cgroup
  echo "controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
  ./target/debug/forkbox check
} >"$OUT/check.log" 2>&1
while IFS= read -r line; do
  plan_fields "$line"
  words=()
  [ "$env" = - ] || read -r -a words <<<"$env"
  read -r -a filters <<<"$args"
  start=$(date +%s)
  {
    if [ ${#words[@]} = 0 ]; then
      echo "environment: the guest's own"
    else
      echo "environment: the guest's own with ${words[*]}"
    fi
    timeout --kill-after=10 1800 env "${words[@]}" "$bin" "${filters[@]}" --test-threads=2 --nocapture
  } >"$OUT/$name.log" 2>&1
  echo $? >"$OUT/$name.rc"
  echo $(($(date +%s) - start)) >"$OUT/$name.seconds"
done <"$OUT/plan"
touch "$OUT/done"
