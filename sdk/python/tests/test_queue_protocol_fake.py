"""Protocol-level tests of the Queue client: a real redis-server, a fake worker
(tests/fake_worker.py) that follows the key layout but runs nothing. The real worker is tested
in test_queue.py.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Dict, Iterator

import pytest
import redis

from fake_worker import FakeWorker
from forkbox import JobRejected, Queue, Timeout


@pytest.fixture
def fake_worker(redis_url: str) -> Iterator[FakeWorker]:
    # A queue of its own: a real worker on the same Redis serves only `default`.
    w = FakeWorker(redis_url, queue=f"fake-{uuid.uuid4().hex[:8]}", slots=4)
    yield w
    w.close()


def test_submit_writes_the_documented_entry(redis_url: str, fake_worker: FakeWorker) -> None:
    q = Queue(redis_url, fake_worker.queue)
    job_id = q.submit(cmd="hello", timeout_ms=500, memory_mb=64, files={"a.bin": b"\xff"})
    res = q.result(job_id, timeout=10)
    assert res.stdout == "hello\n" and res.id == job_id
    r = redis.Redis.from_url(redis_url)
    # The waiter only read; the result stays.
    assert r.exists(f"forkbox:{{{fake_worker.queue}}}:result:{job_id}") == 1
    with pytest.raises(ValueError, match="queue name"):
        Queue(redis_url, queue="a:b")


def test_result_survives_a_stolen_wakeup(redis_url: str, fake_worker: FakeWorker) -> None:
    q = Queue(redis_url, fake_worker.queue, block_s=0.2)
    job_id = q.submit(cmd="sleep:0.3")
    thief = redis.Redis.from_url(redis_url)
    t = threading.Thread(target=lambda: thief.blpop([f"forkbox:{{{fake_worker.queue}}}:done:{job_id}"], timeout=5))
    t.start()
    time.sleep(0.05)  # the thief waits first, so it gets the wake-up
    assert q.result(job_id, timeout=5).status == "ok"
    t.join()


def test_result_timeout_and_rejection(redis_url: str, fake_worker: FakeWorker) -> None:
    q = Queue(redis_url, fake_worker.queue)
    with pytest.raises(Timeout):
        q.result("never-submitted", timeout=0.3)
    with pytest.raises(JobRejected, match="fake worker"):
        q.result(q.submit("reject"), timeout=10)


def test_map_bounds_unfinished_jobs(redis_url: str, fake_worker: FakeWorker) -> None:
    q = Queue(redis_url, fake_worker.queue)
    jobs = [{"id": f"m{i}", "cmd": "sleep:0.05" if i % 2 else f"echo-{i}"} for i in range(40)]
    seen: Dict[str, str] = {}
    for res in q.map(iter(jobs), concurrency=5, timeout=10):
        seen[res.id] = res.status
    assert set(seen) == {f"m{i}" for i in range(40)}
    assert fake_worker.max_unfinished <= 5
    # Rejected jobs are yielded, not raised, so one bad job does not end a run of thousands.
    out = list(q.map(["reject", "fine"], concurrency=2))
    assert sorted(r.status for r in out) == ["invalid", "ok"]


def test_map_finds_results_missing_from_the_stream(redis_url: str, fake_worker: FakeWorker) -> None:
    # The results stream is capped: a slow reader can miss entries. The MGET sweep finds them.
    fake_worker.write_results_stream = False
    q = Queue(redis_url, fake_worker.queue, block_s=0.2)
    out = list(q.map([f"x{i}" for i in range(10)], concurrency=3, timeout=10))
    assert sorted(res.stdout for res in out) == sorted(f"x{i}\n" for i in range(10))


def test_several_waiters_on_one_id(redis_url: str, fake_worker: FakeWorker) -> None:
    q = Queue(redis_url, fake_worker.queue)
    job_id = q.submit("sleep:0.3")
    got: Dict[int, str] = {}

    def wait(i: int) -> None:
        got[i] = Queue(redis_url, fake_worker.queue).result(job_id, timeout=5).status

    ts = [threading.Thread(target=wait, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == {0: "ok", 1: "ok", 2: "ok"}
    # Waiting takes nothing: the done list keeps its element for BLPOP users.
    assert redis.Redis.from_url(redis_url).llen(f"forkbox:{{{fake_worker.queue}}}:done:{job_id}") == 1


def test_batch(redis_url: str, fake_worker: FakeWorker) -> None:
    q = Queue(redis_url, fake_worker.queue)
    b = q.batch(["exit:0"] * 5 + ["exit:2"] * 2 + ["sleep:0.2"], chunk=3)
    assert b.wait(timeout=10) == {"ok": 6, "failed": 2}
    assert b.counts()["total"] == 8 and b.done == 8
    assert [r.status for r in b.results()] == ["ok"] * 5 + ["failed"] * 2 + ["ok"]
    slow = q.batch(["sleep:1"])
    with pytest.raises(Timeout, match="0 of 1"):
        slow.wait(timeout=0.3)


def test_cancel(redis_url: str, fake_worker: FakeWorker) -> None:
    q = Queue(redis_url, fake_worker.queue)
    job_id = q.submit("sleep:10")
    time.sleep(0.2)
    q.cancel(job_id)
    assert q.result(job_id, timeout=5).status == "cancelled"
    r = redis.Redis.from_url(redis_url)
    assert r.zscore(f"forkbox:{{{fake_worker.queue}}}:cancelled", job_id) is not None
