#!/usr/bin/env bash
# promtool on the alert rules and the compose Prometheus config, then promtool's rule unit
# tests (alerts_test.yml): each alert fires on its failure and stays quiet on a healthy fleet.
set -euo pipefail
# shellcheck source=tests/deploy/tools.sh
. "$(dirname "$0")/tools.sh"
why=$(ensure_promtool) || { echo "SKIPPED: $why"; exit 77; }
ensure_promtool
why=$(ensure_venv) || { echo "SKIPPED: $why"; exit 77; }

"$PROMTOOL" check rules "$REPO/deploy/prometheus/forkbox-alerts.yml"
"$PROMTOOL" check config "$REPO/deploy/prometheus/prometheus.yml"

# promtool compares annotations too; the tests assert labels, so run them on a copy of the
# rules without annotations.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" - "$REPO" "$tmp" <<'PYEOF'
import sys, yaml
repo, tmp = sys.argv[1:]
rules = yaml.safe_load(open(f"{repo}/deploy/prometheus/forkbox-alerts.yml"))
for group in rules["groups"]:
    for rule in group["rules"]:
        rule.pop("annotations", None)
yaml.safe_dump(rules, open(f"{tmp}/rules.yml", "w"))
tests = yaml.safe_load(open(f"{repo}/tests/deploy/alerts_test.yml"))
tests["rule_files"] = [f"{tmp}/rules.yml"]
yaml.safe_dump(tests, open(f"{tmp}/alerts_test.yml", "w"))
PYEOF
"$PROMTOOL" test rules "$tmp/alerts_test.yml"
echo "ok: promtool check rules, check config and $(grep -c '^  - name:' "$REPO/tests/deploy/alerts_test.yml") rule unit tests"
