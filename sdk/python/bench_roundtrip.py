"""Round trip of `Forkbox.run(...)` through the daemon vs `subprocess.run` of the same command
without a sandbox, measured in the same run (interleaved, so drift hits both alike).

    python sdk/python/bench_roundtrip.py [--socket PATH] [-n 300] [--json]

Both sides run the command the same way: `/bin/sh -c CMD`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from typing import Dict, List

from forkbox import Forkbox

COMMANDS = {
    "/bin/true": "/bin/true",
    "factorial": "python3 -c 'import math; print(math.factorial(20))'",
}


def percentile(xs: List[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def measure(fb: Forkbox, cmd: str, n: int, warmup: int) -> Dict[str, List[float]]:
    sandbox: List[float] = []
    bare: List[float] = []
    expected = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True).stdout
    for i in range(warmup + n):
        t0 = time.perf_counter()
        res = fb.run(cmd)
        t1 = time.perf_counter()
        out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True)
        t2 = time.perf_counter()
        if res.status != "ok" or res.stdout != expected or out.returncode != 0:
            raise SystemExit(f"{cmd!r}: unexpected result {res!r} / {out!r}")
        if i >= warmup:
            sandbox.append((t1 - t0) * 1000)
            bare.append((t2 - t1) * 1000)
    return {"forkbox": sandbox, "subprocess": bare}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", help="daemon socket (default: $FORKBOX_SOCKET or the standard path)")
    ap.add_argument("-n", type=int, default=300, help="measured iterations per command (default 300)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    args = ap.parse_args()

    fb = Forkbox(socket=args.socket) if args.socket else Forkbox.default()
    report = {"host": platform.node(), "python": sys.version.split()[0], "n": args.n, "commands": {}}
    for name, cmd in COMMANDS.items():
        samples = measure(fb, cmd, args.n, args.warmup)
        row = {}
        for side, xs in samples.items():
            row[side] = {
                "p50_ms": percentile(xs, 0.50),
                "p99_ms": percentile(xs, 0.99),
                "mean_ms": statistics.fmean(xs),
            }
        row["added_p50_ms"] = row["forkbox"]["p50_ms"] - row["subprocess"]["p50_ms"]
        row["added_p99_ms"] = row["forkbox"]["p99_ms"] - row["subprocess"]["p99_ms"]
        report["commands"][name] = row

    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"round trip, {args.n} runs each (after {args.warmup} warm-up), milliseconds")
    print(f"{'command':<12} {'side':<22} {'p50':>8} {'p99':>8} {'mean':>8}")
    for name, row in report["commands"].items():
        for side, label in (("forkbox", "Forkbox.run (daemon)"), ("subprocess", "subprocess.run (bare)")):
            r = row[side]
            print(f"{name:<12} {label:<22} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['mean_ms']:8.3f}")
        print(f"{name:<12} {'difference':<22} {row['added_p50_ms']:+8.3f} {row['added_p99_ms']:+8.3f}")


if __name__ == "__main__":
    main()
