"""The Queue client against a real redis-server and a real `forkbox worker` (see conftest.py)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from collections import Counter
from typing import Any, Dict, List

import pytest

from conftest import SDK_DIR, humaneval_path
from forkbox import JobRejected, Queue, Timeout

pytestmark = pytest.mark.real


def test_submit_and_result(worker: str) -> None:
    q = Queue(worker)
    job_id = q.submit(cmd="python3 -c 'import math; print(math.factorial(20))'")
    res = q.result(job_id, timeout=60)
    assert res.id == job_id and res.status == "ok"
    assert res.stdout == "2432902008176640000\n"
    assert res.attempt == 1 and res.worker
    # The result stays readable: a second wait returns at once.
    assert q.result(job_id, timeout=1).stdout == res.stdout


def test_submit_a_job_object_with_bytes(worker: str) -> None:
    q = Queue(worker)
    job_id = q.submit({"argv": ["sh", "-c", "cat data.bin | od -An -tx1; cp data.bin out.bin"],
                       "files": {"data.bin": b"\xff\x00"}, "collect": ["out.bin"]})  # fmt: skip
    res = q.result(job_id, timeout=60)
    assert res.stdout.split() == ["ff", "00"]
    assert res.files == {"out.bin": b"\xff\x00"}


def test_result_timeout(worker: str) -> None:
    q = Queue(worker)
    t0 = time.monotonic()
    with pytest.raises(Timeout):
        q.result("no-such-job-" + str(time.time()), timeout=0.5)
    assert time.monotonic() - t0 < 3


def test_rejected_job_through_the_queue(worker: str) -> None:
    q = Queue(worker)
    # Out-of-range limits are refused by submit itself (test_queue_enqueue.py); a file whose
    # directory is also a file is left to the worker.
    job_id = q.submit({"cmd": "true", "files": {"a": "x", "a/b": "y"}})
    with pytest.raises(JobRejected) as e:
        q.result(job_id, timeout=60)
    assert "files.a/b" in e.value.reason


def test_map_keeps_concurrency_and_yields_all(worker: str) -> None:
    q = Queue(worker)
    jobs = [{"id": f"map-{time.time_ns()}-{i}", "cmd": f"echo {i}; exit {1 if i % 3 == 0 else 0}"} for i in range(20)]
    want = {j["id"]: i for i, j in enumerate(jobs)}
    seen: Dict[str, Any] = {}
    for res in q.map(iter(jobs), concurrency=4, progress=True, timeout=60):
        seen[res.id] = res
    assert set(seen) == set(want)
    for job_id, i in want.items():
        assert seen[job_id].stdout == f"{i}\n"
        assert seen[job_id].status == ("failed" if i % 3 == 0 else "ok")


def test_batch_wait_and_summary(worker: str) -> None:
    q = Queue(worker)
    b = q.batch(["true"] * 7 + ["exit 1"] * 3)
    assert len(b) == 10
    summary = b.wait(timeout=60)
    assert summary == {"ok": 7, "failed": 3}
    assert b.summary() == summary
    counts = b.counts()
    assert counts["total"] == 10 and counts["done"] == 10
    statuses = Counter(r.status for r in b.results(timeout=5))
    assert statuses == Counter({"ok": 7, "failed": 3})


def test_cancel_a_running_job(worker: str) -> None:
    q = Queue(worker)
    job_id = q.submit(cmd="sleep 30", timeout_ms=60_000)
    time.sleep(1.0)  # let a worker start it
    q.cancel(job_id)
    res = q.result(job_id, timeout=20)
    assert res.status == "cancelled", res
    assert res.duration_ms < 20_000


def load_humaneval() -> List[Dict[str, Any]]:
    with gzip.open(humaneval_path(), "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def test_humaneval_164_pass(worker: str) -> None:
    problems = load_humaneval()
    assert len(problems) == 164
    q = Queue(worker)
    run_tag = f"he-{time.time_ns()}"
    jobs = []
    task_of: Dict[str, str] = {}
    for p in problems:
        program = p["prompt"] + p["canonical_solution"] + "\n" + p["test"] + "\n" + f"check({p['entry_point']})\n"
        job_id = f"{run_tag}-{p['task_id'].replace('/', '-')}"
        task_of[job_id] = p["task_id"]
        jobs.append({"id": job_id, "argv": ["python3", "main.py"], "files": {"main.py": program}, "timeout_ms": 30_000})
    results = list(q.map(jobs, concurrency=32, timeout=120))
    assert len(results) == 164
    failed = [(task_of[r.id], r.status, r.exit_code, r.stderr[-500:]) for r in results if r.status != "ok"]
    passed = 164 - len(failed)
    print(f"HumanEval through the queue: {passed} passed, {len(failed)} failed")
    assert not failed, failed[:5]
    assert passed == 164


def test_queue_example_runs(worker: str) -> None:
    env = dict(os.environ, FORKBOX_REDIS_URL=worker)
    out = subprocess.run(
        [sys.executable, str(SDK_DIR / "examples" / "queue_batch_eval.py")],
        env=env, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "'ok': 50" in out.stdout and "'failed': 1" in out.stdout, out.stdout
