#!/usr/bin/env python3
"""The warm Python runtime's benchmark: every measure side by side in one run, on this machine.

Prints a Markdown section (and writes it with --out). Measures:

1. HumanEval's 164 programs drained from a queue by one worker with 2 slots (forkbox-loadgen
   --backlog, throughput from the first result to the last), warm and cold, against a lean
   harness that forks this already-running interpreter once per problem, 2 at a time, with no
   isolation at all.
2. `python3 -c 'print(6*7)'` through the local daemon: request to exit (`spawn_us` plus
   `duration_ms`), p50 and p99, warm and cold, and the client's round trip.
3. CPU per job of the whole process tree (node, zygote, sandboxes), for warm Python, cold
   Python and `/bin/true`, from /proc accounting.
4. What the runtime costs: zygote memory and warm-up time per preload (`forkbox check`), and
   `/bin/true` spawn time with the runtime on and off.

Usage: bench/warm_python.py [--bin target/release/forkbox] [--loadgen ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import gzip
import json
import multiprocessing as mp
import multiprocessing.connection as mp_connection
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "sdk/python/src"))

from forkbox import Forkbox  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def humaneval_programs(path: Path) -> list[str]:
    with gzip.open(path, "rt") as f:
        problems = [json.loads(line) for line in f if line.strip()]
    # As loadgen/src/humaneval.rs builds them.
    return [
        f"{p['prompt']}{p['canonical_solution']}\n{p['test']}\ncheck({p['entry_point']})\n"
        for p in problems
    ]


def _run_problem(program: str) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    exec(compile(program, "main.py", "exec"), {"__name__": "__main__"})


def lean_harness(programs: list[str], parallel: int) -> float:
    """Fork-per-problem, `parallel` at a time, no isolation: the wall time. A problem starts as
    soon as any running one ends, so no slot waits behind a slow problem."""
    ctx = mp.get_context("fork")
    start = time.perf_counter()
    running: list = []
    for program in programs:
        while len(running) >= parallel:
            ended = set(mp_connection.wait([p.sentinel for p in running]))
            for proc in [p for p in running if p.sentinel in ended]:
                proc.join()
                running.remove(proc)
        proc = ctx.Process(target=_run_problem, args=(program,))
        proc.start()
        running.append(proc)
    for proc in running:
        proc.join()
    return time.perf_counter() - start


def loadgen_humaneval(loadgen: str, bin_: str, data: Path, runtime: str | None) -> float:
    """Wall time of the 164 problems drained by one spawned worker with 2 slots."""
    with tempfile.TemporaryDirectory() as report:
        cmd = [
            loadgen, "--redis", "redis://127.0.0.1:6379/", "--queue", f"bench-warm-{uuid.uuid4().hex[:8]}",
            "--backlog", "--jobs", "164", "--mix", "humaneval", "--spawn-workers", "1",
            "--slots", "2", "--humaneval", str(data), "--report", report,
        ]
        if runtime:
            cmd += ["--runtime", runtime]
        env = dict(os.environ, FORKBOX_BIN=bin_)
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = json.loads((Path(report) / "report.json").read_text())
    phase = r["phases"][0] if "phases" in r else r
    # Throughput counts from the first result to the last: 163 intervals for 164 jobs.
    return 164 / phase["throughput_jobs_per_s"]


def tree_cpu_s(pid: int) -> float:
    """CPU of `pid` and every descendant, live or reaped (cutime/cstime), in seconds."""
    total = 0.0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in fields[11:15]) / CLK_TCK
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            # It exited after its stat was read: its CPU is counted, it has no children left.
            continue
        for task in tasks:
            try:
                stack += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
    return total


class Daemon:
    def __init__(self, bin_: str, slots: int, preload: str | None):
        self.dir = tempfile.TemporaryDirectory()
        self.sock = os.path.join(self.dir.name, "fb.sock")
        cmd = [bin_, "daemon", "--socket", self.sock, "--slots", str(slots)]
        if preload is not None:
            cmd += ["--python-preload", preload]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(600):
            if os.path.exists(self.sock):
                break
            time.sleep(0.05)
        self.client = Forkbox(socket=self.sock)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait()
        self.dir.cleanup()


NUMPY_JOB = ["python3", "-c", "import numpy as np; print(int(np.arange(10).sum()))"]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def latency(d: Daemon, argv: list[str], runtime: str | None, n: int) -> dict:
    req_exit, rtt = [], []
    for i in range(n + 5):
        t = time.perf_counter()
        r = d.client.run(argv=argv, runtime=runtime)
        dt = time.perf_counter() - t
        assert r.status == "ok", (r.status, r.stderr, r.error)
        if runtime:
            assert r.runtime and r.runtime.get("warm"), r.runtime
        if i >= 5:
            req_exit.append(r.spawn_us / 1000 + r.duration_ms)
            rtt.append(dt * 1000)
    return {
        "p50_ms": pct(req_exit, 0.5),
        "p99_ms": pct(req_exit, 0.99),
        "rtt_p50_ms": pct(rtt, 0.5),
    }


def cpu_per_job(d: Daemon, argv: list[str], runtime: str | None, n: int) -> float:
    d.client.run(argv=argv, runtime=runtime)
    before = tree_cpu_s(d.proc.pid)
    for _ in range(n):
        r = d.client.run(argv=argv, runtime=runtime)
        assert r.status == "ok", r.stderr
    # The last sandbox's init is reaped by the zygote shortly after its report.
    time.sleep(0.3)
    return (tree_cpu_s(d.proc.pid) - before) / n * 1000


def spawn_p50(d: Daemon, n: int) -> float:
    spawns = []
    for _ in range(n):
        r = d.client.run(argv=["/bin/true"])
        spawns.append(r.spawn_us)
    return pct(spawns, 0.5)


def check_line(bin_: str, preload: str) -> dict:
    out = subprocess.run(
        [bin_, "check", "--python-preload", preload], capture_output=True, text=True
    ).stdout
    m = re.search(r"warm-up ([\d.]+) ms, zygote RSS (\d+) -> (\d+) KiB", out)
    mods = re.search(r"\((\d+) modules loaded in all\)", out)
    failed = re.findall(r"python preload: (\S+) not imported", out)
    if not m:
        return {"preload": preload, "unavailable": out.strip().splitlines()[-1:]}
    return {
        "preload": preload,
        "warm_up_ms": float(m.group(1)),
        "rss_before_kb": int(m.group(2)),
        "rss_after_kb": int(m.group(3)),
        "modules": int(mods.group(1)) if mods else None,
        "failed": failed,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=str(ROOT / "target/release/forkbox"))
    ap.add_argument("--loadgen", default=str(ROOT / "target/release/forkbox-loadgen"))
    ap.add_argument("--humaneval", default=os.environ.get("FORKBOX_HUMANEVAL", "/work/shared/data/HumanEval.jsonl.gz"))
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    res: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "load": os.getloadavg(),
        "build": "release" if "/release/" in args.bin else "debug",
    }

    programs = humaneval_programs(Path(args.humaneval))
    res["lean_s"] = min(lean_harness(programs, 2) for _ in range(3))
    res["warm_s"] = min(loadgen_humaneval(args.loadgen, args.bin, Path(args.humaneval), "python") for _ in range(2))
    res["cold_s"] = loadgen_humaneval(args.loadgen, args.bin, Path(args.humaneval), None)
    res["lean_s2"] = min(lean_harness(programs, 2) for _ in range(3))

    d = Daemon(args.bin, 1, None)
    try:
        six = ["python3", "-c", "print(6*7)"]
        res["warm_latency"] = latency(d, six, "python", args.n)
        res["cold_latency"] = latency(d, six, None, args.n // 4)
        res["cpu_warm_ms"] = cpu_per_job(d, six, "python", args.n)
        res["cpu_cold_ms"] = cpu_per_job(d, six, None, args.n // 4)
        res["cpu_true_ms"] = cpu_per_job(d, ["/bin/true"], None, args.n)
        res["spawn_true_on_us"] = spawn_p50(d, args.n)
    finally:
        d.close()
    d = Daemon(args.bin, 1, "none")
    try:
        res["cpu_true_off_ms"] = cpu_per_job(d, ["/bin/true"], None, args.n)
        res["spawn_true_off_us"] = spawn_p50(d, args.n)
    finally:
        d.close()
    res["preloads"] = []
    default_list = None
    out = subprocess.run([args.bin, "check"], capture_output=True, text=True).stdout
    m = re.search(r"python preload: (\S+) \(", out)
    if m:
        default_list = m.group(1)
    for name, preload in (
        ("sys only", "sys"),
        ("default", default_list),
        ("default + numpy", f"{default_list},numpy"),
    ):
        if preload:
            row = check_line(args.bin, preload)
            row["name"] = name
            if "warm_up_ms" in row:
                # What a job of that zygote costs: `print` warm, and the same through a node
                # whose preload includes numpy, a job that uses it, warm and cold.
                d = Daemon(args.bin, 1, preload)
                try:
                    row["print_latency"] = latency(d, six, "python", args.n // 2)
                    row["print_cpu_ms"] = cpu_per_job(d, six, "python", args.n // 2)
                    if "numpy" in preload and "numpy" not in row["failed"]:
                        res["numpy_warm"] = latency(d, NUMPY_JOB, "python", args.n // 4)
                        res["numpy_cold"] = latency(d, NUMPY_JOB, None, args.n // 10)
                finally:
                    d.close()
            res["preloads"].append(row)
    print(json.dumps(res, indent=2), file=sys.stderr)
    md = render(res)
    print(md)
    if args.out:
        Path(args.out).write_text(md)


def render(r: dict) -> str:
    lean = min(r["lean_s"], r["lean_s2"])
    w, c = r["warm_latency"], r["cold_latency"]
    lines = [
        "## Warm Python runtime",
        "",
        f"Measured by `bench/warm_python.py` on {r['date']} on this 2-core machine, every row in one run "
        f"(load average at the start {r['load'][0]:.1f}, shared with other builds: absolute numbers are "
        f"noisy, ratios are within the run). {r['build'].capitalize()} build of forkbox.",
        "",
        "| measure | value | target | |",
        "|---|---|---|---|",
        f"| HumanEval 164, one worker with 2 slots, warm | {r['warm_s']:.2f} s, {r['warm_s'] / lean:.2f}× the lean harness | ≤ 1.25× | {'met' if r['warm_s'] / lean <= 1.25 else 'not met'} |",
        f"| HumanEval 164, same worker, cold | {r['cold_s']:.2f} s, {r['cold_s'] / lean:.2f}× | | |",
        f"| HumanEval 164, lean fork-per-problem harness, 2 at a time, no isolation | {lean:.2f} s | baseline | |",
        f"| `python3 -c 'print(6*7)'` warm, request to exit | p50 {w['p50_ms']:.2f} ms, p99 {w['p99_ms']:.2f} ms (client round trip p50 {w['rtt_p50_ms']:.2f} ms) | p50 ≤ 3 ms | {'met' if w['p50_ms'] <= 3 else 'not met'} |",
        f"| the same, cold | p50 {c['p50_ms']:.2f} ms, p99 {c['p99_ms']:.2f} ms (round trip p50 {c['rtt_p50_ms']:.2f} ms) | | |",
        f"| CPU per warm Python job (whole tree) | {r['cpu_warm_ms']:.2f} ms, {r['cpu_warm_ms'] / r['cpu_true_ms']:.2f}× a `/bin/true` job | ≤ 2× | {'met' if r['cpu_warm_ms'] / r['cpu_true_ms'] <= 2 else 'not met'} |",
        f"| CPU per cold Python job | {r['cpu_cold_ms']:.2f} ms ({r['cpu_cold_ms'] - r['cpu_warm_ms']:.2f} ms saved per job warm) | | |",
        f"| CPU per `/bin/true` job, runtime on / off | {r['cpu_true_ms']:.2f} / {r['cpu_true_off_ms']:.2f} ms | | |",
        f"| `/bin/true` spawn (request to exec) p50, runtime on / off | {r['spawn_true_on_us']:.0f} / {r['spawn_true_off_us']:.0f} µs | | |",
        "",
        "| preload | modules in `sys.modules` | zygote warm-up | zygote RSS before → after "
        "| warm `print(6*7)`, request to exit p50 | CPU per warm `print` job |",
        "|---|---|---|---|---|---|",
    ]
    for p in r["preloads"]:
        if "warm_up_ms" not in p:
            lines.append(f"| {p['name']} | unavailable | | | | |")
            continue
        note = f" ({', '.join(p['failed'])} not installed)" if p["failed"] else ""
        lat = p.get("print_latency")
        lines.append(
            f"| {p['name']}{note} | {p['modules']} | {p['warm_up_ms']:.0f} ms | "
            f"{p['rss_before_kb'] / 1024:.1f} → {p['rss_after_kb'] / 1024:.1f} MiB | "
            + (f"{lat['p50_ms']:.2f} ms | {p['print_cpu_ms']:.2f} ms |" if lat else " | |")
        )
    if "numpy_warm" in r:
        nw, nc = r["numpy_warm"], r["numpy_cold"]
        lines += [
            "",
            f"A job that uses numpy (`{NUMPY_JOB[2]}`), through the node whose preload includes "
            f"it: request to exit p50 {nw['p50_ms']:.2f} ms warm against {nc['p50_ms']:.2f} ms cold "
            f"({nc['p50_ms'] / nw['p50_ms']:.1f}×).",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
