#!/usr/bin/env python3
"""Turns the raw results of bench/run.sh (RAW/*.json, loadgen reports, Redis statistics) into
one section file per table (OUT/<section>.json), which bench/report.py renders.

Section file format (also what other benchmarks write to add their own section):
  {"section": "name", "order": 20, "title": "...", "intro": "markdown",
   "tables": [{"columns": ["a", "b"], "rows": [["x", 1.5]]}], "notes": ["markdown", ...]}
A step that failed still gets its section, saying what failed, so the document never silently
drops a comparison.
"""

import json
import os
import sys


def load(raw, name):
    path = os.path.join(raw, name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"error": f"{name}: {e}"}


def text(raw, name):
    try:
        with open(os.path.join(raw, name)) as f:
            return f.read()
    except OSError:
        return ""


def fmt(x, digits=0):
    if x is None:
        return "n/a"
    if isinstance(x, (int, float)):
        return f"{x:,.{digits}f}"
    return str(x)


def ratio(a, b):
    if not a or not b:
        return "n/a"
    return f"{a / b:.2f}×"


def write(out, section):
    with open(os.path.join(out, section["section"] + ".json"), "w") as f:
        json.dump(section, f, indent=1)


def errors(*results):
    return [f"not measured: {r['error']}" for r in results if isinstance(r, dict) and "error" in r]


def environment(raw):
    e = load(raw, "environment.json")
    rows = [[k, str(e.get(k, ""))] for k in
            ["cpu", "cores", "memory_gb", "kernel", "redis", "python", "rq", "celery", "bwrap"]]
    return {"section": "environment", "order": 0, "title": "Environment",
            "intro": f"Measured in one run of `bench/run.sh` on one machine with {e.get('cores')} cores; "
                     f"every peer ran against the same Redis with {e.get('workers')} worker processes.",
            "tables": [{"columns": ["", ""], "rows": rows}], "notes": errors(e)}


def spawn(raw):
    s = load(raw, "spawn.json")
    if "error" in s:
        return {"section": "spawn", "order": 10, "title": "Spawn: /bin/true", "tables": [], "notes": errors(s)}
    bare = s["bare_fork_exec"]["p50_us"]
    rows = [["bare fork+exec+wait", fmt(bare), fmt(s["bare_fork_exec"]["p99_us"]), fmt(s["bare_per_s"]), "1.00×"],
            ["forkbox sandbox", fmt(s["forkbox"]["p50_us"]), fmt(s["forkbox"]["p99_us"]), fmt(s["forkbox_per_s"]),
             ratio(s["forkbox"]["p50_us"], bare)]]
    loopback = load(raw, "spawn-loopback.json")
    if "error" not in loopback:
        rows.append(["forkbox, loopback network (a new namespace each)", fmt(loopback["forkbox"]["p50_us"]),
                     fmt(loopback["forkbox"]["p99_us"]), fmt(loopback["forkbox_per_s"]),
                     ratio(loopback["forkbox"]["p50_us"], bare)])
    shared = load(raw, "spawn-shared-net.json")
    if "error" not in shared:
        rows.append(["forkbox, one shared network namespace", fmt(shared["forkbox"]["p50_us"]),
                     fmt(shared["forkbox"]["p99_us"]), fmt(shared["forkbox_per_s"]),
                     ratio(shared["forkbox"]["p50_us"], bare)])
    if s.get("bwrap"):
        rows.append(["bubblewrap", fmt(s["bwrap"]["p50_us"]), fmt(s["bwrap"]["p99_us"]), fmt(s.get("bwrap_per_s")),
                     ratio(s["bwrap"]["p50_us"], bare)])
    notes = [f"forkbox request-to-exec (`spawn_us`): p50 {fmt(s['forkbox_spawn_us']['p50_us'])} µs, "
             f"p99 {fmt(s['forkbox_spawn_us']['p99_us'])} µs; watchdog overshoot at a 500 ms limit: "
             f"p50 {fmt(s['watchdog_overshoot']['p50_us'])} µs, p99 {fmt(s['watchdog_overshoot']['p99_us'])} µs."]
    if not s.get("bwrap"):
        notes.append("bubblewrap was not installed, so it was not measured.")
    if "error" not in shared:
        notes.append("By default a job has no network (`none`: Unix sockets only) in a namespace no running job "
                     "shares, handed from one sandbox to the next once no socket is left in it. With "
                     "`\"network\": \"loopback\"` each sandbox gets a new namespace with `lo` up, which the kernel "
                     "tears down in the background once the sandbox is gone (see docs/security.md). "
                     "`--shared-net` (one namespace for all sandboxes of a node, whatever their network) is shown "
                     "for comparison.")
    fb = s["forkbox"]["p50_us"]
    notes.append(f"Targets: p50 within 1.5× of bare fork+exec: {fb / bare:.2f}× "
                 f"({'met' if fb <= 1.5 * bare else 'not met'})"
                 + (f"; at least 4× faster than bubblewrap: {s['bwrap']['p50_us'] / fb:.2f}× "
                    f"({'met' if s['bwrap']['p50_us'] >= 4 * fb else 'not met'})" if s.get("bwrap") else "")
                 + ".")
    return {"section": "spawn", "order": 10, "title": "Spawn: /bin/true",
            "intro": "Latency of one paced run (p50, p99) and back-to-back runs per second; the ratio is p50 against bare fork+exec.",
            "tables": [{"columns": ["method", "p50 µs", "p99 µs", "runs/s", "p50 vs bare"], "rows": rows}],
            "notes": notes}


def queue(raw):
    ceiling = load(raw, "ceiling.json")
    peers = [("RQ, forking worker", load(raw, "rq-fork.json")),
             ("RQ, SimpleWorker", load(raw, "rq-simple.json")),
             ("Celery, prefork", load(raw, "celery.json"))]
    # forkbox two ways: a backlog drained, measured as the peers are (the targets are judged on
    # it), and a closed loop with the load generator sending and reading alongside.
    backlog = load(raw, "forkbox-backlog/report.json")
    closed = load(raw, "forkbox-noop/report.json")
    best_peer = max((p.get("jobs_per_s") or 0 for _, p in peers), default=0)
    cap = ceiling.get("jobs_per_s")
    rows = []
    for name, fb in [("forkbox (full sandbox), backlog drained", backlog),
                     ("forkbox (full sandbox), closed loop", closed)]:
        if "error" not in fb:
            tp = fb.get("throughput_jobs_per_s")
            rows.append([name, fmt(tp), ratio(tp, best_peer), ratio(tp, cap),
                         f"{fb.get('completed')} done, {fb.get('lost')} lost, {fb.get('duplicated')} duplicated"])
    for name, p in peers:
        if "error" not in p:
            rows.append([name, fmt(p.get("jobs_per_s")), ratio(p.get("jobs_per_s"), best_peer),
                         ratio(p.get("jobs_per_s"), cap), f"{p.get('completed')} done, {p.get('failed')} failed"])
    if "error" not in ceiling:
        rows.append(["no queue, no isolation: processes spawning /bin/true", fmt(cap), ratio(cap, best_peer), "1.00×", ""])
    notes = errors(ceiling, backlog, closed, *(p for _, p in peers))
    fb_tp = backlog.get("throughput_jobs_per_s")
    if fb_tp and best_peer and cap:
        notes.append(f"Targets, on the backlog row (measured as the peers are): forkbox ≥ 3× the fastest peer: "
                     f"{fb_tp / best_peer:.2f}× ({'met' if fb_tp >= 3 * best_peer else 'not met'}); ≥ 50% of "
                     f"the unsandboxed ceiling: {100 * fb_tp / cap:.0f}% "
                     f"({'met' if fb_tp >= 0.5 * cap else 'not met'}).")
    p = backlog.get("parameters") or closed.get("parameters") or {}
    notes.append(f"forkbox: one node with {p.get('slots')} slots. Backlog: every job enqueued before the node "
                 "starts (`forkbox-loadgen --backlog`), throughput from the first result to the last, so neither "
                 "enqueueing nor start-up is in it. Closed loop: "
                 f"{closed.get('parameters', {}).get('concurrency')} jobs kept in flight, from the first send to "
                 "the last result, with the load generator sending and reading on the same cores. Peers: jobs "
                 "enqueued first, throughput from the first job's start to the last job's end as the jobs "
                 "recorded them (worker start-up excluded). Each peer job is `subprocess.run([\"/bin/true\"])`.")
    if closed.get("latency_ms"):
        l = closed["latency_ms"]
        notes.append(f"forkbox closed-loop enqueue-to-result latency: p50 {l['p50']:.2f} ms, p99 {l['p99']:.2f} ms, "
                     f"p99.9 {l['p999']:.2f} ms; spawn p50 {closed['spawn_us']['p50']:.0f} µs.")
    return {"section": "queue", "order": 20, "title": "Queue throughput: /bin/true jobs",
            "intro": "Same Redis, same number of worker processes, same job count.",
            "tables": [{"columns": ["system", "jobs/s", "vs fastest peer", "vs ceiling", "outcome"], "rows": rows}],
            "notes": notes}


ROLES = {
    "program": "the job's program after exec (loader, run, exit)",
    "sandbox": "sandbox init and launcher: namespaces, root, hardening, exec, reaping, tear-down",
    "zygote": "zygote: clone3, namespace pool, dispatch, watchdog",
    "node": "worker node: Redis client, engine, metrics",
    "loadgen": "load generator",
    "redis": "redis-server",
    "kernel": "kernel threads (RCU grace periods, softirqs, workqueues)",
    "other": "anything else on the machine",
}


def cpu_profile(raw):
    r = load(raw, "cpu-profile.json")
    ceiling = load(raw, "ceiling.json")
    env = load(raw, "environment.json")
    section = {"section": "cpu-profile", "order": 22, "title": "Where a queue job's CPU time goes",
               "intro": f"A forkbox run like the one above ({r.get('jobs', 'n/a')} `/bin/true` jobs, one node) "
                        "recorded machine-wide by `perf record -a -g`; `bench/profile.py` gives each sample "
                        "to a role by the process tree. CPU time per job, all cores together.",
               "tables": [], "notes": errors(r)}
    if "error" in r:
        return section
    per = r["us_per_job"]
    busy = sum(v for k, v in per.items() if k != "idle")
    rows = [[ROLES.get(k, k), fmt(v), f"{100 * v / busy:.0f}%"]
            for k, v in per.items() if k != "idle"]
    rows.append(["total busy", fmt(busy), "100%"])
    section["tables"].append({"columns": ["role", "µs per job", "share"], "rows": rows})
    section["tables"].append({
        "columns": ["sandbox processes, by kernel entry", "µs per job"],
        "rows": [[k, fmt(v)] for k, v in r["sandbox_us_per_job"].items()]})
    cap, cores = ceiling.get("jobs_per_s"), env.get("workers")
    if cap and cores:
        section["notes"].append(
            f"The unsandboxed ceiling above costs about {1e6 * cores / cap:,.0f} µs of CPU per job "
            f"({cores} busy processes ÷ {cap:,.0f} jobs/s), nearly all of it the program's own exec, "
            "loader and exit: compare the program row. Reaching half that ceiling would leave the "
            "queue, the node and the sandbox together about as much CPU per job as the program "
            "itself takes.")
    return section


def humaneval(raw):
    fb = load(raw, "forkbox-humaneval/report.json")
    lean = load(raw, "humaneval-mp.json")
    ref = load(raw, "humaneval-reference.json")
    rows = []
    fb_s = fb.get("elapsed_s")

    def row(name, passed, seconds):
        return [name, passed, fmt(seconds, 2), ratio(seconds, ref.get("seconds")),
                ratio(seconds, lean.get("seconds"))]

    if "error" not in fb:
        he = fb.get("humaneval") or {}
        rows.append(row("forkbox (python3 main.py in a sandbox)", f"{he.get('passed')}/{he.get('sent')}", fb_s))
    if "error" not in ref:
        rows.append(row("the reference harness's steps per problem: a Manager, a Process, a temporary "
                        "directory, a time limit; no isolation", f"{ref.get('passed')}/{ref.get('problems')}",
                        ref.get("seconds")))
    if "error" not in lean:
        rows.append(row("lean: one Process per problem reporting through a shared Value; no isolation",
                        f"{lean.get('passed')}/{lean.get('problems')}", lean.get("seconds")))
    notes = errors(fb, ref, lean)
    notes.append("Both baselines fork the already-running interpreter and `exec` the program in it, as the "
                 "reference harness does; forkbox starts a fresh `python3` per problem inside a sandbox, so "
                 "interpreter start-up is part of its time. The reference harness also starts a "
                 "`multiprocessing.Manager` (a server process) for every problem to carry the verdict back; "
                 "the lean variant leaves that out and is the strictest baseline.")
    if fb_s and ref.get("seconds") and lean.get("seconds"):
        def verdict(base):
            return "met" if fb_s <= base else "not met"
        notes.append(f"Target: 164 passes on both, forkbox no slower. Against the reference harness's steps: "
                     f"{ratio(fb_s, ref['seconds'])} ({verdict(ref['seconds'])}); against the lean variant: "
                     f"{ratio(fb_s, lean['seconds'])} ({verdict(lean['seconds'])}).")
    return {"section": "humaneval", "order": 30, "title": "HumanEval: 164 canonical solutions",
            "intro": "Wall time for all problems with the same parallelism, each of the 164 programs being the "
                     "prompt, the canonical solution, the tests and the check call; the ratios are time against "
                     "each baseline (lower is faster).",
            "tables": [{"columns": ["runner", "passed", "seconds", "vs reference steps", "vs lean"],
                        "rows": rows}],
            "notes": notes}


def parse_info(t):
    out = {}
    for line in t.splitlines():
        if ":" in line and not line.startswith("#"):
            k, v = line.strip().split(":", 1)
            out[k] = v
    return out


def redis_cost(raw):
    """Redis CPU and commands per job during the forkbox throughput run."""
    fb = load(raw, "forkbox-noop/report.json")
    before = parse_info(text(raw, "redis-cpu-before.txt"))
    after = parse_info(text(raw, "redis-cpu-after.txt"))
    stats = parse_info(text(raw, "redis-commandstats.txt"))
    if "error" in fb or not before or not after:
        return None
    p = fb.get("parameters", {})
    warm = p.get("warmup")
    if warm is None:
        warm = 2 * (p.get("spawn_workers") or 0) * (p.get("slots") or 0)
    jobs = fb["enqueued"] + warm
    cpu = sum(float(after[k]) - float(before[k]) for k in ("used_cpu_sys", "used_cpu_user"))
    calls = {}
    for k, v in stats.items():
        if k.startswith("cmdstat_"):
            fields = dict(kv.split("=") for kv in v.split(","))
            calls[k[len("cmdstat_"):]] = int(fields["calls"])
    total = sum(calls.values())
    return {"jobs": jobs, "cpu_us_per_job": 1e6 * cpu / jobs, "commands_per_job": total / jobs,
            "by_command": {k: v / jobs for k, v in sorted(calls.items(), key=lambda kv: -kv[1])}}


def bench_csv(raw, name):
    rows = {}
    for line in text(raw, name).splitlines()[1:]:
        parts = [x.strip('"') for x in line.split(",")]
        if len(parts) >= 2:
            try:
                rows[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return rows


def scaling(raw):
    sc = load(raw, "forkbox-scaling/report.json")
    env = load(raw, "environment.json")
    tables, notes = [], errors(sc)
    points = sc.get("scaling") or []
    if points:
        tables.append({"columns": ["nodes (K)", "jobs/s", "speedup vs K=1", "p99 ms"],
                       "rows": [[p["workers"], fmt(p["throughput_jobs_per_s"]), f"{p['speedup']:.2f}×",
                                 fmt(p["p99_ms"], 2)] for p in points]})
        hosts = (sc.get("parameters") or {}).get("hosts")
        notes.append(f"Each node ran in its own network namespace reaching Redis over a veth pair and a bridge "
                     f"({hosts} simulated hosts)." if hosts else "Nodes ran without simulated hosts (ip netns unavailable).")
        notes.append(f"This machine has {env.get('cores')} cores: every node, Redis and the load generator share "
                     "them, so beyond the core count more nodes add contention, not capacity. The rows show the "
                     "cost of running more nodes, not what more hosts would give; the model below does that.")
    cost = redis_cost(raw)
    plain = bench_csv(raw, "redis-benchmark.csv")
    piped = bench_csv(raw, "redis-benchmark-pipelined.csv")
    if cost:
        per_node = points[0]["throughput_jobs_per_s"] if points else None
        ceiling_cpu = 1e6 / cost["cpu_us_per_job"] if cost["cpu_us_per_job"] > 0 else None
        top = ", ".join(f"{k} {v:.2f}" for k, v in list(cost["by_command"].items())[:8])
        rows = [["Redis CPU per job (measured during the forkbox run)", f"{cost['cpu_us_per_job']:.1f} µs"],
                ["Redis commands per job (scripts' inner commands included)", f"{cost['commands_per_job']:.2f}"],
                ["commands per job, by command", top]]
        for k, v in plain.items():
            rows.append([f"redis-benchmark {k}, 50 clients", f"{v:,.0f} ops/s"])
        for k, v in piped.items():
            rows.append([f"redis-benchmark {k}, pipelined ×32", f"{v:,.0f} ops/s"])
        if ceiling_cpu:
            rows.append(["Redis-bound ceiling (one core / CPU per job)", f"{ceiling_cpu:,.0f} jobs/s"])
        tables.append({"columns": ["Redis cost", "value"], "rows": rows})
        if ceiling_cpu and per_node:
            model = []
            for h in (1, 2, 4, 8, 16, 32, 64):
                predicted = min(h * per_node, ceiling_cpu)
                model.append([h, fmt(h * per_node), fmt(predicted),
                              "Redis-bound" if h * per_node >= ceiling_cpu else "node-bound"])
            tables.append({"columns": ["hosts", "nodes alone (K=1 rate × hosts)", "predicted jobs/s", "limit"],
                           "rows": model})
            notes.append(f"Paper model: each host adds one node's rate ({per_node:,.0f} jobs/s measured at K=1 on "
                         f"this machine) until Redis' single core saturates at about {ceiling_cpu:,.0f} jobs/s "
                         f"({cost['cpu_us_per_job']:.1f} µs of Redis CPU per job, which includes the load "
                         "generator's own reads of the results stream). Past that, shard queues across Redis "
                         "Cluster slots (keys carry the `{queue}` hash tag).")
    return {"section": "scaling", "order": 40, "title": "Scaling across nodes, and where Redis saturates",
            "intro": "K = 1, 2, 4 worker nodes, each in a simulated host; the same job count per step.",
            "tables": tables, "notes": notes}


def sdk(raw):
    r = load(raw, "sdk-roundtrip.json")
    rows = []
    for name, row in (r.get("commands") or {}).items():
        f, b = row["forkbox"], row["subprocess"]
        rows.append([name, fmt(f["p50_ms"], 2), fmt(f["p99_ms"], 2), fmt(b["p50_ms"], 2),
                     fmt(b["p99_ms"], 2), f"{row['added_p50_ms']:+.2f}", f"{row['added_p99_ms']:+.2f}"])
    return {
        "section": "sdk", "order": 25, "title": "Python SDK round trip (local daemon)",
        "intro": "`Forkbox.run(cmd)` through `forkbox daemon` (full sandbox) against `subprocess.run` "
                 "of the same command without any sandbox, same process, same run, milliseconds. "
                 "Target: the sandbox adds at most 1 ms at p50.",
        "tables": [{"columns": ["command", "Forkbox p50", "Forkbox p99", "subprocess p50",
                                "subprocess p99", "added p50", "added p99"], "rows": rows}],
        "notes": errors(r),
    }


def main():
    raw, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    for build in (environment, spawn, queue, cpu_profile, humaneval, scaling, sdk):
        write(out, build(raw))


if __name__ == "__main__":
    main()
