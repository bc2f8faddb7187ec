#!/usr/bin/env bash
# The container image and compose file, without a Docker engine: hadolint on the
# Dockerfile, every COPY source exists in the build context, the build command is the
# Makefile's release build, and compose gives each worker the flags the sandbox needs.
set -euo pipefail
# shellcheck source=tests/deploy/tools.sh
. "$(dirname "$0")/tools.sh"
why=$(ensure_venv) || { echo "SKIPPED: $why"; exit 77; }
DOCKER=$REPO/deploy/docker
failed=0

if "$VENV/bin/hadolint" --no-color --config "$DOCKER/.hadolint.yaml" "$DOCKER/Dockerfile"; then
    echo "ok: hadolint $("$VENV/bin/hadolint" --version | awk '{ print $NF }') finds nothing"
else
    echo "FAIL: hadolint"; failed=1
fi

# COPY sources (build stage only; --from copies come from another stage) exist in the
# context, which is the repository root, and are not excluded by Dockerfile.dockerignore.
while read -r src; do
    if [ ! -e "$REPO/$src" ]; then echo "FAIL: COPY source $src does not exist"; failed=1; continue; fi
    top=${src%%/*}
    grep -qx "!$top/\{0,1\}" "$DOCKER/Dockerfile.dockerignore" \
        || { echo "FAIL: COPY source $src is excluded by Dockerfile.dockerignore"; failed=1; }
done < <(awk '/^COPY / && !/--from=/ { for (i = 2; i < NF; i++) print $i }' "$DOCKER/Dockerfile")
# The workspace must build from what is copied: every member is copied.
for member in $(sed -n 's/^members *= *\[\(.*\)\]/\1/p' "$REPO/Cargo.toml" | tr -d '",'); do
    grep -Eq "^COPY $member " "$DOCKER/Dockerfile" || { echo "FAIL: workspace member $member is not copied"; failed=1; }
done
[ "$failed" = 0 ] && echo "ok: every COPY source exists and every workspace member is in the image"

want='cargo build --release -p forkbox'
grep -q "$want" "$DOCKER/Dockerfile" || { echo "FAIL: Dockerfile does not run '$want'"; failed=1; }
if [ -f "$REPO/Makefile" ] && grep -Eq 'build +--release' "$REPO/Makefile"; then
    # shellcheck disable=SC2016  # $(CARGO) is Makefile text, not a shell expansion
    # Not `sed | grep -q`: under pipefail, grep leaving at the first match can kill sed with
    # SIGPIPE and fail the pipeline although the line is there.
    if grep -q "$want" < <(sed 's/\$(CARGO)/cargo/g; s/\${CARGO}/cargo/g' "$REPO/Makefile"); then
        echo "ok: Dockerfile and Makefile both build with '$want'"
    else
        echo "FAIL: the Makefile's release build is not '$want':"; grep -E 'build +--release' "$REPO/Makefile"; failed=1
    fi
else
    echo "SKIPPED: Makefile has no release build yet; Dockerfile checked against '$want' only"
fi

# RUNTIMES: python (the default, small) or full (node, java, gcc, go); both keep python3,
# which the HEALTHCHECK needs. The full list's packages must exist in the image's release.
grep -q '^ARG RUNTIMES=python$' "$DOCKER/Dockerfile" \
    || { echo "FAIL: no 'ARG RUNTIMES=python' (the small image must stay the default)"; failed=1; }
full=$(sed -n 's/^ *full) extra="\([^"]*\)".*/\1/p' "$DOCKER/Dockerfile")
for need in nodejs default-jdk-headless gcc g++ golang-go; do
    case " $full " in *" $need "*) ;; *) echo "FAIL: RUNTIMES=full lacks $need"; failed=1 ;; esac
done
# shellcheck disable=SC2016  # a literal $extra, as the Dockerfile spells it
grep -Eq 'install .*python3 tini \$extra' "$DOCKER/Dockerfile" \
    || { echo "FAIL: the runtime stage does not install python3 and the RUNTIMES packages together"; failed=1; }
release=$(sed -n 's/^ARG DEBIAN_RELEASE=//p' "$DOCKER/Dockerfile")
host_release=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
# The lookup needs the host's package lists. A fresh machine may have none yet (python3,
# which every Debian release has, does not resolve): as root they are fetched once, and
# otherwise the names are not looked up rather than failed against an empty list.
apt_lists_ready() { apt-cache show python3 >/dev/null 2>&1; }
if command -v apt-cache >/dev/null && [ "$host_release" = "$release" ]; then
    if ! apt_lists_ready && [ "$(id -u)" -eq 0 ]; then apt-get update -qq >/dev/null 2>&1 || true; fi
    if apt_lists_ready; then
        missing=0
        for pkg in $full; do
            apt-cache show "$pkg" >/dev/null 2>&1 || { echo "FAIL: $pkg is not a Debian $release package"; missing=1; failed=1; }
        done
        [ "$missing" = 0 ] && echo "ok: RUNTIMES=full names Debian $release packages: $full"
    else
        echo "note: this host has no Debian package lists (run: apt-get update); the RUNTIMES=full package names were not looked up"
    fi
else
    echo "note: not a Debian $release host; the RUNTIMES=full package names were not looked up"
fi

"$PY" - "$DOCKER/docker-compose.yml" "$REPO" <<'PYEOF' || failed=1
import os, sys, yaml
path, repo = sys.argv[1:]
doc = yaml.safe_load(open(path))
base = os.path.dirname(path)
errs = []
services = doc["services"]
workers = [n for n, s in services.items() if s.get("image") == "forkbox:dev"]
if len(workers) < 2:
    errs.append(f"want two or more workers, have {workers}")
for name in workers:
    s = services[name]
    opts = set(s.get("security_opt", []))
    for need in ("seccomp=unconfined", "systempaths=unconfined"):
        if need not in opts:
            errs.append(f"{name}: security_opt lacks {need}")
    if not any(o.startswith("apparmor=") for o in opts):
        errs.append(f"{name}: no apparmor= security_opt")
    if s.get("cgroup") != "private":
        errs.append(f"{name}: cgroup must be private")
    if s.get("privileged"):
        errs.append(f"{name}: must not be privileged")
    grace = int(s["command"][s["command"].index("--grace") + 1])
    if int(s["stop_grace_period"].rstrip("s")) <= grace:
        errs.append(f"{name}: stop_grace_period must exceed --grace {grace}")
    ctx = os.path.normpath(os.path.join(base, s["build"]["context"]))
    if not os.path.isfile(os.path.join(ctx, s["build"]["dockerfile"])):
        errs.append(f"{name}: build dockerfile not found from context {ctx}")
    if "redis://redis:" not in s["environment"]["FORKBOX_REDIS_URL"]:
        errs.append(f"{name}: does not point at the redis service")
redis = services["redis"]["command"]
if redis[redis.index("--appendonly") + 1] != "yes":
    errs.append("redis: AOF must be on")
for name, s in services.items():
    for vol in s.get("volumes", []):
        src = vol.split(":")[0]
        if src.startswith("."):
            if not os.path.exists(os.path.join(base, src)):
                errs.append(f"{name}: volume source {src} does not exist")
for e in errs:
    print(f"FAIL: compose: {e}")
if not errs:
    print(f"ok: compose runs redis with AOF, {len(workers)} workers with the sandbox flags, prometheus, grafana; mounts exist")
sys.exit(1 if errs else 0)
PYEOF
exit "$failed"
