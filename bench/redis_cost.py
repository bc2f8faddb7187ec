#!/usr/bin/env python3
"""Redis CPU and commands per job: forkbox, BullMQ and Celery, each on a fresh redis-server.

For every system and round: start a redis-server of its own on a free port (no persistence,
never the one on 6379), `CONFIG RESETSTAT`, take `INFO cpu` and `INFO stats`, run N no-op jobs
end to end (enqueue, a worker with 2 slots/processes/concurrency draining them, and the client
reading every result back), let every process of the system exit, take the same readings, and
divide by N:

- Redis CPU µs per job: the delta of `used_cpu_user + used_cpu_sys` of the server (all its
  threads; this Redis runs no I/O threads);
- commands per job: every call `INFO commandstats` counts, the commands scripts run included
  (the measurement's own INFO and CONFIG left out);
- socket reads per job: `total_reads_processed`, the read events Redis served, i.e. about one
  per request or pipeline a client sent: the round trips;
- the commands, by command.

Systems (`--systems`, in this order each round, so a noisy machine hits them alike):
- `forkbox`: as an evaluation pipeline drives it with the CLI: `forkbox batch submit` of a
  JSONL file of `{"argv": ["/bin/true"]}` jobs (the idempotent enqueue script, batch
  counters), then a `forkbox worker --slots 2` is started, `forkbox batch wait` polls the
  batch's counters until done, `forkbox batch results --jsonl` reads every result, and the
  worker is stopped with SIGTERM.
- `forkbox-noop`: the same pipeline with forkbox's queue protocol and a no-op processor: the
  worker is `noop_worker` (`queue/examples/noop_worker.rs`, `cargo build --release -p
  forkbox-queue --example noop_worker`), which reads and completes as a node's reader and
  outbox do and stores a
  `/bin/true` job's result without running anything: the counterpart of BullMQ's no-op worker,
  at a job rate no sandbox reaches.
- `forkbox-loadgen`: `forkbox-loadgen --backlog`: a raw pipelined `XADD` per job (no script),
  one spawned worker with 2 slots, the results read from the results stream with `XREAD BLOCK`
  (what the scaling section of docs/benchmarks.md measured).
- `bullmq`: `Queue.addBulk`, a `Worker` with a no-op processor and concurrency 2, and a
  `QueueEvents` reader taking every `completed` event (bench/peers/bullmq_bench.js).
- `bullmq-true`: the same with a processor that runs `/bin/true` in a child process, so that
  BullMQ runs at about forkbox's job rate (Redis' cost per job depends on the rate: a busy
  Redis serves many requests per wake-up, with warm caches).
- `celery`: `task.delay()` per task, a prefork worker of 2 processes with Redis as broker and
  result backend, a no-op task, and `AsyncResult.get()` for every result
  (bench/peers/celery_bench.py --task noop).
- `forkbox-before`: `forkbox` with the worker of another build (`--forkbox-before PATH`), to
  compare two builds' worker protocol in the same run; `forkbox-before-noop`: `forkbox-noop`
  with a `noop_worker` built from that build's commit (`--noop-worker-before PATH`): the
  example copied there, adapted to that build's queue API where it differs (before
  `complete_many_and_read`, the same loop with `complete_many` and then `read` without
  blocking, two round trips, as that build's node did). The client
  commands (batch submit, wait, results) are this build's in every forkbox row, so an earlier
  build without them can be measured and the rows differ only in their workers.

Prints a table per round and the medians; `--json FILE` writes every reading, `--section FILE`
a section for bench/report.py (docs/benchmarks.md).

Needs: redis-server and redis-cli; `forkbox` and `forkbox-loadgen` (`--forkbox`, `--loadgen`,
or FORKBOX_BIN / FORKBOX_LOADGEN, else target/release); node with bullmq and ioredis in
bench/.node (`npm install --prefix bench/.node bullmq ioredis`, done by this script when npm
is there); Celery in bench/.venv (`python3 -m venv bench/.venv && bench/.venv/bin/pip install
celery redis packaging`, likewise).
"""

import argparse
import datetime
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NODE_DIR = os.path.join(HERE, ".node")
VENV_PY = os.path.join(HERE, ".venv", "bin", "python")
ALL = ["forkbox", "forkbox-noop", "forkbox-loadgen", "bullmq", "bullmq-true", "celery"]
BEFORE = ["forkbox-before", "forkbox-before-noop"]
# The measurement's own commands, left out of the counts.
OWN = {"info", "config|resetstat", "ping", "shutdown"}


def say(*a):
    print(*a, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A redis-server of its own on a free port, removed on exit."""

    def __init__(self, extra=()):
        self.dir = tempfile.mkdtemp(prefix="redis-cost-")
        self.port = free_port()
        while self.port == 6379:
            self.port = free_port()
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", "redis.log",
             "--maxmemory-policy", "noeviction", *extra],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(200):
            if self.cli("ping", check=False).strip() == "PONG":
                break
            time.sleep(0.05)
        else:
            self.stop()
            raise RuntimeError(f"redis-server on port {self.port} did not answer PING")

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def cli(self, *args, check=True):
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True)
        if check and r.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {r.stderr.strip()}")
        return r.stdout

    def info(self, section):
        out = {}
        for line in self.cli("info", section).splitlines():
            if ":" in line and not line.startswith("#"):
                k, v = line.strip().split(":", 1)
                out[k] = v
        return out

    def snapshot(self):
        cpu, stats = self.info("cpu"), self.info("stats")
        return {"cpu_s": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
                "reads": int(stats["total_reads_processed"]),
                "net_in": int(stats["total_net_input_bytes"]),
                "net_out": int(stats["total_net_output_bytes"])}

    def commandstats(self):
        calls = {}
        for k, v in self.info("commandstats").items():
            if not k.startswith("cmdstat_"):
                continue
            name = k[len("cmdstat_"):]
            fields = dict(kv.split("=") for kv in v.split(","))
            calls[name] = {"calls": int(fields["calls"]), "usec": int(fields["usec"])}
        return calls

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


def run(cmd, log, timeout, **kw):
    """Runs `cmd` to completion, its stderr to `log`; returns its stdout."""
    with open(log, "ab") as err:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, timeout=timeout, **kw)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... exited {r.returncode}; see {log}")
    return r.stdout.decode()


def forkbox_worker(system, a, redis):
    """The worker command of a forkbox system: a build's `forkbox worker`, or a `noop_worker`."""
    noop = {"forkbox-noop": a.noop_worker, "forkbox-before-noop": a.noop_worker_before}.get(system)
    if noop:
        return [noop, redis.url, "bench", str(a.slots)]
    binary = a.forkbox_before if system == "forkbox-before" else a.forkbox
    return [binary, "worker", "--redis", redis.url, "--queues", "bench", "--slots", str(a.slots)]


def forkbox_cli(binary, redis, jobs, work, worker_cmd, wait_s=600):
    """The CLI pipeline: batch submit, the worker `worker_cmd`, batch wait, batch results."""
    path = os.path.join(work, "jobs.jsonl")
    with open(path, "w") as f:
        f.write('{"argv": ["/bin/true"]}\n' * jobs)
    log = os.path.join(work, "forkbox.log")
    base = ["--redis", redis.url, "--queue", "bench"]
    t0 = time.time()
    run([binary, "batch", "submit", *base, "--batch", "rc", path], log, 300)
    worker = subprocess.Popen(worker_cmd, stdout=subprocess.DEVNULL, stderr=open(log, "ab"))
    try:
        t1 = time.time()
        run([binary, "batch", "wait", *base, "rc", "--timeout", str(wait_s), "--json"], log, wait_s + 100)
        t2 = time.time()
        lines = run([binary, "batch", "results", *base, "rc", "--jsonl"], log, 300).splitlines()
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    ok = sum(1 for line in lines if (json.loads(line).get("result") or {}).get("status") == "ok")
    return {"completed": ok, "enqueue_seconds": t1 - t0, "seconds": t2 - t1}


def forkbox_loadgen(binary, loadgen, redis, jobs, slots, work):
    report = os.path.join(work, "loadgen")
    env = dict(os.environ, FORKBOX_BIN=binary)
    run([loadgen, "--redis", redis.url, "--queue", "bench", "--jobs", str(jobs), "--backlog",
         "--spawn-workers", "1", "--slots", str(slots), "--report", report,
         "--quiet"], os.path.join(work, "loadgen.log"), 900, env=env)
    with open(os.path.join(report, "report.json")) as f:
        r = json.load(f)
    return {"completed": r.get("completed"), "lost": r.get("lost"), "duplicated": r.get("duplicated"),
            "seconds": (r.get("enqueued") or 0) / r["throughput_jobs_per_s"]
            if r.get("throughput_jobs_per_s") else None}


def bullmq(redis, jobs, slots, work, processor="noop"):
    out = run(["node", os.path.join(HERE, "peers", "bullmq_bench.js"), "--redis", redis.url,
               "--jobs", str(jobs), "--concurrency", str(slots), "--processor", processor],
              os.path.join(work, "bullmq.log"), 900)
    r = json.loads(out.strip().splitlines()[-1])
    return {"completed": r["completed"], "seconds": r["seconds"], "enqueue_seconds": r["enqueue_seconds"],
            "version": r["version"]}


def celery(redis, jobs, slots, work):
    out = run([VENV_PY, os.path.join(HERE, "peers", "celery_bench.py"), "--redis", redis.url + "/0",
               "--jobs", str(jobs), "--workers", str(slots), "--task", "noop"],
              os.path.join(work, "celery.log"), 900)
    r = json.loads(out.strip().splitlines()[-1])
    return {"completed": r["completed"], "seconds": r["seconds"]}


def measure(system, a, work):
    redis = Redis()
    try:
        redis.cli("config", "resetstat")
        before = redis.snapshot()
        if system in ("forkbox", "forkbox-noop") + tuple(BEFORE):
            extra = forkbox_cli(a.forkbox, redis, a.jobs, work, forkbox_worker(system, a, redis))
        elif system == "forkbox-loadgen":
            extra = forkbox_loadgen(a.forkbox, a.loadgen, redis, a.jobs, a.slots, work)
        elif system == "bullmq":
            extra = bullmq(redis, a.jobs, a.slots, work)
        elif system == "bullmq-true":
            extra = bullmq(redis, a.jobs, a.slots, work, processor="true")
        else:
            extra = celery(redis, a.jobs, a.slots, work)
        after = redis.snapshot()
        stats = {k: v for k, v in redis.commandstats().items() if k not in OWN}
    finally:
        redis.stop()
    n = a.jobs
    calls = sum(v["calls"] for v in stats.values())
    by = sorted(stats.items(), key=lambda kv: -kv[1]["calls"])
    return {
        "system": system, "jobs": n, **extra,
        "jobs_per_s": n / extra["seconds"] if extra.get("seconds") else None,
        "cpu_us_per_job": 1e6 * (after["cpu_s"] - before["cpu_s"]) / n,
        "commands_per_job": calls / n,
        "reads_per_job": (after["reads"] - before["reads"]) / n,
        "bytes_in_per_job": (after["net_in"] - before["net_in"]) / n,
        "bytes_out_per_job": (after["net_out"] - before["net_out"]) / n,
        "by_command": {k: {"per_job": v["calls"] / n, "usec_per_call": v["usec"] / max(v["calls"], 1)}
                       for k, v in by},
    }


def calibrate(pause_s, n=1000):
    """Redis CPU for one request, the same script of 13 calls, sent n times back to back
    (pause 0) or one every `pause_s` seconds: what a wake-up per request costs."""
    redis = Redis()
    try:
        sha = redis.cli("script", "load", "for i = 1, 13 do redis.call('EXISTS', KEYS[1]) end return 1").strip()
        request = f"*4\r\n$7\r\nEVALSHA\r\n${len(sha)}\r\n{sha}\r\n$1\r\n1\r\n$1\r\nk\r\n".encode()
        with socket.create_connection(("127.0.0.1", redis.port)) as conn:
            before = redis.snapshot()
            for _ in range(n):
                conn.sendall(request)
                if conn.recv(64) != b":1\r\n":
                    raise RuntimeError("unexpected reply to the calibration script")
                if pause_s:
                    time.sleep(pause_s)
            after = redis.snapshot()
    finally:
        redis.stop()
    return 1e6 * (after["cpu_s"] - before["cpu_s"]) / n


def top(r, k=8):
    return ", ".join(f"{name} {v['per_job']:.2f}" for name, v in list(r["by_command"].items())[:k])


def table(results):
    lines = [f"{'system':<16} {'Redis µs/job':>12} {'cmds/job':>9} {'reads/job':>9} {'jobs':>6} {'jobs/s':>7}"
             "  by command (per job)"]
    for r in results:
        rate = f"{r['jobs_per_s']:.0f}" if r.get("jobs_per_s") else "n/a"
        lines.append(f"{r['system']:<16} {r['cpu_us_per_job']:>12.1f} {r['commands_per_job']:>9.2f} "
                     f"{r['reads_per_job']:>9.2f} {r['completed']!s:>6} {rate:>7}  {top(r)}")
    return "\n".join(lines)


def medians(runs, systems):
    out = []
    for s in systems:
        rs = [r for r in runs if r["system"] == s and "error" not in r]
        if rs:
            out.append({"system": s, "rounds": len(rs),
                        "cpu_us_per_job": statistics.median(r["cpu_us_per_job"] for r in rs),
                        "commands_per_job": statistics.median(r["commands_per_job"] for r in rs),
                        "reads_per_job": statistics.median(r["reads_per_job"] for r in rs),
                        "jobs_per_s": statistics.median(r.get("jobs_per_s") or 0 for r in rs),
                        "all_cpu_us_per_job": [r["cpu_us_per_job"] for r in rs],
                        "last": rs[-1]})
    return out


LABELS = {
    "forkbox": "forkbox (CLI: batch submit, worker, batch wait, batch results)",
    "forkbox-before": "forkbox before (same pipeline, the earlier build's worker)",
    "forkbox-noop": "forkbox's queue with a no-op processor (the same pipeline, noop_worker)",
    "forkbox-before-noop": "the earlier build's queue with a no-op processor (its noop_worker)",
    "forkbox-loadgen": "forkbox (loadgen: raw XADD, results stream XREAD)",
    "bullmq": "BullMQ (addBulk, Worker with a no-op processor, QueueEvents)",
    "bullmq-true": "BullMQ, the processor running /bin/true in a child process",
    "celery": "Celery (delay, prefork worker, AsyncResult.get)",
}


def section(meta, med):
    rows = []
    for m in med:
        rows.append([LABELS.get(m["system"], m["system"]), f"{m['cpu_us_per_job']:.0f}",
                     " / ".join(f"{x:.0f}" for x in m["all_cpu_us_per_job"]),
                     f"{m['commands_per_job']:.1f}", f"{m['reads_per_job']:.2f}", f"{m['jobs_per_s']:,.0f}",
                     top(m["last"], 10)])
    notes = [f"Measured on {meta['date']} on {meta['machine']}, with {meta['jobs']:,} no-op jobs per run, "
             f"{meta['slots']} worker slots (processes, concurrency), {meta['rounds']} rounds run in turn "
             f"({', '.join(meta['systems'])}, then again), each run on a fresh `redis-server` "
             f"({meta['redis']}). The first figure is the median of the rounds, the rounds follow.",
             "Redis CPU is the server's `used_cpu_user + used_cpu_sys` from before the jobs are enqueued "
             "until every process of the run has exited, divided by the jobs: it includes the enqueue, the "
             "workers' reads and completions, their start-up and heartbeats, and the client side's reads of "
             "every result (forkbox: `batch wait` polling the batch counters and `batch results` reading "
             "the results; BullMQ: the `QueueEvents` stream; Celery: `AsyncResult.get`, which subscribes "
             "and reads per task).",
             "Commands are every call in `INFO commandstats`, the ones scripts run included; socket reads "
             "are `total_reads_processed`, about one per request or pipeline received: the round trips "
             "Redis served.",
             "The job is `/bin/true` in a sandbox for forkbox, a function returning at once for BullMQ and "
             "Celery, and `/bin/true` in a child process for the second BullMQ row; forkbox's no-op rows run "
             "nothing (`noop_worker` reads and completes as a node's reader and outbox do and stores a "
             "`/bin/true` job's result). Redis' cost per job "
             "depends on the job rate: a Redis kept busy serves many requests per wake-up with warm "
             "caches, one serving a few hundred jobs a second wakes up for nearly every request (compare "
             "the two BullMQ rows, whose commands are the same)."]
    calib = meta.get("calibration")
    if calib:
        notes.append(f"The rate effect, measured alone: one script of 13 calls, the same request each time, cost "
                     f"Redis {calib['back_to_back_us']:.0f} µs of CPU per request sent back to back and "
                     f"{calib['paced_us']:.0f} µs sent {calib['rate']:.0f} times a second (forkbox's rate above).")
    by = {m["system"]: m for m in med}
    fb = by.get("forkbox")
    if fb:
        cmp = []
        for other, what in (("forkbox-before", "the earlier build"), ("bullmq", "BullMQ's no-op run"),
                            ("bullmq-true", "BullMQ at about forkbox's job rate"), ("celery", "Celery")):
            o = by.get(other)
            if o and o["cpu_us_per_job"] > 0:
                cmp.append(f"{fb['cpu_us_per_job'] / o['cpu_us_per_job']:.2f}× {what} "
                           f"({o['cpu_us_per_job']:.0f} µs, {o['jobs_per_s']:,.0f} jobs/s)")
        if cmp:
            notes.append(f"forkbox: {fb['cpu_us_per_job']:.0f} µs of Redis CPU per job at "
                         f"{fb['jobs_per_s']:,.0f} jobs/s, " + "; ".join(cmp) + ".")
        before, bull, bull_rate = by.get("forkbox-before"), by.get("bullmq"), by.get("bullmq-true")
        if before and bull:
            def verdict(ok):
                return "met" if ok else "not met"
            half = fb["cpu_us_per_job"] <= before["cpu_us_per_job"] / 2
            line = (f"Target: at most half the earlier build's Redis CPU per job ({before['cpu_us_per_job'] / 2:.0f} µs): "
                    f"{verdict(half)}; no more than BullMQ's ({bull['cpu_us_per_job']:.0f} µs, no-op run): "
                    f"{verdict(fb['cpu_us_per_job'] <= bull['cpu_us_per_job'])}")
            if bull_rate:
                line += (f"; no more than BullMQ's at about the same job rate ({bull_rate['cpu_us_per_job']:.0f} µs): "
                         f"{verdict(fb['cpu_us_per_job'] <= bull_rate['cpu_us_per_job'])}")
            notes.append(line + ".")
    nop, before_nop, bull = by.get("forkbox-noop"), by.get("forkbox-before-noop"), by.get("bullmq")
    if nop:
        cmp = [f"{nop['cpu_us_per_job'] / o['cpu_us_per_job']:.2f}× {what} ({o['cpu_us_per_job']:.0f} µs, "
               f"{o['jobs_per_s']:,.0f} jobs/s)"
               for o, what in ((before_nop, "the earlier build's queue with the same processor"),
                               (bull, "BullMQ's no-op run")) if o and o["cpu_us_per_job"] > 0]
        notes.append(f"forkbox's queue with a no-op processor: {nop['cpu_us_per_job']:.0f} µs of Redis CPU per job "
                     f"at {nop['jobs_per_s']:,.0f} jobs/s" + (", " + "; ".join(cmp) if cmp else "") + ".")
        like = []
        if before_nop:
            like.append(f"at most half the earlier build's ({before_nop['cpu_us_per_job'] / 2:.0f} µs): "
                        f"{'met' if nop['cpu_us_per_job'] <= before_nop['cpu_us_per_job'] / 2 else 'not met'}")
        if bull:
            like.append(f"no more than BullMQ's ({bull['cpu_us_per_job']:.0f} µs): "
                        f"{'met' if nop['cpu_us_per_job'] <= bull['cpu_us_per_job'] else 'not met'}")
        if like:
            notes.append("Target, like for like (no-op processors on both sides): " + "; ".join(like) + ".")
    return {"section": "redis-cost", "order": 45, "title": "Redis cost per job",
            "intro": "Redis CPU and commands per job, end to end, for forkbox and its peers, each on a "
                     "Redis of its own (`bench/redis_cost.py`). Lower is better: one Redis core "
                     "serves at most 1,000,000 / (µs per job) jobs per second.",
            "tables": [{"columns": ["system", "Redis CPU µs/job", "rounds", "commands/job",
                                    "socket reads/job", "jobs/s", "commands per job, by command"],
                        "rows": rows}],
            "notes": notes}


def ensure_peers(systems):
    if any(s.startswith("bullmq") for s in systems) and not os.path.isdir(os.path.join(NODE_DIR, "node_modules", "bullmq")):
        cmd = ["npm", "install", "--prefix", NODE_DIR, "--no-audit", "--no-fund", "bullmq@5", "ioredis"]
        say("installing BullMQ:", " ".join(cmd))
        if shutil.which("npm") is None or subprocess.run(cmd).returncode != 0:
            sys.exit(f"BullMQ is missing; run: {' '.join(cmd)}")
    if "celery" in systems and not celery_ready():
        cmds = [[sys.executable, "-m", "venv", os.path.join(HERE, ".venv")],
                [VENV_PY, "-m", "pip", "install", "-q", "celery", "redis", "packaging"]]
        say("installing Celery:", " && ".join(" ".join(c) for c in cmds))
        for c in cmds:
            if subprocess.run(c).returncode != 0:
                sys.exit(f"Celery is missing; run: {' && '.join(' '.join(c) for c in cmds)}")


def celery_ready():
    return os.path.exists(VENV_PY) and subprocess.run(
        [VENV_PY, "-c", "import celery, redis, packaging"], capture_output=True).returncode == 0


def write_outputs(args, readings, section_doc):
    """Writes every reading to `--json` and the report section to `--section`, when given."""
    for path, doc in ((args.json, readings), (args.section, section_doc)):
        if path:
            with open(path, "w") as f:
                json.dump(doc, f, indent=1)


def binary(flag, option, env, name, build="cargo build --release -p forkbox -p forkbox-loadgen"):
    path = flag or os.environ.get(env) or os.path.join(ROOT, "target", "release", name)
    if not os.access(path, os.X_OK):
        sys.exit(f"{name} not found at {path}: build it ({build}), or pass {option} or set {env}")
    return os.path.realpath(path)


def earlier(flag, option, env, system, what):
    """A binary of the earlier build: named by `option` or `env`, never a default (the default
    would be this build's)."""
    path = flag or os.environ.get(env)
    if not path:
        sys.exit(f"the system {system} needs {what}: pass {option} PATH or set {env}")
    if not os.access(path, os.X_OK):
        sys.exit(f"{what} not found at {path} ({option} or {env})")
    return os.path.realpath(path)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--slots", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--systems", default=",".join(ALL),
                   help=f"comma-separated, from {', '.join(ALL + BEFORE)}")
    p.add_argument("--forkbox", help="the forkbox binary (FORKBOX_BIN, else target/release/forkbox)")
    p.add_argument("--loadgen", help="forkbox-loadgen (FORKBOX_LOADGEN, else target/release/forkbox-loadgen)")
    p.add_argument("--noop-worker", help="noop_worker for the system forkbox-noop (FORKBOX_NOOP_WORKER, "
                   "else target/release/examples/noop_worker)")
    p.add_argument("--noop-worker-before", help="noop_worker built from the earlier build, for the system "
                   "forkbox-before-noop (FORKBOX_NOOP_WORKER_BEFORE)")
    p.add_argument("--forkbox-before", help="the forkbox binary of the earlier build, whose worker the system "
                   "forkbox-before runs (FORKBOX_BEFORE)")
    p.add_argument("--json", help="write every reading here")
    p.add_argument("--section", help="write a bench/report.py section here")
    a = p.parse_args()
    if a.jobs < 1 or a.slots < 1 or a.rounds < 1:
        sys.exit("--jobs, --slots and --rounds must be at least 1")
    systems = [s.strip() for s in a.systems.split(",") if s.strip()]
    unknown = [s for s in systems if s not in ALL + BEFORE]
    if unknown:
        sys.exit(f"unknown system(s) {', '.join(unknown)}; choose from {', '.join(ALL + BEFORE)}")
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        sys.exit("redis-server and redis-cli are needed (apt-get install redis-server)")
    if any(s.startswith("forkbox") for s in systems):
        a.forkbox = binary(a.forkbox, "--forkbox", "FORKBOX_BIN", "forkbox")
    if "forkbox-before" in systems:
        a.forkbox_before = earlier(a.forkbox_before, "--forkbox-before", "FORKBOX_BEFORE", "forkbox-before",
                                   "the earlier build's forkbox")
    if "forkbox-before-noop" in systems:
        a.noop_worker_before = earlier(a.noop_worker_before, "--noop-worker-before", "FORKBOX_NOOP_WORKER_BEFORE",
                                       "forkbox-before-noop", "the earlier build's noop_worker")
    if "forkbox-noop" in systems:
        a.noop_worker = binary(a.noop_worker, "--noop-worker", "FORKBOX_NOOP_WORKER",
                               os.path.join("examples", "noop_worker"),
                               "cargo build --release -p forkbox-queue --example noop_worker")
    if "forkbox-loadgen" in systems:
        a.loadgen = binary(a.loadgen, "--loadgen", "FORKBOX_LOADGEN", "forkbox-loadgen")
    ensure_peers(systems)

    runs = []
    for rnd in range(1, a.rounds + 1):
        this = []
        for s in systems:
            work = tempfile.mkdtemp(prefix=f"redis-cost-{s}-")
            say(f"round {rnd}: {s}")
            try:
                r = measure(s, a, work)
                shutil.rmtree(work, ignore_errors=True)
            except Exception as e:  # one broken system must not lose the others
                r = {"system": s, "error": f"{e} (logs in {work})"}
                say(f"  {s} failed: {r['error']}")
            r["round"] = rnd
            this.append(r)
            runs.append(r)
        ok = [r for r in this if "error" not in r]
        print(f"round {rnd} of {a.rounds}\n{table(ok)}\n", flush=True)
    med = medians(runs, systems)
    print("medians over the rounds")
    for m in med:
        rounds = " / ".join(f"{x:.0f}" for x in m["all_cpu_us_per_job"])
        print(f"{m['system']:<16} {m['cpu_us_per_job']:>8.1f} µs/job (rounds {rounds}), "
              f"{m['commands_per_job']:.2f} commands/job, {m['reads_per_job']:.2f} reads/job")
    rate = next((m["jobs_per_s"] for m in med if m["system"] == "forkbox" and m["jobs_per_s"]), 300)
    calib = {"rate": rate, "back_to_back_us": calibrate(0), "paced_us": calibrate(1 / rate)}
    print(f"one 13-call script, Redis CPU per request: {calib['back_to_back_us']:.1f} µs back to back, "
          f"{calib['paced_us']:.1f} µs at {rate:.0f} requests/s")
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    meta = {"date": datetime.date.today().isoformat(), "calibration": calib, "jobs": a.jobs, "slots": a.slots, "rounds": a.rounds,
            "systems": systems, "cores": os.cpu_count(), "cpu": cpu, "kernel": platform.release(),
            "machine": f"a shared {os.cpu_count()}-core VM ({cpu}), noisy: other builds ran beside it",
            "redis": subprocess.run(["redis-server", "--version"], capture_output=True,
                                    text=True).stdout.split(" sha=")[0].strip()}
    write_outputs(a, {"meta": meta, "medians": med, "runs": runs}, section(meta, med))
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
