#!/usr/bin/env python3
"""Check that the Grafana dashboard queries only metrics the Forkbox node exports.

Two sources of truth:
  * the static list below, taken from the node's metric contract (always checked);
  * optionally a Prometheus text exposition FILE scraped from a real node after it ran
    jobs (--metrics FILE): every series the dashboard or the alert rules query must then
    appear in that scrape.

Usage: check_dashboard.py [--metrics FILE] [--dashboard JSON] [--rules YAML]
Exit 0 when every check passes, 1 otherwise.
"""
import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# name -> type, as the node exports them.
EXPORTED = {
    "forkbox_jobs_total": "counter",
    "forkbox_job_duration_seconds": "histogram",
    "forkbox_spawn_seconds": "histogram",
    "forkbox_slots_busy": "gauge",
    "forkbox_slots": "gauge",
    "forkbox_jobs_in_flight": "gauge",
    "forkbox_queue_lag": "gauge",
    "forkbox_queue_pending": "gauge",
    "forkbox_queue_wait_seconds": "histogram",
    "forkbox_dead_letter_length": "gauge",
    "forkbox_build_info": "gauge",
    "forkbox_reclaimed_total": "counter",
    "forkbox_dead_letter_total": "counter",
    "forkbox_redis_errors_total": "counter",
    "forkbox_watchdog_overshoot_seconds": "histogram",
}
# Series Prometheus itself attaches to every target; alert rules may use them.
PROMETHEUS_SERIES = {"up"}

# The panels the dashboard must have: issue #6 asks for each of these families.
REQUIRED = {
    "forkbox_jobs_total", "forkbox_job_duration_seconds", "forkbox_spawn_seconds",
    "forkbox_slots_busy", "forkbox_queue_lag", "forkbox_dead_letter_total",
    "forkbox_reclaimed_total", "forkbox_queue_wait_seconds", "forkbox_jobs_in_flight",
    "forkbox_queue_pending", "forkbox_dead_letter_length", "forkbox_build_info",
}

PROMQL_WORDS = {
    "and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
    "bool", "offset", "atan2", "inf", "nan",
}
HIST_SUFFIXES = ("_bucket", "_sum", "_count")


def series_names(expr: str) -> set[str]:
    """Metric names referenced by a PromQL expression (a lexer, not a parser)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)           # string literals
    expr = re.sub(r"'(?:[^'\\]|\\.)*'", "''", expr)
    expr = re.sub(r"\{[^}]*\}", "{}", expr)                    # label matchers
    expr = re.sub(r"\[[^\]]*\]", "[]", expr)                   # ranges, subqueries
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\$\{?\w+\}?", " ", expr)                   # Grafana variables
    names = set()
    for m in re.finditer(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\()?", expr):
        word, call = m.group(1), m.group(2)
        if call or word.lower() in PROMQL_WORDS:
            continue
        if re.fullmatch(r"\d+[smhdwy]", word):
            continue
        names.add(word)
    return names


def family(series: str) -> str:
    if series in EXPORTED:
        return series
    for suffix in HIST_SUFFIXES:
        base = series[: -len(suffix)]
        if series.endswith(suffix) and EXPORTED.get(base) == "histogram":
            return base
    return series


def dashboard_exprs(dash: dict) -> list[tuple[str, str]]:
    out = []

    def panels(items):
        for p in items:
            yield p
            yield from panels(p.get("panels", []))

    for p in panels(dash.get("panels", [])):
        if p.get("type") == "row":
            continue
        targets = p.get("targets") or []
        if not targets:
            raise ValueError(f"panel {p.get('title')!r} has no query")
        for t in targets:
            out.append((f"panel {p.get('title')!r}", t["expr"]))
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v["query"]["query"] if isinstance(v["query"], dict) else v["query"]
            m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", q)
            if not m:
                raise ValueError(f"variable {v['name']}: unexpected query {q!r}")
            out.append((f"variable ${v['name']}", m.group(1)))
    return out


def rule_exprs(path: Path) -> list[tuple[str, str]]:
    import yaml  # only needed for the rules; the venv has it

    doc = yaml.safe_load(path.read_text())
    return [(f"alert {r['alert']}", r["expr"]) for g in doc["groups"] for r in g["rules"]]


def scraped_series(path: Path) -> set[str]:
    names = set()
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([a-zA-Z_:][a-zA-Z0-9_:]*)", line)
        if m:
            names.add(m.group(1))
    return names


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metrics", type=Path, help="Prometheus text scraped from a node's /metrics")
    ap.add_argument("--dashboard", type=Path, default=ROOT / "deploy/grafana/forkbox.json")
    ap.add_argument("--rules", type=Path, default=ROOT / "deploy/prometheus/forkbox-alerts.yml")
    args = ap.parse_args()

    errors = []
    dash = json.loads(args.dashboard.read_text())
    if not dash.get("uid") or not dash.get("title"):
        errors.append("dashboard needs a uid and a title")
    ids = [p["id"] for p in dash.get("panels", [])]
    if len(ids) != len(set(ids)):
        errors.append("dashboard panel ids are not unique")

    queries = dashboard_exprs(dash)
    if args.rules and args.rules.exists():
        queries += rule_exprs(args.rules)

    used = set()
    for where, expr in queries:
        names = series_names(expr)
        if not names:
            errors.append(f"{where}: no metric found in {expr!r}")
        for name in names:
            fam = family(name)
            if fam in PROMETHEUS_SERIES and where.startswith("alert"):
                continue
            if fam not in EXPORTED:
                errors.append(f"{where}: queries {name}, which the node does not export")
                continue
            if EXPORTED[fam] == "histogram" and name == fam:
                errors.append(f"{where}: histogram {fam} must be queried as _bucket/_sum/_count")
            used.add(fam)
    if args.metrics:
        exposed = scraped_series(args.metrics)
        for where, expr in queries:
            for name in series_names(expr):
                if name in PROMETHEUS_SERIES:
                    continue
                if name not in exposed:
                    errors.append(f"{where}: {name} is not in the scrape {args.metrics}")
        unknown = {family(n) for n in exposed if n.startswith("forkbox_")} - set(EXPORTED)
        for n in sorted(unknown):
            print(f"note: the node exports {n}, which neither the dashboard nor this list knows")

    dash_used = {family(n) for w, e in queries if w.startswith(("panel", "variable")) for n in series_names(e)}
    for fam in sorted(REQUIRED - dash_used):
        errors.append(f"dashboard has no panel on {fam}")

    for e in errors:
        print(f"FAIL: {e}")
    source = f"static list and scrape {args.metrics}" if args.metrics else "static list"
    print(f"checked {len(queries)} queries over {len(used)} metric families against the {source}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
