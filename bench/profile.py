#!/usr/bin/env python3
"""Where a queue job's CPU time goes: reads `perf script -F comm,pid,tid,period,ip,sym` of a
machine-wide `perf record -a -g` taken around one forkbox throughput run, and prints JSON with
the CPU time per job of each process role and the sandbox processes' costliest kernel entries.

Roles, decided per process from the process tree (`--show-task-events`):
  program      the job's own program after exec (its comm is the program's name);
  sandbox      each sandbox's init and launcher, forked from the zygote: set-up, exec,
               reaping, tear-down;
  zygote       the engine's zygote (an exec'd `forkbox` whose parent is a `forkbox`);
  node         the worker node, or the bench process hosting an engine;
  loadgen      the load generator;
  redis        redis-server;
  kernel       kernel threads (RCU, softirq, workqueues) working for all of the above;
  idle         no task running; other: anything else on the machine.

Usage: perf script --show-task-events -F comm,pid,tid,period,ip,sym | profile.py --jobs N --program true
"""

import argparse
import collections
import json
import re
import sys

KERNEL_THREADS = re.compile(r"^(kworker|ksoftirqd|rcu_|kdamond|migration|kcompactd|khugepaged|kswapd|cpuhp)")
SYSCALL = re.compile(r"^(__x64_sys_|__do_sys_|__sys_|ksys_)(\w+)")


FORK = re.compile(r"PERF_RECORD_FORK\((\d+):(\d+)\):\((\d+):(\d+)\)")
EXEC = re.compile(r"PERF_RECORD_COMM exec: (.*):(\d+)/(\d+)")


class Trace:
    """Samples (comm, pid, period_ns, frames innermost first) and the process tree."""

    def __init__(self, lines):
        self.samples, self.parent, self.exec_comm = [], {}, {}
        head, frames = None, []
        for line in lines:
            if not line.strip():
                if head:
                    self.samples.append((*head, frames))
                head, frames = None, []
            elif line[0] in " \t":
                parts = line.strip().split(None, 1)
                if head and len(parts) == 2:
                    frames.append(parts[1].split(" (")[0])
            elif (m := FORK.search(line)):
                child, tid, parent = int(m.group(1)), int(m.group(2)), int(m.group(3))
                if child == tid and child != parent:
                    self.parent[child] = parent
            elif (m := EXEC.search(line)):
                self.exec_comm[int(m.group(2))] = m.group(1)
            else:
                parts = line.split()
                if len(parts) >= 3 and "/" in parts[-2] and parts[-1].isdigit():
                    pid = int(parts[-2].split("/", 1)[0])
                    head = (" ".join(parts[:-2]), pid, int(parts[-1]))
        if head:
            self.samples.append((*head, frames))

    def is_zygote(self, pid):
        return (self.exec_comm.get(pid) == "forkbox"
                and self.exec_comm.get(self.parent.get(pid)) == "forkbox")

    def role_of_process(self, pid):
        if self.exec_comm.get(pid) == "forkbox-loadgen":
            return "loadgen"
        if self.is_zygote(pid):
            return "zygote"
        if self.exec_comm.get(pid) == "forkbox":
            return "node"
        seen, p = set(), self.parent.get(pid)
        while p and p not in seen:
            if self.is_zygote(p):
                return "sandbox"
            seen.add(p)
            p = self.parent.get(p)
        return None


FAULT_KINDS = (
    ("copy-on-write", {"do_wp_page", "wp_page_copy", "do_huge_pmd_wp_page"}),
    ("file", {"filemap_map_pages", "filemap_fault", "do_read_fault", "do_cow_fault",
              "do_shared_fault"}),
    ("new memory", {"do_anonymous_page", "do_huge_pmd_anonymous_page"}),
)


def fault_kind(frames):
    """What a page fault's sample was doing: the innermost frame naming a kind decides."""
    for f in frames:
        for kind, names in FAULT_KINDS:
            if f in names:
                return kind
    return "other"


def kernel_entry(frames):
    """The outermost syscall of a kernel stack, 'page fault', or None for user time."""
    entry = None
    for f in frames:
        m = SYSCALL.match(f)
        if m:
            entry = m.group(2)
    if entry:
        return entry
    if any(f == "exc_page_fault" for f in frames):
        return "page fault"
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, required=True, help="jobs completed during the recording")
    p.add_argument("--program", default="true", help="comm of the job's program after exec")
    a = p.parse_args()

    trace = Trace(sys.stdin)
    roles = {}
    per_role = collections.Counter()
    sandbox_entries = collections.Counter()
    zygote_entries = collections.Counter()
    sandbox_faults = collections.Counter()
    total = 0
    for comm, pid, period, frames in trace.samples:
        total += period
        if pid not in roles:
            roles[pid] = trace.role_of_process(pid)
        if pid == 0 or comm == "swapper":
            role = "idle"
        elif comm == a.program:
            role = "program"
        elif comm == "redis-server":
            role = "redis"
        elif roles[pid]:
            role = roles[pid]
        elif KERNEL_THREADS.match(comm):
            role = "kernel"
        else:
            role = "other"
        per_role[role] += period
        if role in ("sandbox", "zygote"):
            entry = kernel_entry(frames) or "user space"
            (sandbox_entries if role == "sandbox" else zygote_entries)[entry] += period
            if role == "sandbox" and entry == "page fault":
                sandbox_faults[fault_kind(frames)] += period

    def us(ns):
        return round(ns / 1e3 / a.jobs, 1)

    print(json.dumps({
        "jobs": a.jobs,
        "samples": len(trace.samples),
        "cpu_s": round(total / 1e9, 3),
        "us_per_job": {r: us(v) for r, v in per_role.most_common()},
        "sandbox_us_per_job": {e: us(v) for e, v in sandbox_entries.most_common(10)},
        "sandbox_page_faults_us_per_job": {k: us(v) for k, v in sandbox_faults.most_common()},
        "zygote_us_per_job": {e: us(v) for e, v in zygote_entries.most_common(10)},
    }, indent=1))


if __name__ == "__main__":
    main()
