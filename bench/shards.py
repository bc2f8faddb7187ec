#!/usr/bin/env python3
"""A queue's Redis cost spread over the shards of a Redis Cluster: one partition against N.

Starts a local Redis Cluster of `--primaries` primaries (cluster-enabled redis-servers on free
ports, no replicas, no persistence, never 6379), then, for each partition count in
`--partitions` (default `1,3`) and each round, runs the same backlog through it:

    forkbox-loadgen --cluster --redis SEEDS --queue shardsN-R --partitions N --jobs J \
        --backlog --spawn-workers W --slots S --mix noop:1

and reads every primary's `INFO cpu`, `INFO stats` and `INFO commandstats` before and after.
Each primary's Redis CPU per job is its `used_cpu_user + used_cpu_sys` delta, less what it
spends idle (the cluster bus, measured over `--idle-seconds` just before the run, at the same
rate for the run's duration), divided by the jobs. The queue's Redis ceiling is set by its
busiest shard: 1,000,000 / (that shard's µs per job) jobs per second, so the table shows how
the ceiling grows with partitions. What a 2-core host cannot show is the throughput at that
ceiling: the workers saturate the machine first (the jobs/s column is the node's, not Redis').

Prints a table per run and the medians; `--json FILE` writes every reading, `--section FILE` a
section for bench/report.py (docs/benchmarks.md).

Needs redis-server and redis-cli; `forkbox` and `forkbox-loadgen` (`--forkbox`, `--loadgen`,
or FORKBOX_BIN / FORKBOX_LOADGEN, else target/release).
"""

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import redis_cost  # noqa: E402
from redis_cost import OWN, Redis, binary, run, say, write_outputs  # noqa: E402


class ClusterNode(Redis):
    """One cluster-enabled redis-server of its own on a free port."""

    def __init__(self):
        self.bus = redis_cost.free_port()
        super().__init__(["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                          "--cluster-port", str(self.bus), "--cluster-node-timeout", "5000"])

    def slots(self):
        """The slot ranges this node serves, from its own line of `CLUSTER NODES`."""
        for line in self.cli("cluster", "nodes").splitlines():
            fields = line.split()
            if "myself" in fields[2]:
                ranges = []
                for f in fields[8:]:
                    if f.startswith("["):
                        continue  # a slot being migrated
                    lo, _, hi = f.partition("-")
                    ranges.append((int(lo), int(hi or lo)))
                return ranges
        return []


class Cluster:
    def __init__(self, primaries):
        self.nodes = []
        try:
            for _ in range(primaries):
                self.nodes.append(ClusterNode())
            made = subprocess.run(["redis-cli", "--cluster", "create",
                                   *[f"127.0.0.1:{n.port}" for n in self.nodes],
                                   "--cluster-replicas", "0", "--cluster-yes"],
                                  capture_output=True, text=True, timeout=60)
            if made.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create: {made.stdout}{made.stderr}")
            end = time.monotonic() + 60
            while not all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
                if time.monotonic() > end:
                    raise RuntimeError("the cluster did not reach cluster_state:ok in 60 s")
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise

    @property
    def seeds(self):
        return ",".join(n.url for n in self.nodes)

    def snapshot(self):
        return [dict(n.snapshot(), commands=n.commandstats()) for n in self.nodes]

    def stop(self):
        for n in self.nodes:
            n.stop()


def partition_ports(cluster, queue, partitions):
    """Which primary (by port) holds each partition's job stream."""
    node = cluster.nodes[0]
    out = []
    for k in range(partitions):
        key = f"forkbox:{{{queue}}}:jobs" if partitions == 1 else f"forkbox:{{{queue}:p:{k}}}:jobs"
        slot = int(node.cli("cluster", "keyslot", key).strip())
        for n in cluster.nodes:
            if any(lo <= slot <= hi for lo, hi in n.slots()):
                out.append(n.port)
    return out


def measure(cluster, a, partitions, rnd, work):
    queue = f"shards{partitions}-{rnd}"
    idle0 = cluster.snapshot()
    time.sleep(a.idle_seconds)
    idle1 = cluster.snapshot()
    idle_rate = [(y["cpu_s"] - x["cpu_s"]) / a.idle_seconds for x, y in zip(idle0, idle1)]
    report = os.path.join(work, f"loadgen-{queue}")
    env = dict(os.environ, FORKBOX_BIN=a.forkbox)
    before = cluster.snapshot()
    t0 = time.monotonic()
    run([a.loadgen, "--cluster", "--redis", cluster.seeds, "--queue", queue,
         "--partitions", str(partitions), "--jobs", str(a.jobs), "--backlog",
         "--spawn-workers", str(a.workers), "--slots", str(a.slots), "--mix", "noop:1",
         "--report", report, "--quiet"], os.path.join(work, "loadgen.log"), 1800, env=env)
    elapsed = time.monotonic() - t0
    after = cluster.snapshot()
    with open(os.path.join(report, "report.json")) as f:
        r = json.load(f)
    shards = []
    for node, x, y, idle in zip(cluster.nodes, before, after, idle_rate):
        raw = y["cpu_s"] - x["cpu_s"]
        calls = sum(v["calls"] - x["commands"].get(k, {"calls": 0})["calls"]
                    for k, v in y["commands"].items() if k not in OWN)
        shards.append({"port": node.port,
                       "cpu_us_per_job": 1e6 * max(raw - idle * elapsed, 0.0) / a.jobs,
                       "raw_cpu_us_per_job": 1e6 * raw / a.jobs,
                       "idle_cpu_us_per_s": 1e6 * idle,
                       "commands_per_job": calls / a.jobs,
                       "reads_per_job": (y["reads"] - x["reads"]) / a.jobs})
    busiest = max(s["cpu_us_per_job"] for s in shards)
    return {"partitions": partitions, "round": rnd, "jobs": a.jobs, "seconds": elapsed,
            "completed": r.get("completed"), "lost": r.get("lost"),
            "duplicated": r.get("duplicated"), "jobs_per_s": r.get("throughput_jobs_per_s"),
            "partition_ports": partition_ports(cluster, queue, partitions),
            "shards": shards,
            "total_cpu_us_per_job": sum(s["cpu_us_per_job"] for s in shards),
            "busiest_cpu_us_per_job": busiest,
            "ceiling_jobs_per_s": 1e6 / busiest if busiest else None}


def describe(m):
    spread = " / ".join(f"{s['cpu_us_per_job']:.0f}" for s in sorted(m["shards"], key=lambda s: -s["cpu_us_per_job"]))
    return (f"partitions {m['partitions']}: {m['completed']}/{m['jobs']} done, lost {m['lost']}, "
            f"duplicated {m['duplicated']}, {m['jobs_per_s'] or 0:.0f} jobs/s; Redis µs/job per "
            f"shard {spread} (total {m['total_cpu_us_per_job']:.0f}); ceiling "
            f"{m['ceiling_jobs_per_s'] or 0:,.0f} jobs/s")


def medians(runs):
    out = []
    for n in sorted({m["partitions"] for m in runs}):
        mine = [m for m in runs if m["partitions"] == n]
        med = lambda key: statistics.median(m[key] for m in mine)  # noqa: E731
        out.append({"partitions": n, "rounds": len(mine),
                    "busiest_cpu_us_per_job": med("busiest_cpu_us_per_job"),
                    "all_busiest": [round(m["busiest_cpu_us_per_job"]) for m in mine],
                    "total_cpu_us_per_job": med("total_cpu_us_per_job"),
                    "shares": [sorted((round(s["cpu_us_per_job"]) for s in m["shards"]), reverse=True)
                               for m in mine],
                    "jobs_per_s": med("jobs_per_s"),
                    "commands_per_job": statistics.median(sum(x.get("commands_per_job", 0) for x in m["shards"])
                                                          for m in mine),
                    "reads_per_job": statistics.median(sum(x.get("reads_per_job", 0) for x in m["shards"])
                                                       for m in mine),
                    "lost": sum(m["lost"] or 0 for m in mine),
                    "duplicated": sum(m["duplicated"] or 0 for m in mine),
                    "distinct_primaries": statistics.median(len(set(m["partition_ports"])) for m in mine)})
    for m in out:
        m["ceiling_jobs_per_s"] = 1e6 / m["busiest_cpu_us_per_job"] if m["busiest_cpu_us_per_job"] else None
    return out


def section(meta, med):
    base = med[0]
    rows = []
    for m in med:
        rows.append([
            m["partitions"], f"{m['distinct_primaries']:.0f} of {meta['primaries']}",
            f"{m['busiest_cpu_us_per_job']:.0f} ({' / '.join(map(str, m['all_busiest']))})",
            "; ".join(" / ".join(map(str, s)) for s in m["shares"]),
            f"{m['total_cpu_us_per_job']:.0f}",
            f"{m['ceiling_jobs_per_s']:,.0f} ({m['ceiling_jobs_per_s'] / base['ceiling_jobs_per_s']:.2f}×)"
            if m["ceiling_jobs_per_s"] and base["ceiling_jobs_per_s"] else "n/a",
            f"{m['jobs_per_s']:.0f}", f"{m['lost']} / {m['duplicated']}"])
    return {
        "section": "shards", "order": 62,
        "title": "One queue over the shards of a Redis Cluster",
        "intro": (f"Generated by `bench/shards.py`: one queue's Redis CPU per job on each primary of a local "
                  f"Redis Cluster of {meta['primaries']} primaries, partitioned 1 and "
                  f"{max(m['partitions'] for m in med)} ways, the same backlog of {meta['jobs']} no-op "
                  f"(`/bin/true`) jobs through `forkbox-loadgen --cluster --backlog` with "
                  f"{meta['workers']} spawned worker(s) of {meta['slots']} slots, {meta['rounds']} rounds. "
                  f"The busiest shard sets the queue's Redis ceiling: 1,000,000 / its µs per job."),
        "tables": [{"columns": ["partitions", "primaries holding them", "busiest shard µs/job (rounds)",
                                "every shard µs/job, per round", "all shards µs/job", "Redis ceiling jobs/s",
                                "jobs/s measured (node-bound)", "lost / duplicated"],
                    "rows": rows}],
        "notes": [f"Measured on {meta['date']} on {meta['machine']}, {meta['redis']}; {meta['build']}.",
                  "Each shard's CPU is its `used_cpu_user + used_cpu_sys` delta less its idle rate (the "
                  "cluster bus, measured just before each run), per job; a shard holding no partition "
                  "of the queue still serves the workers' slot-map refreshes.",
                  "Over all shards, per job: " + "; ".join(
                      f"{m['partitions']} partition(s) {m['commands_per_job']:.2f} commands in "
                      f"{m['reads_per_job']:.2f} round trips" for m in med) + ". Redis' CPU per request "
                  "falls as its request rate rises (see \"Redis cost per job\"): a shard serving a part "
                  "of the requests spends more on each, so the ceilings here, measured at this node's "
                  "rate, are lower bounds.",
                  "The measured jobs/s is the node's on this machine, far below any ceiling: the "
                  "ceiling column is what Redis could serve, from its measured cost, not a throughput "
                  "this host reached."],
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--primaries", type=int, default=3)
    p.add_argument("--partitions", default="1,3", help="comma-separated partition counts")
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--idle-seconds", type=float, default=3.0)
    p.add_argument("--forkbox", help="the forkbox binary (FORKBOX_BIN, else target/release/forkbox)")
    p.add_argument("--loadgen", help="forkbox-loadgen (FORKBOX_LOADGEN, else target/release/forkbox-loadgen)")
    p.add_argument("--json", help="write every reading here")
    p.add_argument("--section", help="write a bench/report.py section here")
    a = p.parse_args()
    a.forkbox = binary(a.forkbox, "--forkbox", "FORKBOX_BIN", "forkbox")
    a.loadgen = binary(a.loadgen, "--loadgen", "FORKBOX_LOADGEN", "forkbox-loadgen")
    counts = [int(x) for x in a.partitions.split(",") if x.strip()]
    if not counts or any(n < 1 for n in counts):
        p.error(f"--partitions {a.partitions!r}: give partition counts of 1 or more")
    work = tempfile.mkdtemp(prefix="forkbox-shards-")
    cluster = Cluster(a.primaries)
    runs = []
    try:
        for rnd in range(a.rounds):
            for n in counts:
                m = measure(cluster, a, n, rnd, work)
                say(describe(m))
                runs.append(m)
        redis_version = cluster.nodes[0].info("server").get("redis_version", "?")
    finally:
        cluster.stop()
    med = medians(runs)
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": f"this {os.cpu_count()}-core machine ({platform.machine()})",
            "redis": f"Redis {redis_version}", "build": os.path.basename(os.path.dirname(a.forkbox)) + " build",
            "primaries": a.primaries, "jobs": a.jobs, "workers": a.workers, "slots": a.slots,
            "rounds": a.rounds}
    for m in med:
        say(f"median, partitions {m['partitions']}: busiest shard {m['busiest_cpu_us_per_job']:.0f} µs/job, "
            f"ceiling {m['ceiling_jobs_per_s'] or 0:,.0f} jobs/s, all shards {m['total_cpu_us_per_job']:.0f} µs/job")
    write_outputs(a, {"meta": meta, "runs": runs, "medians": med}, section(meta, med))
    lost = sum(m["lost"] or 0 for m in runs) + sum(m["duplicated"] or 0 for m in runs)
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
