#!/usr/bin/env bash
# systemd-analyze verify on deploy/systemd, offline: no systemd needs to run as pid 1.
# The units are verified inside a scratch root holding a stand-in /usr/local/bin/forkbox
# and this machine's stock units (verify resolves sysinit.target and friends from there).
# systemd-analyze exits 0 on unknown keys and bad values, so any output is a failure.
set -euo pipefail
# shellcheck source=tests/deploy/tools.sh
. "$(dirname "$0")/tools.sh"
why=$(ensure_systemd_analyze) || { echo "SKIPPED: $why"; exit 77; }
UNITS=$REPO/deploy/systemd

root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/local/bin" "$root/etc/systemd/system" "$root/usr/lib/systemd"
stock=/usr/lib/systemd/system; [ -d "$stock" ] || stock=/lib/systemd/system
cp -a "$stock" "$root/usr/lib/systemd/system"
printf '#!/bin/sh\nexit 0\n' >"$root/usr/local/bin/forkbox"; chmod 0755 "$root/usr/local/bin/forkbox"
cp "$UNITS"/*.service "$UNITS"/*.slice "$root/etc/systemd/system/"

verify() {
    local out
    out=$(systemd-analyze verify --man=no --root="$root" "$@" 2>&1) || { echo "$out"; return 1; }
    [ -z "$out" ] || { echo "$out"; return 1; }
}

failed=0
units=(forkbox-worker.service forkbox-worker@default.service forkbox-worker@batch.service forkbox-daemon.service forkbox-gateway.service forkbox.slice)
if verify "${units[@]}"; then echo "ok: systemd-analyze verify ${units[*]}"; else echo "FAIL: systemd-analyze verify"; failed=1; fi

# The check must be able to fail: a unit with a typo has to produce output.
printf '[Service]\nExecStart=/usr/local/bin/forkbox worker\nKillMode=sometimes\n' >"$root/etc/systemd/system/fbx-selftest.service"
if verify fbx-selftest.service >/dev/null; then echo "FAIL: verify accepted KillMode=sometimes"; failed=1; else echo "ok: verify rejects a broken unit"; fi

# Policy the sandbox depends on (docs/operations.md, systemd).
for unit in forkbox-worker.service forkbox-worker@.service forkbox-daemon.service; do
    f=$UNITS/$unit
    for want in '^Delegate=.*\bcpu\b' '^Delegate=.*\bmemory\b' '^Delegate=.*\bpids\b' '^NoNewPrivileges=yes' \
        '^ProtectSystem=strict' '^KillMode=mixed' '^Restart=on-failure' '^User=forkbox'; do
        grep -Eq "$want" "$f" || { echo "FAIL: $unit lacks $want"; failed=1; }
    done
    for banned in RestrictNamespaces PrivateUsers ProtectKernelTunables ProtectKernelModules ProtectKernelLogs \
        ProtectControlGroups ProtectProc ProcSubset ProtectHostname MemoryDenyWriteExecute SystemCallFilter PrivateNetwork; do
        ! grep -Eq "^$banned=" "$f" || { echo "FAIL: $unit sets $banned, which breaks the sandbox"; failed=1; }
    done
    grace=$(sed -n 's/^ExecStart=.*--grace \([0-9]*\).*/\1/p' "$f"); grace=${grace:-30}
    stop=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)s\{0,1\}$/\1/p' "$f")
    [ -n "$stop" ] && [ "$stop" -gt "$grace" ] || { echo "FAIL: $unit TimeoutStopSec ($stop) must exceed --grace ($grace)"; failed=1; }
done
[ "$failed" = 0 ] && echo "ok: units delegate cpu/memory/pids, avoid namespace-breaking hardening, stop after the drain"

# The gateway runs no sandbox: it takes the strict hardening, listens on loopback only, and
# its env file names the variables it reads.
g=$UNITS/forkbox-gateway.service
for want in '^NoNewPrivileges=yes' '^ProtectSystem=strict' '^PrivateUsers=yes' '^RestrictNamespaces=yes' \
    '^SystemCallFilter=@system-service' '^CapabilityBoundingSet=$' '^User=forkbox' '^Restart=on-failure' \
    '^ExecStart=/usr/local/bin/forkbox gateway --listen 127\.0\.0\.1:'; do
    grep -Eq "$want" "$g" || { echo "FAIL: forkbox-gateway.service lacks $want"; failed=1; }
done
for var in FORKBOX_REDIS_URL FORKBOX_QUEUE FORKBOX_GATEWAY_API_KEY_FILE; do
    grep -q "$var" "$UNITS/gateway.env" || { echo "FAIL: gateway.env does not mention $var"; failed=1; }
    grep -q "env = \"$var\"" "$REPO/worker/src/cmd/gateway.rs" "$REPO/worker/src/cmd/opts.rs" \
        || { echo "FAIL: gateway.env names $var, which forkbox gateway does not read"; failed=1; }
done
[ "$failed" = 0 ] && echo "ok: the gateway unit is hardened, on loopback, and its env file names what it reads"

# The sysusers entry parses and creates the user the units run as.
if command -v systemd-sysusers >/dev/null; then
    sysroot=$(mktemp -d); mkdir -p "$sysroot/etc"; : >"$sysroot/etc/passwd"; : >"$sysroot/etc/group"
    if out=$(systemd-sysusers --root="$sysroot" "$UNITS/forkbox.sysusers.conf" 2>&1) && grep -q '^forkbox:' "$sysroot/etc/passwd"; then
        echo "ok: systemd-sysusers creates user forkbox"
    else
        echo "FAIL: systemd-sysusers: $out"; failed=1
    fi
    rm -rf "$sysroot"
fi
exit "$failed"
