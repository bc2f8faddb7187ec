"""Batch evaluation on the cluster: submit many programs to the Redis queue, collect results.

Needs Redis and at least one `forkbox worker`; set FORKBOX_REDIS_URL (default redis://127.0.0.1:6379).
"""

from __future__ import annotations

import os
from collections import Counter

from forkbox import Queue


def main() -> None:
    q = Queue()  # $FORKBOX_REDIS_URL, else redis://127.0.0.1:6379
    programs = {f"sq-{n}": f"assert {n} * {n} == {n * n}; print({n} ** 2)" for n in range(50)}
    programs["sq-wrong"] = "assert 2 * 2 == 5"
    jobs = [{"id": f"{key}-{os.getpid()}", "argv": ["python3", "-c", src], "timeout_ms": 5000} for key, src in programs.items()]

    # Results arrive as they finish, with at most 16 jobs queued or running at a time.
    statuses = Counter(res.status for res in q.map(jobs, concurrency=16, progress=True))
    print(dict(statuses))

    # The same as a batch: counters live in Redis, so any process can watch it.
    batch = q.batch([dict(j, id=j["id"] + "-b") for j in jobs[:10]])
    print(batch.wait(timeout=120))


if __name__ == "__main__":
    main()
