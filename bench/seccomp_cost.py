#!/usr/bin/env python3
"""The seccomp policy's cost: two forkbox builds side by side in one run, as ratios.

Usage: bench/seccomp_cost.py BASELINE_FORKBOX CANDIDATE_FORKBOX [--rounds N]

Each build is its `forkbox` binary with the `forkbox-bench` of the same build beside it
(`cargo build --release -p forkbox -p forkbox-bench` puts both in target/release/).

Per system call: a C program run in a sandbox of each build times a few calls in a loop
(nanoseconds per call, the fastest of 11 interleaved runs: on a shared machine the fastest
run is the one least disturbed by other load): `getpid`, which the kernel decides from its
cache of calls a filter always allows; `fcntl(F_GETFD)` and `mmap`+`munmap`, which run the
filter because of their argument rules; and a number no kernel has, which the filter refuses.
The same program on the host, with no filter, is the floor. Per sandbox: `forkbox-bench spawn
--json` of each build, alternated `--rounds` times. Each figure is printed with its ratio
candidate / baseline; nothing is compared with another run.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

PROGRAM = r"""
#include <fcntl.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}
int main(void) {
    const long n = 100000;
    double t0 = now();
    for (long i = 0; i < n; i++) syscall(SYS_getpid);
    double t1 = now();
    for (long i = 0; i < n; i++) fcntl(0, F_GETFD);
    double t2 = now();
    for (long i = 0; i < n / 4; i++) munmap(mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0), 4096);
    double t3 = now();
    for (long i = 0; i < n; i++) syscall(600);
    double t4 = now();
    printf("{\"getpid\": %.1f, \"fcntl\": %.1f, \"mmap+munmap\": %.1f, \"unknown\": %.1f}\n",
           (t1 - t0) / n, (t2 - t1) / n, (t3 - t2) / (n / 4), (t4 - t3) / n);
    return 0;
}
"""


def run_program(forkbox, binary):
    """ns per call of each kind, in a sandbox of `forkbox` (or on the host when None)."""
    if forkbox is None:
        out = subprocess.run([binary], capture_output=True, text=True, check=True).stdout
        return json.loads(out)
    out = subprocess.run(
        [forkbox, "run", "--json", "--file", f"cost={binary}", "-c", "chmod +x cost && ./cost"],
        capture_output=True, text=True, check=True,
    ).stdout
    result = json.loads(out)
    if result["status"] != "ok":
        sys.exit(f"{forkbox}: {result}")
    return json.loads(result["stdout"])


def fastest_of(runs):
    return {k: min(r[k] for r in runs) for k in runs[0]}


def bench_beside(forkbox):
    """The `forkbox-bench` of the same build as `forkbox`: the one in its directory."""
    bench = os.path.join(os.path.dirname(os.path.abspath(forkbox)), "forkbox-bench")
    if not os.access(bench, os.X_OK):
        sys.exit(f"no forkbox-bench beside {forkbox} (cargo build --release -p forkbox-bench)")
    return bench


def spawn(bench):
    out = subprocess.run(
        [bench, "spawn", "--json", "--iterations", "200", "--overshoot-runs", "1"],
        capture_output=True, text=True, check=True,
    ).stdout
    return json.loads(out)


def main():
    args = sys.argv[1:]
    rounds = 3
    if "--rounds" in args:
        i = args.index("--rounds")
        rounds = int(args[i + 1])
        del args[i : i + 2]
    if len(args) != 2:
        sys.exit(__doc__)
    baseline, candidate = args
    benches = {"baseline": bench_beside(baseline), "candidate": bench_beside(candidate)}
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        src, binary = os.path.join(d, "cost.c"), os.path.join(d, "cost")
        with open(src, "w") as f:
            f.write(PROGRAM)
        subprocess.run(["gcc", "-O2", "-o", binary, src], check=True)
        runs = {"host": [], "baseline": [], "candidate": []}
        for _ in range(11):
            runs["host"].append(run_program(None, binary))
            runs["baseline"].append(run_program(baseline, binary))
            runs["candidate"].append(run_program(candidate, binary))
    calls = {k: fastest_of(v) for k, v in runs.items()}
    print("per call, ns (fastest of 11)  host  baseline  candidate  candidate/baseline")
    for call in calls["host"]:
        h, b, c = (calls[k][call] for k in ("host", "baseline", "candidate"))
        print(f"  {call:<26} {h:6.1f}  {b:8.1f}  {c:9.1f}  {c / b:6.2f}")
    spawns = {"baseline": [], "candidate": []}
    for _ in range(rounds):
        spawns["baseline"].append(spawn(benches["baseline"]))
        spawns["candidate"].append(spawn(benches["candidate"]))
    print(f"per sandbox ({rounds} alternated rounds of `forkbox-bench spawn`):")
    print(f"  {'':<34} {'baseline':>10} {'candidate':>10}  candidate/baseline")
    for key in SPAWN_FIGURES:
        b = statistics.median(dig(s, key) for s in spawns["baseline"])
        c = statistics.median(dig(s, key) for s in spawns["candidate"])
        print(f"  {key:<34} {b:10.1f} {c:10.1f}  {c / b:6.2f}")


# The figures of `forkbox-bench spawn --json` that are the sandbox's own.
SPAWN_FIGURES = [
    "forkbox.p50_us",
    "forkbox.mean_us",
    "forkbox_spawn_us.p50_us",
    "forkbox_per_s",
    "forkbox_cpu.tree_us",
]


def dig(report, key):
    for k in key.split("."):
        report = report[k]
    return report


if __name__ == "__main__":
    main()
