"""Celery prefork throughput: N tasks of subprocess.run(["/bin/true"]) through a prefork pool of
W processes on one Redis (broker and result backend). Measured like rq_bench.py: tasks are
sent first, then the worker starts; throughput is N over first start to last end. With
--task noop the task does nothing (bench/redis_cost.py, which measures Redis' side only).
The client reads every result with AsyncResult.get."""

import argparse
import json
import os
import subprocess
import sys
import time

from celery import Celery

app = Celery("celery_bench")


@app.task(name="run_true")
def run_true():
    start = time.time()
    subprocess.run(["/bin/true"], check=True)
    return (start, time.time())


@app.task(name="noop")
def noop():
    now = time.time()
    return (now, now)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--redis", required=True)
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--task", choices=["run_true", "noop"], default="run_true")
    a = p.parse_args()
    task = run_true if a.task == "run_true" else noop
    os.environ["CELERY_BROKER_URL"] = a.redis
    app.conf.update(broker_url=a.redis, result_backend=a.redis, worker_prefetch_multiplier=4,
                    task_acks_late=False, broker_connection_retry_on_startup=True)
    app.control.purge()
    results = [task.delay() for _ in range(a.jobs)]
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ, PYTHONPATH=here, CELERY_BENCH_REDIS=a.redis)
    t0 = time.time()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "celery_bench", "worker", "--pool", "prefork",
         "-c", str(a.workers), "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
         "--without-heartbeat"],
        cwd=here, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spans, failed = [], 0
    try:
        for r in results:
            try:
                spans.append(r.get(timeout=300))
            except Exception:
                failed += 1
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    wall = time.time() - t0
    first = min(s for s, _ in spans)
    last = max(e for _, e in spans)
    print(json.dumps({
        "system": "celery",
        "pool": "prefork",
        "task": a.task,
        "workers": a.workers,
        "jobs": a.jobs,
        "completed": len(spans),
        "failed": failed,
        "seconds": last - first,
        "wall_seconds_with_startup": wall,
        "jobs_per_s": len(spans) / (last - first),
    }))


if os.environ.get("CELERY_BENCH_REDIS"):
    app.conf.update(broker_url=os.environ["CELERY_BENCH_REDIS"],
                    result_backend=os.environ["CELERY_BENCH_REDIS"],
                    broker_connection_retry_on_startup=True)

if __name__ == "__main__":
    main()
