"""Best of n: one session holds a failing test's state; four branches of it each try a
different fix, and the branch whose fix passes the most cases is kept.

The parent session builds the test's cases once (in memory, as an expensive fixture would
be) and writes the buggy module to its disk. `fork(4)` copies both into four new sessions;
each writes its own fix over the module and scores it against the cases it inherited, without
building them again. The parent still has the bug: a branch's changes are its own.

Run against a worker: FORKBOX_REDIS_URL=redis://... python session_best_of_n.py
"""

from __future__ import annotations

import os
import sys

from forkbox import Queue, Session

BUGGY = """
def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]
"""

FIXES = {
    "average the middle two": """
def median(xs):
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
""",
    "forget to sort": """
def median(xs):
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2
""",
    "the mean instead": """
def median(xs):
    return sum(xs) / len(xs)
""",
    "the lower middle": """
def median(xs):
    xs = sorted(xs)
    return xs[(len(xs) - 1) // 2]
""",
}

# The test: 199 cases built once in the parent (the branches inherit them), and a score that
# loads the module from the session's disk as it is now.
SETUP = """
import random
rng = random.Random(7)
cases = []
for n in range(1, 200):
    xs = [rng.randint(-1000, 1000) for _ in range(n)]
    s = sorted(xs)
    cases.append((xs, s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2))

def score():
    ns = {}
    exec(open("mathx.py").read(), ns)
    return sum(ns["median"](list(xs)) == want for xs, want in cases)
"""


def main() -> int:
    q = Queue(os.environ.get("FORKBOX_REDIS_URL"))
    with Session(q, runtime="python", ttl_s=300) as parent:
        parent.files.write("mathx.py", BUGGY)
        parent.run_code(SETUP)
        total = int(parent.run_code("len(cases)").text or 0)
        print(f"before: {parent.run_code('score()').text}/{total} cases pass")
        kids = parent.fork(len(FIXES))
        tried = []
        for kid, (name, fix) in zip(kids, FIXES.items()):
            kid.files.write("mathx.py", fix)
            tried.append((int(kid.run_code("score()").text or 0), name, kid))
            print(f"  {name}: {tried[-1][0]}/{total}")
        tried.sort(key=lambda t: -t[0])
        best, name, keep = tried[0]
        for _, _, kid in tried[1:]:
            kid.kill()
        print(f"kept: {name} ({best}/{total}) in session {keep.id}")
        # The parent never saw any fix.
        print(f"parent still: {parent.run_code('score()').text}/{total}")
        keep.kill()
    return 0 if best == total else 1


if __name__ == "__main__":
    sys.exit(main())
