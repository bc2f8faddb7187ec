#!/usr/bin/env bash
# Checks tests/vm/plan.sh and guest.sh on the host: a well-formed plan passes plan_check, each
# malformed row fails it with a message naming the problem, plan_fields keeps empty fields in
# their place, and guest.sh runs each row with that row's environment alone.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/vm/plan.sh
. "$HERE/plan.sh"
DIR=$(mktemp -d)
trap 'rm -rf "$DIR"' EXIT
BIN=$(type -P true)
T=$'\t'
failed=0

# expect_ok ROW...: a plan of these rows passes.
expect_ok() {
  printf '%s\n' "$@" >"$DIR/plan"
  if ! out=$(plan_check "$DIR/plan"); then
    echo "FAIL: refused a good plan: $out"
    failed=1
  fi
}
# expect_bad WANT ROW...: a plan of these rows fails, and says WANT.
expect_bad() {
  local want=$1
  shift
  printf '%s\n' "$@" >"$DIR/plan"
  if out=$(plan_check "$DIR/plan"); then
    echo "FAIL: accepted a plan that should say '$want': $*"
    failed=1
  elif [[ $out != *"$want"* ]]; then
    echo "FAIL: said '$out', not '$want'"
    failed=1
  fi
}

expect_ok "a${T}-${T}$BIN${T}" "b-2${T}FORKBOX_NETWORK_DEFAULT=loopback${T}$BIN${T}x y"
expect_ok "c${T}FORKBOX_NETWORK_DEFAULT=none${T}$BIN${T}filter"
: >"$DIR/plan"
plan_check "$DIR/plan" >/dev/null && { echo "FAIL: accepted an empty plan"; failed=1; }
expect_bad "2 tabs, not 3" "a${T}$BIN${T}x"
expect_bad "4 tabs, not 3" "a${T}-${T}$BIN${T}x${T}y"
expect_bad "name 'A b'" "A b${T}-${T}$BIN${T}"
expect_bad "already line 1's" "a${T}-${T}$BIN${T}" "a${T}-${T}$BIN${T}"
expect_bad "empty environment" "a${T}${T}$BIN${T}"
expect_bad "'loopback' is not VAR=value" "a${T}loopback${T}$BIN${T}"
expect_bad "FORKBOX_NETWORK_DEFALT is not a variable a row may set" \
  "a${T}FORKBOX_NETWORK_DEFALT=loopback${T}$BIN${T}"
expect_bad "FORKBOX_NETWORK_DEFAULT='host' does not match" \
  "a${T}FORKBOX_NETWORK_DEFAULT=host${T}$BIN${T}"
expect_bad "FORKBOX_NETWORK_DEFAULT is set twice" \
  "a${T}FORKBOX_NETWORK_DEFAULT=none FORKBOX_NETWORK_DEFAULT=loopback${T}$BIN${T}"
expect_bad "'relative' is not an executable file's absolute path" "a${T}-${T}relative${T}"
expect_bad "'$DIR/plan' is not an executable" "a${T}-${T}$DIR/plan${T}"
expect_bad "hold quotes, globs or expansions" "a${T}-${T}$BIN${T}some*"
# A bad row is reported with the good ones around it.
expect_bad "plan line 2 (b)" "a${T}-${T}$BIN${T}" "b${T}X=1${T}$BIN${T}" "c${T}-${T}$BIN${T}"

plan_fields "n${T}-${T}${T}args"
[ "$name|$env|$bin|$args" = "n|-||args" ] || { echo "FAIL: fields $name|$env|$bin|$args"; failed=1; }
plan_fields "n${T}-${T}/b${T}"
[ "$name|$env|$bin|$args" = "n|-|/b|" ] || { echo "FAIL: fields $name|$env|$bin|$args"; failed=1; }

# guest.sh on this host, over stand-ins for `forkbox check` and the test binaries: each row
# gets its own environment alone, its arguments as words, and its exit code.
mkdir -p "$DIR/root/target/debug" "$DIR/out"
printf '#!/bin/sh\necho check\n' >"$DIR/root/target/debug/forkbox"
# shellcheck disable=SC2016 # the stand-in's own expansions
printf '#!/bin/sh\necho "net=${FORKBOX_NETWORK_DEFAULT-unset} guest=$FORKBOX_VM_GUEST args=$*"\nexit ${PROBE_EXIT:-0}\n' \
  >"$DIR/probe"
chmod +x "$DIR/root/target/debug/forkbox" "$DIR/probe"
printf '%s\n' "a${T}-${T}$DIR/probe${T}x y*" "b${T}FORKBOX_NETWORK_DEFAULT=loopback${T}$DIR/probe${T}" \
  "c${T}-${T}$DIR/probe${T}z" >"$DIR/out/plan"
(cd "$DIR/root" && env -u FORKBOX_NETWORK_DEFAULT PROBE_EXIT=3 FORKBOX_VM_STAND_IN=1 bash "$HERE/guest.sh" "$DIR/out")
for want in "a:net=unset guest=1 args=x y* --test-threads=2 --nocapture:3" \
  "b:net=loopback guest=1 args=--test-threads=2 --nocapture:3" \
  "c:net=unset guest=1 args=z --test-threads=2 --nocapture:3"; do
  IFS=: read -r row line code <<<"$want"
  if ! grep -qxF "$line" "$DIR/out/$row.log" || [ "$(cat "$DIR/out/$row.rc")" != "$code" ] ||
    ! [ -s "$DIR/out/$row.seconds" ]; then
    echo "FAIL: guest row $row: $(cat "$DIR/out/$row.log" "$DIR/out/$row.rc"), not '$line' and exit $code"
    failed=1
  fi
done
[ -f "$DIR/out/done" ] || { echo "FAIL: guest.sh did not finish"; failed=1; }

[ $failed = 0 ] && echo "vm plan checks: passed"
exit $failed
