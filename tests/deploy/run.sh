#!/usr/bin/env bash
# Runs every deploy check and prints one closing line: "deploy: N passed, N failed, N skipped".
# A check exits 0 (pass), 77 (skipped; it printed SKIPPED: <reason>) or anything else (fail).
# Usage: tests/deploy/run.sh [--no-cluster]   (--no-cluster: skip the root-only netns test)
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/deploy/tools.sh
. "$HERE/tools.sh"

run_cluster=1
[ "${1:-}" = --no-cluster ] && run_cluster=0

passed=0 failed=0 skipped=0 failures=()
run() { # run NAME CMD...
    local name=$1 rc; shift
    echo "=== $name"
    "$@"; rc=$?
    case $rc in
        0) passed=$((passed + 1)) ;;
        77) skipped=$((skipped + 1)) ;;
        *) failed=$((failed + 1)); failures+=("$name") ;;
    esac
}
venv_or_skip() { local why; why=$(ensure_venv) || { echo "SKIPPED: $why"; return 77; }; "$@"; }

run shellcheck venv_or_skip env -C "$REPO" "$VENV/bin/shellcheck" -x "$REPO/deploy/local-cluster.sh" "$HERE"/*.sh
run systemd "$HERE/check_systemd.sh"
run kubernetes venv_or_skip "$PY" "$HERE/check_k8s.py"
run prometheus "$HERE/check_prometheus.sh"
run grafana venv_or_skip "$PY" "$HERE/check_dashboard.py"
run metrics "$HERE/check_metrics.sh"
run docker "$HERE/check_dockerfile.sh"
if [ "$run_cluster" = 1 ]; then
    run local-cluster-network "$HERE/test_local_cluster.sh" network
    run local-cluster-workers env DEPLOY_PYTHON="$PY" "$HERE/test_local_cluster.sh" full
fi

echo
[ "${#failures[@]}" -eq 0 ] || echo "failed: ${failures[*]}"
echo "deploy: $passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
