"""RQ throughput: N jobs of subprocess.run(["/bin/true"]) through W workers on one Redis.

The jobs are enqueued first, then W burst-mode workers drain the queue. Throughput is N over
the time from the first job's start to the last job's end, as each job recorded it, so worker
start-up (Python imports) is not charged to RQ.
"""

import argparse
import json
import os
import subprocess
import sys
import time

from redis import Redis
from rq import Queue

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tasks  # noqa: E402


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--redis", required=True)
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--worker-class", default="rq.worker.Worker")
    a = p.parse_args()
    conn = Redis.from_url(a.redis)
    qname = "bench-" + a.worker_class.rsplit(".", 1)[-1].lower()
    q = Queue(qname, connection=conn)
    q.empty()
    jobs = [q.enqueue(tasks.run_true, result_ttl=3600) for _ in range(a.jobs)]
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.abspath(__file__)))
    rq_bin = os.path.join(os.path.dirname(sys.executable), "rq")
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [rq_bin, "worker", "--burst", "--url", a.redis, "-w", a.worker_class, qname],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(a.workers)
    ]
    for pr in procs:
        pr.wait()
    wall = time.time() - t0
    spans, failed = [], 0
    for j in jobs:
        j.refresh()
        r = j.return_value()
        if r is None:
            failed += 1
        else:
            spans.append(r)
    first = min(s for s, _ in spans)
    last = max(e for _, e in spans)
    print(json.dumps({
        "system": "rq",
        "worker_class": a.worker_class,
        "workers": a.workers,
        "jobs": a.jobs,
        "completed": len(spans),
        "failed": failed,
        "seconds": last - first,
        "wall_seconds_with_startup": wall,
        "jobs_per_s": len(spans) / (last - first),
    }))


if __name__ == "__main__":
    main()
