"""Round trip of `Forkbox.run(...)` through the daemon vs `subprocess.run` of the same command
without a sandbox, measured in the same run (interleaved, so drift hits both alike).

    python sdk/python/bench_roundtrip.py [--socket PATH | --start-daemon] [-n 300] [--json]

--start-daemon runs its own `forkbox daemon` on a temporary socket ($FORKBOX_BIN, else the
repository's target/release or target/debug binary) and stops it at the end.

Both sides run the command the same way: `/bin/sh -c CMD`, with the sandbox's clean environment
(PATH, HOME, LANG), so `python3` resolves to the same interpreter on both sides.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from forkbox import Forkbox

COMMANDS = {
    "/bin/true": "/bin/true",
    "factorial": "python3 -c 'import math; print(math.factorial(20))'",
}


# The environment a job starts with (docs/protocol.md), given to the bare side too.
CLEAN_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": tempfile.gettempdir(),
    "LANG": "C.UTF-8",
}


def percentile(xs: List[float], q: float) -> float:
    s = sorted(xs)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def measure(fb: Forkbox, cmd: str, n: int, warmup: int) -> Dict[str, List[float]]:
    sandbox: List[float] = []
    bare: List[float] = []
    expected = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, env=CLEAN_ENV).stdout
    for i in range(warmup + n):
        t0 = time.perf_counter()
        res = fb.run(cmd)
        t1 = time.perf_counter()
        out = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, env=CLEAN_ENV)
        t2 = time.perf_counter()
        if res.status != "ok" or res.stdout != expected or out.returncode != 0:
            raise SystemExit(f"{cmd!r}: unexpected result {res!r} / {out!r}")
        if i >= warmup:
            sandbox.append((t1 - t0) * 1000)
            bare.append((t2 - t1) * 1000)
    return {"forkbox": sandbox, "subprocess": bare}


@contextlib.contextmanager
def own_daemon(slots: int) -> Iterator[str]:
    root = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("FORKBOX_BIN", ""), str(root / "target/release/forkbox"), str(root / "target/debug/forkbox")]
    binary = next((str(c) for c in candidates if c and os.access(c, os.X_OK)), None)
    if binary is None:
        raise SystemExit("no forkbox binary: build it with `cargo build --release -p forkbox` or set FORKBOX_BIN")
    d = tempfile.mkdtemp(prefix="fbb-", dir="/tmp")
    sock = os.path.join(d, "fb.sock")
    proc = subprocess.Popen(
        [binary, "daemon", "--socket", sock, "--slots", str(slots)], stderr=subprocess.DEVNULL
    )
    try:
        end = time.monotonic() + 30
        while not os.path.exists(sock):
            if proc.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"{binary} daemon did not start")
            time.sleep(0.02)
        print(f"daemon: {binary} daemon --socket {sock} --slots {slots}", file=sys.stderr)
        yield sock
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", help="daemon socket (default: $FORKBOX_SOCKET or the standard path)")
    ap.add_argument("-n", type=int, default=300, help="measured iterations per command (default 300)")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--json", action="store_true", help="print the numbers as JSON")
    ap.add_argument("--start-daemon", action="store_true", help="start a daemon of our own for the run")
    args = ap.parse_args()
    with contextlib.ExitStack() as stack:
        socket_path: Optional[str] = args.socket
        if args.start_daemon:
            socket_path = stack.enter_context(own_daemon(slots=2))
        run(Forkbox(socket=socket_path) if socket_path else Forkbox.default(), args)


def run(fb: Forkbox, args: argparse.Namespace) -> None:
    report: Dict[str, object] = {"host": platform.node(), "python": sys.version.split()[0], "n": args.n}
    rows: Dict[str, Dict[str, object]] = {}
    report["commands"] = rows
    for name, cmd in COMMANDS.items():
        samples = measure(fb, cmd, args.n, args.warmup)
        row: Dict[str, object] = {}
        for side, xs in samples.items():
            row[side] = {
                "p50_ms": percentile(xs, 0.50),
                "p99_ms": percentile(xs, 0.99),
                "mean_ms": statistics.fmean(xs),
            }
        fbx, bare = row["forkbox"], row["subprocess"]
        assert isinstance(fbx, dict) and isinstance(bare, dict)
        row["added_p50_ms"] = fbx["p50_ms"] - bare["p50_ms"]
        row["added_p99_ms"] = fbx["p99_ms"] - bare["p99_ms"]
        rows[name] = row

    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"round trip, {args.n} runs each (after {args.warmup} warm-up), milliseconds")
    print(f"{'command':<12} {'side':<22} {'p50':>8} {'p99':>8} {'mean':>8}")
    for name, row in rows.items():
        for side, label in (("forkbox", "Forkbox.run (daemon)"), ("subprocess", "subprocess.run (bare)")):
            r = row[side]
            assert isinstance(r, dict)
            print(f"{name:<12} {label:<22} {r['p50_ms']:8.3f} {r['p99_ms']:8.3f} {r['mean_ms']:8.3f}")
        print(f"{name:<12} {'difference':<22} {row['added_p50_ms']:+8.3f} {row['added_p99_ms']:+8.3f}")


if __name__ == "__main__":
    main()
