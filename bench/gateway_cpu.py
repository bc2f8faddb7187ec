#!/usr/bin/env python3
"""The HTTP gateway's cost per request, two or more gateway builds side by side.

Starts a redis-server of its own on a Unix socket (no persistence, never the one on 6379),
one `forkbox worker --slots 2` (the first build's) and one `forkbox gateway --threads 1` per
build given, all on one queue; then, for each round, runs `forkbox-loadgen --gateway URL
--gateway-pid PID` against each gateway in turn (the order rotating from round to round, so a
noisy machine hits them alike). Each loadgen run itself alternates the direct arm (enqueue on
Redis, wait for the result) and the gateway arm (SandboxFusion's `POST /run_code`) in four
rounds, and prints the gateway's CPU per request (its `/proc/<pid>/stat` user + system time
over its rounds), its p50 against the direct arm's and its throughput against direct.

Prints every loadgen table and, per build, the CPU per request of each round and their mean.

    bench/gateway_cpu.py --build before=/tmp/forkbox-before --build after=target/release/forkbox \
        --rounds 3 --jobs 800 --concurrency 2

Needs: redis-server and redis-cli; the builds' `forkbox` binaries; `forkbox-loadgen`
(`--loadgen`, else target/release/forkbox-loadgen).
"""

import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

QUEUE = "gwcpu"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what, check, seconds=30):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up within {seconds} s")


def parse_table(text):
    """The figures of one loadgen gateway table."""
    out = {}
    for arm in ("direct", "gateway"):
        m = re.search(rf"^{arm}\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", text, re.M)
        if m:
            out[arm] = {"p50_ms": float(m.group(2)), "p99_ms": float(m.group(3)),
                        "jobs_s": float(m.group(4))}
    m = re.search(r"gateway CPU per request: (\d+) µs", text)
    if m:
        out["cpu_us"] = int(m.group(1))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", action="append", required=True, metavar="NAME=PATH",
                   help="a gateway build: a name and its forkbox binary (the first one's worker serves)")
    p.add_argument("--loadgen", default="target/release/forkbox-loadgen")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--jobs", type=int, default=800)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--hold", metavar="FILE",
                   help="print the gateways' pids and URLs and wait for FILE to exist before "
                        "measuring (to attach a profiler)")
    a = p.parse_args()
    builds = []
    for b in a.build:
        name, _, path = b.partition("=")
        if not path or not os.access(path, os.X_OK):
            p.error(f"--build {b}: NAME=PATH to an executable forkbox")
        builds.append((name, os.path.abspath(path)))

    work = tempfile.mkdtemp(prefix="gateway-cpu-")
    sock = os.path.join(work, "redis.sock")
    procs = []

    def spawn(cmd, log):
        proc = subprocess.Popen(cmd, stdout=open(os.path.join(work, log), "ab"),
                                stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    try:
        spawn(["redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
               "--save", "", "--appendonly", "no", "--dir", work], "redis.log")
        wait_for("redis-server", lambda: subprocess.run(
            ["redis-cli", "-s", sock, "ping"], capture_output=True, text=True).stdout.strip() == "PONG")
        redis = f"redis+unix://{sock}"
        spawn([builds[0][1], "worker", "--redis", redis, "--queues", QUEUE, "--slots", "2"],
              "worker.log")
        gateways = []
        for name, path in builds:
            port = free_port()
            gw = spawn([path, "gateway", "--redis", redis, "--queue", QUEUE,
                        "--listen", f"127.0.0.1:{port}"], f"gateway-{name}.log")

            def up(port=port):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                        s.sendall(b"GET /v1/ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                        return b"pong" in s.recv(4096)
                except OSError:
                    return False
            wait_for(f"gateway {name}", up)
            # Offering python: the worker has published its runtimes and the gateway read them.
            wait_for(f"gateway {name} offering python", lambda port=port: b"python" in
                     subprocess.run(["curl", "-s", f"http://127.0.0.1:{port}/api/v2/runtimes"],
                                    capture_output=True).stdout, seconds=60)
            gateways.append((name, gw.pid, f"http://127.0.0.1:{port}"))
        if a.hold:
            for name, pid, url in gateways:
                print(f"{name}: pid {pid} {url}", flush=True)
            while not os.path.exists(a.hold):
                time.sleep(0.2)
        cpu = {name: [] for name, _, _ in gateways}
        for r in range(a.rounds):
            order = gateways[r % len(gateways):] + gateways[:r % len(gateways)]
            for name, pid, url in order:
                load = open("/proc/loadavg").read().split()[0]
                out = subprocess.run(
                    [a.loadgen, "--redis", redis, "--queue", QUEUE, "--gateway", url,
                     "--gateway-pid", str(pid), "--jobs", str(a.jobs),
                     "--concurrency", str(a.concurrency)],
                    capture_output=True, text=True)
                if out.returncode != 0:
                    raise RuntimeError(f"loadgen against {name}: {out.stderr.strip()}")
                fig = parse_table(out.stdout)
                cpu[name].append(fig.get("cpu_us"))
                print(f"--- round {r + 1}, {name} (load {load})\n{out.stdout}", flush=True)
        print("gateway CPU per request (µs), by round, and the mean:")
        for name, vals in cpu.items():
            known = [v for v in vals if v is not None]
            mean = f"{sum(known) / len(known):.0f}" if known else "-"
            shown = " ".join(f"{'-' if v is None else v:>5}" for v in vals)
            print(f"  {name:<12} {shown}   mean {mean}")
    finally:
        for proc in reversed(procs):
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        for proc in reversed(procs):
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
